package model

import (
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"
	networking "istio.io/api/networking/v1alpha3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestApply(t *testing.T) {
	s := NewStore()
	h := s.Handler(nil)
	svc := &bus.Resource{Name: "demo/a.demo.svc.cluster.local", Body: &discoveryv1.Service{Hostname: "a.demo.svc.cluster.local", Namespace: "demo"}}
	if err := h.Apply(bus.Change{TypeURL: schema.Service.TypeURL, Updated: []*bus.Resource{svc}}); err != nil {
		t.Fatal(err)
	}
	<-s.Changed()
	if _, ok := s.Snapshot().Services["a.demo.svc.cluster.local"]; !ok {
		t.Fatal("service missing from snapshot")
	}

	for _, tc := range []struct {
		name   string
		change bus.Change
	}{
		{"unknown type", bus.Change{TypeURL: "example.com/v1/Nope"}},
		{"wrong body", bus.Change{TypeURL: schema.Service.TypeURL, Updated: []*bus.Resource{
			{Name: "demo/b", Body: &discoveryv1.Endpoints{}}, svc}}},
		{"no body", bus.Change{TypeURL: schema.VirtualService.TypeURL, Updated: []*bus.Resource{{Name: "demo/x"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := h.Apply(tc.change); !errors.Is(err, ErrRejected) {
				t.Fatalf("Apply: %v, want ErrRejected", err)
			}
		})
	}

	// Legacy type URLs land on the same kind; removal deletes.
	vs := &bus.Resource{Name: "demo/vs", Body: &networking.VirtualService{Hosts: []string{"a"}}}
	if err := h.Apply(bus.Change{TypeURL: "networking.istio.io/v1alpha3/VirtualService", Updated: []*bus.Resource{vs}}); err != nil {
		t.Fatal(err)
	}
	if got := len(s.Snapshot().VirtualServices); got != 1 {
		t.Fatalf("%d virtual services, want 1", got)
	}
	if err := h.Apply(bus.Change{TypeURL: schema.Service.TypeURL, Removed: []string{svc.Name}}); err != nil {
		t.Fatal(err)
	}
	if got := len(s.Snapshot().Services); got != 0 {
		t.Fatalf("%d services after removal, want 0", got)
	}
}

func TestSnapshotPrecedence(t *testing.T) {
	s := NewStore()
	h := s.Handler(nil)
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	mustApply := applier(t, h)
	mustApply(bus.Change{TypeURL: schema.VirtualService.TypeURL, Updated: []*bus.Resource{
		{Name: "b/young", CreateTime: t0.Add(time.Hour), Body: &networking.VirtualService{}},
		{Name: "z/old", CreateTime: t0, Body: &networking.VirtualService{}},
		{Name: "a/young", CreateTime: t0.Add(time.Hour), Body: &networking.VirtualService{}},
	}})
	// One hostname from two registries: the first bus name wins, with its own endpoints.
	mustApply(bus.Change{TypeURL: schema.Service.TypeURL, Updated: []*bus.Resource{
		{Name: "b/x.com", Body: &discoveryv1.Service{Hostname: "x.com", Namespace: "b"}},
		{Name: "a/x.com", Body: &discoveryv1.Service{Hostname: "x.com", Namespace: "a"}},
	}})
	mustApply(bus.Change{TypeURL: schema.Endpoints.TypeURL, Updated: []*bus.Resource{
		{Name: "b/x.com", Body: &discoveryv1.Endpoints{Hostname: "x.com", Namespace: "b", Endpoints: []*discoveryv1.Endpoint{{Address: "2.2.2.2"}}}},
		{Name: "a/x.com", Body: &discoveryv1.Endpoints{Hostname: "x.com", Namespace: "a", Endpoints: []*discoveryv1.Endpoint{{Address: "1.1.1.1"}}}},
	}})
	snap := s.Snapshot()
	var got []string
	for _, vs := range snap.VirtualServices {
		got = append(got, vs.Namespace+"/"+vs.Name)
	}
	want := []string{"z/old", "a/young", "b/young"}
	if len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("order = %v, want %v", got, want)
	}
	svc := snap.Services["x.com"]
	if svc.Spec.GetNamespace() != "a" || len(svc.Endpoints) != 1 || svc.Endpoints[0].GetAddress() != "1.1.1.1" {
		t.Fatalf("x.com = %v %v", svc.Spec, svc.Endpoints)
	}
}

func TestResolveHost(t *testing.T) {
	for _, tc := range []struct{ host, ns, want string }{
		{"echo", "demo", "echo.demo.svc.cluster.local"},
		{"echo.other.svc.cluster.local", "demo", "echo.other.svc.cluster.local"},
		{"*", "demo", "*"},
		{"*.example.com", "demo", "*.example.com"},
	} {
		if got := ResolveHost(tc.host, tc.ns); got != tc.want {
			t.Errorf("ResolveHost(%q, %q) = %q, want %q", tc.host, tc.ns, got, tc.want)
		}
	}
	for _, tc := range []struct {
		config, host string
		want         bool
	}{
		{"a.b", "a.b", true},
		{"*.b", "a.b", true},
		{"*.b", "a.c", false},
		{"*", "a.c", true},
		{"a.b", "a.c", false},
	} {
		if got := HostMatches(tc.config, tc.host); got != tc.want {
			t.Errorf("HostMatches(%q, %q) = %v", tc.config, tc.host, got)
		}
	}
}

func TestSynced(t *testing.T) {
	calls := 0
	h := NewStore().Handler(func() { calls++ })
	h.Synced()
	h.Synced()
	if calls != 1 {
		t.Fatalf("onSynced called %d times, want 1", calls)
	}
}

// An endpoints-only change shares every other service and reports only its hostname; a config
// change is full and rebuilds.
func TestNextIncremental(t *testing.T) {
	s := NewStore()
	h := s.Handler(nil)
	mustApply := applier(t, h)
	svc := func(host string, exportTo ...string) *bus.Resource {
		return &bus.Resource{Name: "demo/" + host, Body: &discoveryv1.Service{Hostname: host, Namespace: "demo", ExportTo: exportTo}}
	}
	eps := func(host, addr string) *bus.Resource {
		return &bus.Resource{Name: "demo/" + host, Body: &discoveryv1.Endpoints{Hostname: host, Namespace: "demo",
			Endpoints: []*discoveryv1.Endpoint{{Address: addr}}}}
	}
	mustApply(bus.Change{TypeURL: schema.Service.TypeURL, Updated: []*bus.Resource{svc("a.com"), svc("b.com", ".")}})
	mustApply(bus.Change{TypeURL: schema.Endpoints.TypeURL, Updated: []*bus.Resource{eps("a.com", "1.1.1.1"), eps("b.com", "2.2.2.2")}})
	first, ch := s.Next()
	if !ch.Full || first.Version != 1 || first.ConfigVersion != 1 {
		t.Fatalf("first Next: full=%v version=%d/%d", ch.Full, first.Version, first.ConfigVersion)
	}
	if again, ch := s.Next(); again != first || !ch.Empty() {
		t.Fatal("Next without changes built a new snapshot")
	}

	mustApply(bus.Change{TypeURL: schema.Endpoints.TypeURL, Updated: []*bus.Resource{eps("a.com", "9.9.9.9")}})
	second, ch := s.Next()
	if ch.Full || len(ch.Endpoints) != 1 || len(ch.Configs) != 0 {
		t.Fatalf("endpoint change = %+v, want endpoints of a.com only", ch)
	}
	if _, ok := ch.Endpoints["a.com"]; !ok {
		t.Fatalf("endpoint change = %+v, want a.com", ch)
	}
	if second.ConfigVersion != first.ConfigVersion || second.Version != 2 {
		t.Fatalf("versions %d/%d", second.Version, second.ConfigVersion)
	}
	if second.Services["b.com"] != first.Services["b.com"] {
		t.Fatal("unchanged service not shared")
	}
	a := second.Services["a.com"]
	if a.Endpoints[0].GetAddress() != "9.9.9.9" || a.EndpointsVersion != 2 || first.Services["a.com"].Endpoints[0].GetAddress() != "1.1.1.1" {
		t.Fatalf("a.com = %v (version %d)", a.Endpoints, a.EndpointsVersion)
	}
	// The incremental snapshot equals a full rebuild.
	if full := s.Snapshot(); full.Services["a.com"].Endpoints[0] != a.Endpoints[0] || full.Services["a.com"].EndpointsVersion != 2 {
		t.Fatal("incremental snapshot differs from a full build")
	}

	mustApply(bus.Change{TypeURL: schema.Service.TypeURL, Updated: []*bus.Resource{svc("b.com", "other")}})
	third, ch := s.Next()
	if !ch.Full || third.ConfigVersion != 3 {
		t.Fatalf("service change: full=%v config version %d", ch.Full, third.ConfigVersion)
	}
	// b.com was visible to demo only ("."), now to "other": the change concerns both.
	v := ch.Configs[ConfigKey{Kind: "Service", Namespace: "demo", Name: "b.com"}]
	if v.All || !v.Sees("demo") || !v.Sees("other") || v.Sees("third") {
		t.Fatalf("visibility = %+v", v)
	}
}

func TestVisibility(t *testing.T) {
	for _, tc := range []struct {
		exportTo []string
		sees     []string
		hidden   []string
	}{
		{nil, []string{"a", "x"}, nil},
		{[]string{"*"}, []string{"a", "x"}, nil},
		{[]string{"."}, []string{"a"}, []string{"x"}},
		{[]string{"~"}, nil, []string{"a", "x"}},
		{[]string{"x", "."}, []string{"a", "x"}, []string{"y"}},
	} {
		v := ExportVisibility("a", tc.exportTo)
		for _, ns := range tc.sees {
			if !v.Sees(ns) {
				t.Errorf("exportTo %v: %s should see it", tc.exportTo, ns)
			}
		}
		for _, ns := range tc.hidden {
			if v.Sees(ns) {
				t.Errorf("exportTo %v: %s should not see it", tc.exportTo, ns)
			}
		}
	}
}

// Sidecars have a listener per endpoint of a headless service with a non-HTTP port, so a change
// of its endpoints is a change of the service, as in istiod; a headless HTTP-only service's
// endpoints stay an endpoints-only change.
func TestNextHeadlessEndpoints(t *testing.T) {
	s := NewStore()
	h := s.Handler(nil)
	mustApply := applier(t, h)
	headless := func(host, proto string) *bus.Resource {
		return &bus.Resource{Name: "demo/" + host, Body: &discoveryv1.Service{Hostname: host, Namespace: "demo",
			Resolution: discoveryv1.Resolution_NONE, Ports: []*discoveryv1.Port{{Name: "p", Number: 80, Protocol: proto}}}}
	}
	eps := func(host, addr string) *bus.Resource {
		return &bus.Resource{Name: "demo/" + host, Body: &discoveryv1.Endpoints{Hostname: host, Namespace: "demo",
			Endpoints: []*discoveryv1.Endpoint{{Address: addr}}}}
	}
	mustApply(bus.Change{TypeURL: schema.Service.TypeURL, Updated: []*bus.Resource{
		headless("db.com", "TCP"), headless("sniffed.com", ""), headless("web.com", "HTTP")}})
	first, _ := s.Next()

	for _, tc := range []struct {
		host string
		full bool
	}{{"db.com", true}, {"sniffed.com", true}, {"web.com", false}} {
		mustApply(bus.Change{TypeURL: schema.Endpoints.TypeURL, Updated: []*bus.Resource{eps(tc.host, "10.0.0.1")}})
		snap, ch := s.Next()
		_, keyed := ch.Configs[ConfigKey{Kind: "Service", Namespace: "demo", Name: tc.host}]
		if ch.Full != tc.full || keyed != tc.full || (snap.ConfigVersion != first.ConfigVersion) != tc.full {
			t.Errorf("%s endpoints: full=%v keyed=%v config version %d; want full=%v", tc.host, ch.Full, keyed,
				snap.ConfigVersion, tc.full)
		}
		if _, ok := ch.Endpoints[tc.host]; !ok {
			t.Errorf("%s endpoints: change %+v lacks its endpoints", tc.host, ch)
		}
		first = snap
	}
	mustApply(bus.Change{TypeURL: schema.Endpoints.TypeURL, Removed: []string{"demo/db.com"}})
	if _, ch := s.Next(); !ch.Full {
		t.Errorf("removing db.com endpoints: not a full change")
	}
}

// applier returns a function applying a change to h that fails the test on error.
func applier(t *testing.T, h bus.Handler) func(bus.Change) {
	return func(c bus.Change) {
		t.Helper()
		if err := h.Apply(c); err != nil {
			t.Fatal(err)
		}
	}
}

// Fetched JWKS reach the next snapshot as a full change naming the URI; setting the same keys
// again changes nothing.
func TestSetJWKS(t *testing.T) {
	s := NewStore()
	s.Next()
	s.SetJWKS("https://idp/keys", "k1")
	snap, ch := s.Next()
	if snap.JWKS["https://idp/keys"] != "k1" || !ch.Full {
		t.Fatalf("snapshot JWKS %v, change %+v", snap.JWKS, ch)
	}
	if _, ok := ch.Configs[ConfigKey{Kind: JWKSKind, Name: "https://idp/keys"}]; !ok {
		t.Fatalf("change %v does not name the URI", ch.Configs)
	}
	s.SetJWKS("https://idp/keys", "k1")
	if _, ch := s.Next(); !ch.Empty() {
		t.Fatalf("same keys again: change %+v", ch)
	}
	s.SetJWKS("https://idp/keys", "")
	if snap, _ := s.Next(); len(snap.JWKS) != 0 {
		t.Fatalf("forgotten keys still in %v", snap.JWKS)
	}
}

// An endpoints-only change that changes what clusters read of endpoints (the identities they
// present, or whether all are labelled in the mesh) becomes a config change naming the
// service, so cached clusters are rebuilt; other endpoint changes stay endpoints-only.
func TestNextEndpointTLS(t *testing.T) {
	inMesh := map[string]string{TLSModeLabel: "istio"}
	for _, tc := range []struct {
		name       string
		before     []*discoveryv1.Endpoint
		after      []*discoveryv1.Endpoint
		wantConfig bool
	}{
		{name: "address moves", before: []*discoveryv1.Endpoint{{Address: "1.1.1.1", ServiceAccount: "a"}},
			after: []*discoveryv1.Endpoint{{Address: "2.2.2.2", ServiceAccount: "a"}}},
		{name: "replica with the same identity", before: []*discoveryv1.Endpoint{{Address: "1.1.1.1", ServiceAccount: "a", Labels: inMesh}},
			after: []*discoveryv1.Endpoint{{Address: "1.1.1.1", ServiceAccount: "a", Labels: inMesh}, {Address: "2.2.2.2", ServiceAccount: "a", Labels: inMesh}}},
		{name: "first endpoint without identity", after: []*discoveryv1.Endpoint{{Address: "1.1.1.1"}}},
		{name: "new identity", before: []*discoveryv1.Endpoint{{Address: "1.1.1.1", ServiceAccount: "a"}},
			after: []*discoveryv1.Endpoint{{Address: "1.1.1.1", ServiceAccount: "a"}, {Address: "2.2.2.2", ServiceAccount: "b"}}, wantConfig: true},
		{name: "joins the mesh", before: []*discoveryv1.Endpoint{{Address: "1.1.1.1"}},
			after: []*discoveryv1.Endpoint{{Address: "1.1.1.1", Labels: inMesh}}, wantConfig: true},
		{name: "one replica outside the mesh", before: []*discoveryv1.Endpoint{{Address: "1.1.1.1", Labels: inMesh}},
			after: []*discoveryv1.Endpoint{{Address: "1.1.1.1", Labels: inMesh}, {Address: "2.2.2.2"}}, wantConfig: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewStore()
			mustApply := applier(t, s.Handler(nil))
			eps := func(list []*discoveryv1.Endpoint) bus.Change {
				return bus.Change{TypeURL: schema.Endpoints.TypeURL, Updated: []*bus.Resource{{Name: "demo/a.com",
					Body: &discoveryv1.Endpoints{Hostname: "a.com", Namespace: "demo", Endpoints: list}}}}
			}
			mustApply(bus.Change{TypeURL: schema.Service.TypeURL, Updated: []*bus.Resource{{Name: "demo/a.com",
				Body: &discoveryv1.Service{Hostname: "a.com", Namespace: "demo"}}}})
			mustApply(eps(tc.before))
			first, _ := s.Next()
			mustApply(eps(tc.after))
			next, ch := s.Next()
			_, named := ch.Configs[ConfigKey{Kind: EndpointTLSKind, Namespace: "demo", Name: "a.com"}]
			if ch.Full != tc.wantConfig || named != tc.wantConfig || (next.ConfigVersion != first.ConfigVersion) != tc.wantConfig {
				t.Fatalf("full=%v named=%v config versions %d→%d, want a config change: %v",
					ch.Full, named, first.ConfigVersion, next.ConfigVersion, tc.wantConfig)
			}
			if _, ok := ch.Endpoints["a.com"]; !ok {
				t.Fatal("the endpoints change is lost")
			}
		})
	}
}
