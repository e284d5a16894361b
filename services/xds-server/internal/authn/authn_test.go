package authn

import (
	"maps"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	security "istio.io/api/security/v1beta1"
	typev1beta1 "istio.io/api/type/v1beta1"

	"sailplane.dev/services/xds-server/internal/authz"
	"sailplane.dev/services/xds-server/internal/model"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)

// pa builds a PeerAuthentication created minute minutes after t0, with mode and port modes
// named as in the API ("-" leaves mtls out).
func pa(ns, name string, minute int, selector map[string]string, mode string, ports map[uint32]string) model.Config[*security.PeerAuthentication] {
	spec := &security.PeerAuthentication{}
	if selector != nil {
		spec.Selector = &typev1beta1.WorkloadSelector{MatchLabels: selector}
	}
	if mode != "-" {
		spec.Mtls = &security.PeerAuthentication_MutualTLS{Mode: security.PeerAuthentication_MutualTLS_Mode(security.PeerAuthentication_MutualTLS_Mode_value[mode])}
	}
	if ports != nil {
		spec.PortLevelMtls = map[uint32]*security.PeerAuthentication_MutualTLS{}
		for p, m := range ports {
			spec.PortLevelMtls[p] = &security.PeerAuthentication_MutualTLS{Mode: security.PeerAuthentication_MutualTLS_Mode(security.PeerAuthentication_MutualTLS_Mode_value[m])}
		}
	}
	return model.Config[*security.PeerAuthentication]{Namespace: ns, Name: name, CreateTime: t0.Add(time.Duration(minute) * time.Minute), Spec: spec}
}

func TestForWorkload(t *testing.T) {
	app := map[string]string{"app": "a"}
	cases := []struct {
		name     string
		root     string // MeshConfig root namespace, default istio-system
		policies []model.Config[*security.PeerAuthentication]
		ns       string
		labels   map[string]string
		want     Policy
	}{
		{name: "none is permissive", ns: "demo", want: Policy{Mode: Permissive}},
		{name: "mesh strict", ns: "demo", policies: []model.Config[*security.PeerAuthentication]{
			pa("istio-system", "default", 0, nil, "STRICT", nil),
		}, want: Policy{Mode: Strict}},
		{name: "mesh unset is permissive", ns: "demo", policies: []model.Config[*security.PeerAuthentication]{
			pa("istio-system", "default", 0, nil, "-", nil),
		}, want: Policy{Mode: Permissive}},
		{name: "custom root namespace", root: "mesh-root", ns: "demo", policies: []model.Config[*security.PeerAuthentication]{
			pa("istio-system", "default", 0, nil, "STRICT", nil),
			pa("mesh-root", "default", 1, nil, "DISABLE", nil),
		}, want: Policy{Mode: Disable}},
		{name: "namespace overrides mesh", ns: "demo", policies: []model.Config[*security.PeerAuthentication]{
			pa("istio-system", "default", 0, nil, "STRICT", nil),
			pa("demo", "ns", 1, nil, "DISABLE", nil),
		}, want: Policy{Mode: Disable}},
		{name: "namespace unset inherits mesh", ns: "demo", policies: []model.Config[*security.PeerAuthentication]{
			pa("istio-system", "default", 0, nil, "STRICT", nil),
			pa("demo", "ns", 1, nil, "UNSET", nil),
		}, want: Policy{Mode: Strict}},
		{name: "other namespace ignored", ns: "demo", policies: []model.Config[*security.PeerAuthentication]{
			pa("other", "ns", 0, nil, "STRICT", nil),
			pa("other", "w", 0, app, "STRICT", nil),
		}, labels: app, want: Policy{Mode: Permissive}},
		{name: "workload overrides namespace", ns: "demo", labels: app, policies: []model.Config[*security.PeerAuthentication]{
			pa("demo", "ns", 0, nil, "STRICT", nil),
			pa("demo", "w", 1, app, "PERMISSIVE", nil),
		}, want: Policy{Mode: Permissive}},
		{name: "workload selector not matching", ns: "demo", labels: map[string]string{"app": "b"}, policies: []model.Config[*security.PeerAuthentication]{
			pa("demo", "ns", 0, nil, "STRICT", nil),
			pa("demo", "w", 1, app, "DISABLE", nil),
		}, want: Policy{Mode: Strict}},
		{name: "workload unset inherits namespace", ns: "demo", labels: app, policies: []model.Config[*security.PeerAuthentication]{
			pa("demo", "ns", 0, nil, "DISABLE", nil),
			pa("demo", "w", 1, app, "-", nil),
		}, want: Policy{Mode: Disable}},
		{name: "selector in root namespace selects nothing", ns: "demo", labels: app, policies: []model.Config[*security.PeerAuthentication]{
			pa("istio-system", "w", 0, app, "STRICT", nil),
		}, want: Policy{Mode: Permissive}},
		{name: "oldest namespace policy wins", ns: "demo", policies: []model.Config[*security.PeerAuthentication]{
			pa("demo", "older", 0, nil, "STRICT", nil),
			pa("demo", "newer", 5, nil, "DISABLE", nil),
		}, want: Policy{Mode: Strict}},
		{name: "oldest mesh policy wins even if unset", ns: "demo", policies: []model.Config[*security.PeerAuthentication]{
			pa("istio-system", "older", 0, nil, "UNSET", nil),
			pa("istio-system", "newer", 5, nil, "STRICT", nil),
		}, want: Policy{Mode: Permissive}},
		{name: "oldest workload policy wins", ns: "demo", labels: map[string]string{"app": "a", "v": "1"}, policies: []model.Config[*security.PeerAuthentication]{
			pa("demo", "by-version", 0, map[string]string{"v": "1"}, "DISABLE", nil),
			pa("demo", "by-app", 5, app, "STRICT", map[uint32]string{8080: "PERMISSIVE"}),
		}, want: Policy{Mode: Disable}},
		{name: "same age, first by name wins", ns: "demo", policies: []model.Config[*security.PeerAuthentication]{
			pa("demo", "a", 0, nil, "DISABLE", nil),
			pa("demo", "b", 0, nil, "STRICT", nil),
		}, want: Policy{Mode: Disable}},
		{name: "port level", ns: "demo", labels: app, policies: []model.Config[*security.PeerAuthentication]{
			pa("istio-system", "default", 0, nil, "STRICT", nil),
			pa("demo", "w", 1, app, "-", map[uint32]string{8080: "DISABLE", 9090: "UNSET", 7070: "PERMISSIVE"}),
		}, want: Policy{Mode: Strict, PerPort: map[uint32]Mode{8080: Disable, 9090: Strict, 7070: Permissive}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			snap := &model.Snapshot{Mesh: &meshv1alpha1.MeshConfig{RootNamespace: tc.root}, PeerAuthentications: tc.policies}
			got := ForWorkload(snap, tc.ns, tc.labels)
			if got.Mode != tc.want.Mode || !maps.Equal(got.PerPort, tc.want.PerPort) {
				t.Fatalf("got %v %v, want %v %v", got.Mode, got.PerPort, tc.want.Mode, tc.want.PerPort)
			}
		})
	}
}

