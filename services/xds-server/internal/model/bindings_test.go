package model

import (
	"maps"
	"slices"
	"testing"
	"time"

	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	typev1beta1 "istio.io/api/type/v1beta1"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
)

const cartHost = "cart.backend.svc.cluster.local"

func testDR(ns, name, host string, age int, exportTo ...string) Config[*networking.DestinationRule] {
	return Config[*networking.DestinationRule]{Namespace: ns, Name: name, CreateTime: time.Unix(int64(age), 0),
		Spec: &networking.DestinationRule{Host: host, ExportTo: exportTo}}
}

func testVS(ns, name string, age int, hosts []string, exportTo ...string) Config[*networking.VirtualService] {
	return Config[*networking.VirtualService]{Namespace: ns, Name: name, CreateTime: time.Unix(int64(age), 0),
		Spec: &networking.VirtualService{Hosts: hosts, ExportTo: exportTo}}
}

func cartSnapshot(mesh *meshv1alpha1.MeshConfig) *Snapshot {
	if mesh == nil {
		mesh = &meshv1alpha1.MeshConfig{}
	}
	return &Snapshot{Mesh: mesh, Services: map[string]*Service{
		cartHost: {Spec: &discoveryv1.Service{Hostname: cartHost, Namespace: "backend"}},
	}}
}

// TestDestinationRuleLookupPath: istiod's path is the client's namespace, then the
// service's, then the root namespace; a rule elsewhere applies to nobody else.
func TestDestinationRuleLookupPath(t *testing.T) {
	private := &meshv1alpha1.MeshConfig{DefaultDestinationRuleExportTo: []string{"."}}
	tests := []struct {
		name  string
		mesh  *meshv1alpha1.MeshConfig
		rules []Config[*networking.DestinationRule]
		ns    string // the client's
		want  string // "" for none
	}{
		{"a third namespace's rule applies only there", nil,
			[]Config[*networking.DestinationRule]{testDR("other", "x", cartHost, 1)}, "frontend", ""},
		{"... and to its own clients", nil,
			[]Config[*networking.DestinationRule]{testDR("other", "x", cartHost, 1)}, "other", "x"},
		{"the service's namespace", nil,
			[]Config[*networking.DestinationRule]{testDR("other", "x", cartHost, 1), testDR("backend", "svc", "cart", 2)},
			"frontend", "svc"},
		{"the root namespace when the service's has none", nil,
			[]Config[*networking.DestinationRule]{testDR("istio-system", "root", "*.svc.cluster.local", 1)}, "frontend", "root"},
		{"the service's namespace before the root's", nil,
			[]Config[*networking.DestinationRule]{testDR("istio-system", "root", cartHost, 1), testDR("backend", "svc", "cart", 2)},
			"frontend", "svc"},
		{"the client's namespace first, even a wildcard over an exact host", nil,
			[]Config[*networking.DestinationRule]{testDR("backend", "svc", "cart", 1), testDR("frontend", "mine", "*", 2, ".")},
			"frontend", "mine"},
		{"a rule kept to its namespace is skipped", nil,
			[]Config[*networking.DestinationRule]{testDR("istio-system", "root", cartHost, 1), testDR("backend", "svc", "cart", 2, ".")},
			"frontend", "root"},
		{"exported by name", nil,
			[]Config[*networking.DestinationRule]{testDR("backend", "svc", "cart", 1, "frontend")}, "frontend", "svc"},
		{"exported by name to another namespace", nil,
			[]Config[*networking.DestinationRule]{testDR("backend", "svc", "cart", 1, "payments")}, "frontend", ""},
		{"mesh default keeps rules without exportTo private", private,
			[]Config[*networking.DestinationRule]{testDR("backend", "svc", "cart", 1)}, "frontend", ""},
		{"mesh default: an explicit * still exports", private,
			[]Config[*networking.DestinationRule]{testDR("backend", "svc", "cart", 1, "*")}, "frontend", "svc"},
		{"mesh default: the service's namespace sees its own", private,
			[]Config[*networking.DestinationRule]{testDR("backend", "svc", "cart", 1)}, "backend", "svc"},
		{"mesh default: a private root rule applies in the root namespace", private,
			[]Config[*networking.DestinationRule]{testDR("istio-system", "root", cartHost, 1)}, "istio-system", "root"},
		{"mesh default: a private root rule applies nowhere else", private,
			[]Config[*networking.DestinationRule]{testDR("istio-system", "root", cartHost, 1)}, "frontend", ""},
		{"root namespace named by the mesh", &meshv1alpha1.MeshConfig{RootNamespace: "mesh-root"},
			[]Config[*networking.DestinationRule]{testDR("istio-system", "old-root", cartHost, 1), testDR("mesh-root", "root", cartHost, 2)},
			"frontend", "root"},
		{"most specific wildcard in a namespace", nil,
			[]Config[*networking.DestinationRule]{testDR("backend", "wide", "*.svc.cluster.local", 1),
				testDR("backend", "narrow", "*.backend.svc.cluster.local", 2)}, "frontend", "narrow"},
		{"exact before wildcard in a namespace", nil,
			[]Config[*networking.DestinationRule]{testDR("backend", "exact", "cart", 2), testDR("backend", "wild", "*", 1)},
			"frontend", "exact"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			snap := cartSnapshot(tc.mesh)
			snap.DestinationRules = tc.rules
			got := ""
			if dr := snap.Bindings(&Viewer{Namespace: tc.ns}).DestinationRule(cartHost); dr != nil {
				got = dr.Name
			}
			if got != tc.want {
				t.Errorf("client in %s: DestinationRule = %q, want %q", tc.ns, got, tc.want)
			}
		})
	}
}

