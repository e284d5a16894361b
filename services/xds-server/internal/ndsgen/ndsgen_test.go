package ndsgen

import (
	"encoding/json"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

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
			g := New(model.NewAllocator())
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
			g := New(model.NewAllocator())
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