func TestModeFor(t *testing.T) {
	p := Policy{Mode: Strict, PerPort: map[uint32]Mode{8080: Disable}}
	for port, want := range map[uint32]Mode{8080: Disable, 9090: Strict} {
		if got := p.ModeFor(port); got != want {
			t.Errorf("ModeFor(%d) = %v, want %v", port, got, want)
		}
	}
	if got := (Policy{}).ModeFor(1); got != Permissive {
		t.Errorf("zero Policy: %v, want PERMISSIVE", got)
	}
}

func TestNamespaceModeIgnoresWorkloadPolicies(t *testing.T) {
	snap := &model.Snapshot{Mesh: &meshv1alpha1.MeshConfig{}, PeerAuthentications: []model.Config[*security.PeerAuthentication]{
		pa("istio-system", "default", 0, nil, "STRICT", nil),
		pa("demo", "w", 1, map[string]string{"app": "a"}, "DISABLE", nil),
	}}
	if got := NamespaceMode(snap, "demo"); got != Strict {
		t.Fatalf("NamespaceMode = %v, want STRICT", got)
	}
}

// Cache keys hold a workload's labels only through authz.SelectorLabelKeys: it must name the
// keys PeerAuthentication selectors use.
func TestSelectorLabelKeysCoverPeerAuthentication(t *testing.T) {
	snap := &model.Snapshot{PeerAuthentications: []model.Config[*security.PeerAuthentication]{
		pa("demo", "w", 0, map[string]string{"app": "a", "v": "1"}, "STRICT", nil),
	}}
	if got := authz.SelectorLabelKeys(snap); !slices.Equal(got, []string{"app", "v"}) {
		t.Fatalf("got %v", got)
	}
}