// TestDestinationRuleMerge: several rules of one namespace for one host merge as in istiod:
// subsets of new names join, the oldest top-level traffic policy stays; rules of different
// exportTo stay apart, the last of them applying; a workloadSelector rule applies to the
// workloads it selects in its namespace.
func TestDestinationRuleMerge(t *testing.T) {
	lb := func(s networking.LoadBalancerSettings_SimpleLB) *networking.TrafficPolicy {
		return &networking.TrafficPolicy{LoadBalancer: &networking.LoadBalancerSettings{
			LbPolicy: &networking.LoadBalancerSettings_Simple{Simple: s}}}
	}
	withSubsets := func(c Config[*networking.DestinationRule], pol *networking.TrafficPolicy, subsets ...string) Config[*networking.DestinationRule] {
		c.Spec.TrafficPolicy = pol
		for _, s := range subsets {
			c.Spec.Subsets = append(c.Spec.Subsets, &networking.Subset{Name: s})
		}
		return c
	}
	selecting := func(c Config[*networking.DestinationRule], labels map[string]string) Config[*networking.DestinationRule] {
		c.Spec.WorkloadSelector = &typev1beta1.WorkloadSelector{MatchLabels: labels}
		return c
	}
	tests := []struct {
		name        string
		rules       []Config[*networking.DestinationRule]
		viewer      Viewer
		wantName    string
		wantSubsets []string
		wantLB      networking.LoadBalancerSettings_SimpleLB
	}{
		{"merged: subsets joined, the oldest policy kept",
			[]Config[*networking.DestinationRule]{
				withSubsets(testDR("backend", "b", "cart", 2), lb(networking.LoadBalancerSettings_RANDOM), "v2", "v1"),
				withSubsets(testDR("backend", "a", "cart", 1), nil, "v1"),
			}, Viewer{Namespace: "frontend"}, "a", []string{"v1", "v2"}, networking.LoadBalancerSettings_RANDOM},
		{"different exportTo stay apart: the last applies",
			[]Config[*networking.DestinationRule]{
				withSubsets(testDR("backend", "a", "cart", 1), lb(networking.LoadBalancerSettings_RANDOM), "v1"),
				withSubsets(testDR("backend", "b", "cart", 2, "."), lb(networking.LoadBalancerSettings_LEAST_REQUEST), "v2"),
			}, Viewer{Namespace: "backend"}, "b", []string{"v2"}, networking.LoadBalancerSettings_LEAST_REQUEST},
		{"... and another namespace sees only the exported one",
			[]Config[*networking.DestinationRule]{
				withSubsets(testDR("backend", "a", "cart", 1), lb(networking.LoadBalancerSettings_RANDOM), "v1"),
				withSubsets(testDR("backend", "b", "cart", 2, "."), lb(networking.LoadBalancerSettings_LEAST_REQUEST), "v2"),
			}, Viewer{Namespace: "frontend"}, "a", []string{"v1"}, networking.LoadBalancerSettings_RANDOM},
		{"a selected workload gets the selecting rule",
			[]Config[*networking.DestinationRule]{
				withSubsets(testDR("frontend", "all", cartHost, 1), lb(networking.LoadBalancerSettings_RANDOM)),
				selecting(withSubsets(testDR("frontend", "web", cartHost, 2), lb(networking.LoadBalancerSettings_LEAST_REQUEST)),
					map[string]string{"app": "web"}),
			}, Viewer{Namespace: "frontend", Labels: map[string]string{"app": "web"}}, "web", nil, networking.LoadBalancerSettings_LEAST_REQUEST},
		{"another workload gets the catch-all",
			[]Config[*networking.DestinationRule]{
				withSubsets(testDR("frontend", "all", cartHost, 1), lb(networking.LoadBalancerSettings_RANDOM)),
				selecting(withSubsets(testDR("frontend", "web", cartHost, 2), lb(networking.LoadBalancerSettings_LEAST_REQUEST)),
					map[string]string{"app": "web"}),
			}, Viewer{Namespace: "frontend", Labels: map[string]string{"app": "api"}}, "all", nil, networking.LoadBalancerSettings_RANDOM},
		{"a selecting rule is never exported",
			[]Config[*networking.DestinationRule]{
				selecting(withSubsets(testDR("backend", "web", "cart", 1), lb(networking.LoadBalancerSettings_LEAST_REQUEST)),
					map[string]string{"app": "web"}),
			}, Viewer{Namespace: "frontend", Labels: map[string]string{"app": "web"}}, "", nil, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			snap := cartSnapshot(nil)
			snap.DestinationRules = tc.rules
			dr := snap.Bindings(&tc.viewer).DestinationRule(cartHost)
			if tc.wantName == "" {
				if dr != nil {
					t.Fatalf("DestinationRule = %s, want none", dr.Name)
				}
				return
			}
			if dr == nil {
				t.Fatalf("no DestinationRule, want %s", tc.wantName)
			}
			var subsets []string
			for _, ss := range dr.Spec.GetSubsets() {
				subsets = append(subsets, ss.GetName())
			}
			if dr.Name != tc.wantName || !slices.Equal(subsets, tc.wantSubsets) ||
				dr.Spec.GetTrafficPolicy().GetLoadBalancer().GetSimple() != tc.wantLB {
				t.Errorf("DestinationRule %s subsets %v lb %v, want %s %v %v", dr.Name, subsets,
					dr.Spec.GetTrafficPolicy().GetLoadBalancer().GetSimple(), tc.wantName, tc.wantSubsets, tc.wantLB)
			}
		})
	}
	// On the inbound side a workloadSelector never picks the rule (istiod honours it outbound only).
	snap := cartSnapshot(nil)
	snap.DestinationRules = tests[3].rules
	if dr := snap.Bindings(&tests[3].viewer).InboundDestinationRule(cartHost); dr == nil || dr.Name != "all" {
		t.Errorf("inbound DestinationRule = %v, want all", dr)
	}
	// Merging never changes the snapshot's rules.
	a := withSubsets(testDR("backend", "a", "cart", 1), nil, "v1")
	snap = cartSnapshot(nil)
	snap.DestinationRules = []Config[*networking.DestinationRule]{a, withSubsets(testDR("backend", "b", "cart", 2), nil, "v2")}
	snap.Bindings(&Viewer{Namespace: "frontend"}).DestinationRule(cartHost)
	if len(a.Spec.GetSubsets()) != 1 {
		t.Errorf("merge changed the rule's subsets: %v", a.Spec.GetSubsets())
	}
}

