package ndsgen

import (
	"encoding/json"
	"net/netip"
	"path/filepath"
	"strconv"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/services/xds-server/internal/testinput"
	"sailplane.dev/shared/golden"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func snapshotOf(t *testing.T, docs []byte) *model.Snapshot {
	t.Helper()
	items, err := testinput.Parse(docs)
	if err != nil {
		t.Fatal(err)
	}
	store := model.NewStore()
	h := store.Handler(nil)
	for _, c := range testinput.Changes(items) {
		if err := h.Apply(c); err != nil {
			t.Fatalf("apply %s: %v", c.TypeURL, err)
		}
	}
	return store.Snapshot()
}

// TestGolden renders each case's proxies' name tables (testdata/<case>/golden.yaml).
func TestGolden(t *testing.T) {
	for _, dir := range golden.Cases(t, "testdata") {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			proxies, rest, err := testinput.ReadCase(dir)
			if err != nil {
				t.Fatal(err)
			}
			snap := snapshotOf(t, rest)
			g := New()
			doc := map[string]json.RawMessage{}
			for _, p := range proxies {
				b, err := protojson.Marshal(g.Table(snap, p.Proxy))
				if err != nil {
					t.Fatal(err)
				}
				doc[p.Name] = b
			}
			j, err := json.Marshal(doc)
			if err != nil {
				t.Fatal(err)
			}
			y, err := yaml.JSONToYAML(j)
			if err != nil {
				t.Fatal(err)
			}
			golden.Compare(t, filepath.Join(dir, "golden.yaml"), y)
		})
	}
}

// TestCacheScope: proxies that get different tables never share a scope.
func TestCacheScope(t *testing.T) {
	for _, dir := range golden.Cases(t, "testdata") {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			proxies, rest, err := testinput.ReadCase(dir)
			if err != nil {
				t.Fatal(err)
			}
			snap := snapshotOf(t, rest)
			g := New()
			byScope := map[string]string{}
			for _, p := range proxies {
				b, _ := protojson.MarshalOptions{}.Marshal(g.Table(snap, p.Proxy))
				tbl := string(b)
				scope := g.CacheScope(snap, p.Proxy)
				if prev, ok := byScope[scope]; ok && prev != tbl {
					t.Errorf("%s: scope %q shared with a proxy whose table differs", p.Name, scope)
				}
				byScope[scope] = tbl
			}
		})
	}
}

func seService(host string) *model.Service {
	return &model.Service{Spec: &discoveryv1.Service{Hostname: host, Namespace: "ns", Registry: "serviceentry",
		Resolution: discoveryv1.Resolution_DNS}}
}

func snapWith(hosts ...string) *model.Snapshot {
	s := &model.Snapshot{Services: map[string]*model.Service{}}
	for _, h := range hosts {
		s.Services[h] = seService(h)
	}
	return s
}

// TestAllocatorStable: a host keeps its addresses while others come and go, addresses are in
// Istio's ranges and unique, and a fresh allocator (another replica) gives the same ones
// when hashes do not collide.
func TestAllocatorStable(t *testing.T) {
	a := NewAllocator()
	first := a.Assign(snapWith("a.example.com", "b.example.com"))
	second := a.Assign(snapWith("b.example.com", "c.example.com", "d.example.com"))
	if first["ns/b.example.com"] != second["ns/b.example.com"] {
		t.Errorf("b moved: %v then %v", first["ns/b.example.com"], second["ns/b.example.com"])
	}
	if _, ok := second["ns/a.example.com"]; ok {
		t.Error("a kept addresses after it went away")
	}
	seen := map[netip.Addr]string{}
	for k, ad := range second {
		if !v4Prefix.Contains(ad.V4) || !v6Prefix.Contains(ad.V6) {
			t.Errorf("%s: %v outside %v / %v", k, ad, v4Prefix, v6Prefix)
		}
		if o, dup := seen[ad.V4]; dup {
			t.Errorf("%s and %s share %v", k, o, ad.V4)
		}
		seen[ad.V4] = k
	}
	other := NewAllocator().Assign(snapWith("d.example.com"))
	if other["ns/d.example.com"] != second["ns/d.example.com"] {
		t.Errorf("another allocator gives d %v, this one %v", other["ns/d.example.com"], second["ns/d.example.com"])
	}
}

// TestAllocatorCollisions: hosts whose hashes share a slot each get their own, and the one
// that had it keeps it.
func TestAllocatorCollisions(t *testing.T) {
	// Find two keys with the same home slot.
	byHome := map[uint32]string{}
	var x, y string
	for i := 0; x == ""; i++ {
		h := "h" + strconv.Itoa(i) + ".example.com"
		s := home("ns/" + h)
		if o, ok := byHome[s]; ok {
			x, y = o, h
		}
		byHome[s] = h
	}
	a := NewAllocator()
	before := a.Assign(snapWith(y))["ns/"+y]
	both := a.Assign(snapWith(x, y))
	if both["ns/"+y] != before {
		t.Errorf("%s moved from %v to %v when %s came", y, before, both["ns/"+y], x)
	}
	if both["ns/"+x] == both["ns/"+y] {
		t.Errorf("%s and %s share %v", x, y, both["ns/"+x])
	}
}