func TestVirtualServiceVisibility(t *testing.T) {
	tests := []struct {
		name string
		mesh *meshv1alpha1.MeshConfig
		vss  []Config[*networking.VirtualService]
		ns   string
		want string
	}{
		{"kept to its namespace", nil,
			[]Config[*networking.VirtualService]{testVS("backend", "x", 1, []string{"cart"}, ".")}, "frontend", ""},
		{"exported by name", nil,
			[]Config[*networking.VirtualService]{testVS("backend", "x", 1, []string{"cart"}, "frontend")}, "frontend", "x"},
		{"own namespace's private before an older public one", nil,
			[]Config[*networking.VirtualService]{testVS("other", "pub", 1, []string{cartHost}),
				testVS("frontend", "mine", 2, []string{cartHost}, ".")}, "frontend", "mine"},
		{"exported by name before an older public one", nil,
			[]Config[*networking.VirtualService]{testVS("other", "pub", 1, []string{cartHost}),
				testVS("payments", "named", 2, []string{cartHost}, "frontend")}, "frontend", "named"},
		{"mesh default keeps them private", &meshv1alpha1.MeshConfig{DefaultVirtualServiceExportTo: []string{"."}},
			[]Config[*networking.VirtualService]{testVS("backend", "x", 1, []string{"cart"})}, "frontend", ""},
		{"mesh default: an explicit * exports", &meshv1alpha1.MeshConfig{DefaultVirtualServiceExportTo: []string{"."}},
			[]Config[*networking.VirtualService]{testVS("backend", "x", 1, []string{"cart"}, "*")}, "frontend", "x"},
		{"mesh default: its namespace sees it", &meshv1alpha1.MeshConfig{DefaultVirtualServiceExportTo: []string{"."}},
			[]Config[*networking.VirtualService]{testVS("backend", "x", 1, []string{"cart"})}, "backend", "x"},
		{"most specific wildcard over an older wider one", nil,
			[]Config[*networking.VirtualService]{testVS("a", "wide", 1, []string{"*.svc.cluster.local"}),
				testVS("a", "narrow", 2, []string{"*.backend.svc.cluster.local"})}, "frontend", "narrow"},
		{"exact over wildcard", nil,
			[]Config[*networking.VirtualService]{testVS("frontend", "wild", 1, []string{"*"}, "."),
				testVS("a", "exact", 2, []string{cartHost})}, "frontend", "exact"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			snap := cartSnapshot(tc.mesh)
			snap.VirtualServices = tc.vss
			got := ""
			if vs := snap.Bindings(&Viewer{Namespace: tc.ns}).VirtualService(cartHost); vs != nil {
				got = vs.Name
			}
			if got != tc.want {
				t.Errorf("client in %s: VirtualService = %q, want %q", tc.ns, got, tc.want)
			}
		})
	}
}

// TestVirtualServiceSidecarImport: a Sidecar's egress hosts import VirtualServices by the
// VirtualService's namespace, as istiod's SelectVirtualServices.
func TestVirtualServiceSidecarImport(t *testing.T) {
	snap := cartSnapshot(nil)
	snap.VirtualServices = []Config[*networking.VirtualService]{testVS("a", "x", 1, []string{cartHost})}
	for _, tc := range []struct {
		hosts []string
		want  string
	}{
		{[]string{"backend/*"}, ""},
		{[]string{"backend/*", "a/*"}, "x"},
		{[]string{"*/*", "~a/" + cartHost}, ""},
	} {
		sc := &Config[*networking.Sidecar]{Namespace: "frontend", Name: "sc", Spec: &networking.Sidecar{
			Egress: []*networking.IstioEgressListener{{Hosts: tc.hosts}}}}
		got := ""
		if vs := snap.Bindings(&Viewer{Namespace: "frontend", Sidecar: sc}).VirtualService(cartHost); vs != nil {
			got = vs.Name
		}
		if got != tc.want {
			t.Errorf("egress %v: VirtualService = %q, want %q", tc.hosts, got, tc.want)
		}
	}
}

func TestServiceVisible(t *testing.T) {
	private := &meshv1alpha1.MeshConfig{DefaultServiceExportTo: []string{"."}}
	tests := []struct {
		name     string
		mesh     *meshv1alpha1.MeshConfig
		exportTo []string
		ns       string
		want     bool
	}{
		{"no exportTo", nil, nil, "frontend", true},
		{"kept to its namespace", nil, []string{"backend"}, "frontend", false},
		{"its own namespace", nil, []string{"backend"}, "backend", true},
		{"none", nil, []string{"~"}, "backend", false},
		{"mesh default", private, nil, "frontend", false},
		{"mesh default, own namespace", private, nil, "backend", true},
		{"mesh default, explicit *", private, []string{"*"}, "frontend", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			snap := cartSnapshot(tc.mesh)
			svc := snap.Services[cartHost]
			svc.Spec.ExportTo = tc.exportTo
			if got := snap.ServiceVisible(svc, tc.ns); got != tc.want {
				t.Errorf("ServiceVisible = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSourceMatches(t *testing.T) {
	v := &Viewer{Namespace: "frontend", Labels: map[string]string{"app": "web", "version": "v1"}}
	tests := []struct {
		name string
		m    *networking.HTTPMatchRequest
		want bool
	}{
		{"no match", nil, true},
		{"labels held", &networking.HTTPMatchRequest{SourceLabels: map[string]string{"app": "web"}}, true},
		{"labels not held", &networking.HTTPMatchRequest{SourceLabels: map[string]string{"app": "api"}}, false},
		{"namespace", &networking.HTTPMatchRequest{SourceNamespace: "frontend"}, true},
		{"other namespace", &networking.HTTPMatchRequest{SourceNamespace: "backend"}, false},
		{"gateways only", &networking.HTTPMatchRequest{Gateways: []string{"ns/gw"}}, false},
		// istiod ignores source conditions on a match naming gateways.
		{"mesh gateway ignores labels", &networking.HTTPMatchRequest{Gateways: []string{"mesh"},
			SourceLabels: map[string]string{"app": "api"}}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := SourceMatches(tc.m, v); got != tc.want {
				t.Errorf("SourceMatches = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestForNamespace: a hostname several namespaces publish (ServiceEntries) resolves per
// namespace as istiod's SidecarScope does: the namespace's own when visible, else the first
// visible, Kubernetes first; endpoints follow each, also through endpoints-only snapshots.
func TestForNamespace(t *testing.T) {
	s := NewStore()
	apply := applier(t, s.Handler(nil))
	svc := func(ns, registry string, exportTo ...string) *bus.Resource {
		return &bus.Resource{Name: ns + "/api.example.com", Body: &discoveryv1.Service{Hostname: "api.example.com",
			Namespace: ns, Registry: registry, ExportTo: exportTo}}
	}
	eps := func(ns, addr string) *bus.Resource {
		return &bus.Resource{Name: ns + "/api.example.com", Body: &discoveryv1.Endpoints{Hostname: "api.example.com",
			Namespace: ns, Endpoints: []*discoveryv1.Endpoint{{Address: addr}}}}
	}
	apply(bus.Change{TypeURL: schema.Service.TypeURL, Updated: []*bus.Resource{
		svc("a", "serviceentry", "a"), svc("b", "serviceentry", "b"), svc("c", "serviceentry"), svc("d", "kubernetes", "*"),
	}})
	apply(bus.Change{TypeURL: schema.Endpoints.TypeURL, Updated: []*bus.Resource{
		eps("a", "198.18.0.1"), eps("b", "198.18.0.2"), eps("c", "198.18.0.3"), eps("d", "198.18.0.4"),
	}})
	check := func(snap *Snapshot, ns string, gateway bool, wantNS, wantAddr string) {
		t.Helper()
		got := snap.ForNamespace(ns, gateway).Services["api.example.com"]
		if got.Spec.GetNamespace() != wantNS || len(got.Endpoints) != 1 || got.Endpoints[0].GetAddress() != wantAddr {
			t.Errorf("namespace %s (gateway %v): %s %v, want %s %s", ns, gateway, got.Spec.GetNamespace(), got.Endpoints, wantNS, wantAddr)
		}
	}
	snap, _ := s.Next()
	check(snap, "a", false, "a", "198.18.0.1")
	check(snap, "b", false, "b", "198.18.0.2")
	check(snap, "c", false, "c", "198.18.0.3")
	check(snap, "z", false, "d", "198.18.0.4") // a and b are kept to themselves; Kubernetes first
	check(snap, "b", true, "d", "198.18.0.4")  // a gateway does not prefer its namespace

	apply(bus.Change{TypeURL: schema.Endpoints.TypeURL, Updated: []*bus.Resource{eps("b", "198.18.0.20")}})
	snap, ch := s.Next()
	if ch.Full {
		t.Fatal("an endpoints-only change built a full snapshot")
	}
	check(snap, "b", false, "b", "198.18.0.20")
	check(snap, "a", false, "a", "198.18.0.1")
	// b's endpoint joins the mesh: clusters that verify it (auto mTLS) are rebuilt for b.
	inMesh := eps("b", "198.18.0.20")
	inMesh.Body.(*discoveryv1.Endpoints).Endpoints[0].Labels = map[string]string{TLSModeLabel: "istio"}
	apply(bus.Change{TypeURL: schema.Endpoints.TypeURL, Updated: []*bus.Resource{inMesh}})
	if _, ch := s.Next(); !ch.Full || !slices.ContainsFunc(slices.Collect(maps.Keys(ch.Configs)), func(k ConfigKey) bool {
		return k.Kind == EndpointTLSKind && k.Namespace == "b"
	}) {
		t.Errorf("the hidden service's endpoint joining the mesh: change %+v, want an EndpointTLS change of b", ch.Configs)
	}
	if s := (&Snapshot{Services: snap.Services}); s.ForNamespace("b", false) != s {
		t.Error("ForNamespace copied a snapshot without shadowed services")
	}
}
