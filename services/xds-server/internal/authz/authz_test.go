package authz

import (
	"maps"
	"slices"
	"strings"
	"testing"

	rbacpb "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	jwtv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	rbachttp "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	rbactcp "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	security "istio.io/api/security/v1beta1"
	typev1beta1 "istio.io/api/type/v1beta1"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/xds-server/internal/model"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func policy(ns, name string, spec *security.AuthorizationPolicy) model.Config[*security.AuthorizationPolicy] {
	return model.Config[*security.AuthorizationPolicy]{Namespace: ns, Name: name, Spec: spec}
}

func snapshot(ps ...model.Config[*security.AuthorizationPolicy]) *model.Snapshot {
	return &model.Snapshot{Mesh: &meshv1alpha1.MeshConfig{}, Services: map[string]*model.Service{}, AuthorizationPolicies: ps}
}

func unpack[T proto.Message](t *testing.T, a *anypb.Any, m T) T {
	t.Helper()
	if err := a.UnmarshalTo(m); err != nil {
		t.Fatal(err)
	}
	return m
}

// tcpRules lists, per network RBAC filter, its action and policy names.
func tcpRules(t *testing.T, b *Builder) []string {
	var out []string
	for _, f := range b.TCP() {
		r := unpack(t, f.GetTypedConfig(), &rbactcp.RBAC{})
		out = append(out, r.GetRules().GetAction().String()+":"+strings.Join(slices.Sorted(maps.Keys(r.GetRules().GetPolicies())), ","))
	}
	return out
}

func TestSelect(t *testing.T) {
	deny := func() *security.AuthorizationPolicy {
		return &security.AuthorizationPolicy{Action: security.AuthorizationPolicy_DENY, Rules: []*security.Rule{{}}}
	}
	withSelector := deny()
	withSelector.Selector = &typev1beta1.WorkloadSelector{MatchLabels: map[string]string{"app": "a"}}
	otherSelector := deny()
	otherSelector.Selector = &typev1beta1.WorkloadSelector{MatchLabels: map[string]string{"app": "b"}}
	targeted := deny()
	targeted.TargetRefs = []*typev1beta1.PolicyTargetReference{{Kind: "Gateway", Name: "gw"}}
	snap := snapshot(
		policy("istio-system", "mesh-wide", deny()),
		policy("ns", "namespace", deny()),
		policy("ns", "selected", withSelector),
		policy("ns", "not-selected", otherSelector),
		policy("ns", "targeted", targeted),
		policy("other", "elsewhere", deny()),
	)
	var got []string
	for _, p := range Select(snap, "ns", map[string]string{"app": "a", "v": "1"}).Deny {
		got = append(got, p.Name)
	}
	if want := "mesh-wide,namespace,selected"; strings.Join(got, ",") != want {
		t.Fatalf("selected %v, want %s", got, want)
	}
	snap.Mesh.RootNamespace = "mesh-root"
	if n := len(Select(snap, "ns", nil).Deny); n != 1 {
		t.Fatalf("with rootNamespace mesh-root, %d policies apply, want only namespace's", n)
	}
}

// HTTP-only conditions cannot be checked on TCP: an ALLOW rule using them is dropped (an
// ALLOW policy left without rules denies everything), a DENY rule loses them (denies more).
func TestTCPDropsHTTPOnlyConditions(t *testing.T) {
	paths := &security.Rule{To: []*security.Rule_To{{Operation: &security.Operation{Paths: []string{"/admin"}, Ports: []string{"80"}}}}}
	for _, tc := range []struct {
		name   string
		action security.AuthorizationPolicy_Action
		want   string
		check  func(t *testing.T, p *rbacpb.Policy)
	}{
		{name: "allow", action: security.AuthorizationPolicy_ALLOW, want: "ALLOW:"},
		{name: "deny", action: security.AuthorizationPolicy_DENY, want: "DENY:ns[ns]-policy[p]-rule[0]", check: func(t *testing.T, p *rbacpb.Policy) {
			rules := p.GetPermissions()[0].GetAndRules().GetRules()
			if len(rules) != 1 || rules[0].GetOrRules().GetRules()[0].GetDestinationPort() != 80 {
				t.Fatalf("want only the port left, got %v", rules)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBuilder(snapshot(policy("ns", "p", &security.AuthorizationPolicy{Action: tc.action, Rules: []*security.Rule{paths}})), "ns", nil)
			got := tcpRules(t, b)
			if len(got) != 1 || got[0] != tc.want {
				t.Fatalf("TCP filters %v, want [%s]", got, tc.want)
			}
			if tc.check != nil {
				r := unpack(t, b.TCP()[0].GetTypedConfig(), &rbactcp.RBAC{})
				tc.check(t, r.GetRules().GetPolicies()["ns[ns]-policy[p]-rule[0]"])
			}
			// On HTTP the path is kept.
			_, local := b.HTTP()
			r := unpack(t, local[0].GetTypedConfig(), &rbachttp.RBAC{})
			if p := r.GetRules().GetPolicies()["ns[ns]-policy[p]-rule[0]"]; len(p.GetPermissions()[0].GetAndRules().GetRules()) != 2 {
				t.Fatalf("HTTP policy %v, want path and port", p)
			}
		})
	}
}

func TestOrderAndEmptyPolicies(t *testing.T) {
	b := NewBuilder(snapshot(
		policy("ns", "allow-nothing", &security.AuthorizationPolicy{}),
		policy("ns", "deny", &security.AuthorizationPolicy{Action: security.AuthorizationPolicy_DENY, Rules: []*security.Rule{{}}}),
		policy("ns", "audit", &security.AuthorizationPolicy{Action: security.AuthorizationPolicy_AUDIT, Rules: []*security.Rule{{}}}),
		// An unknown attribute drops the rule.
		policy("ns", "bad", &security.AuthorizationPolicy{Rules: []*security.Rule{{When: []*security.Condition{{Key: "no.such", Values: []string{"x"}}}}}}),
	), "ns", nil)
	got := tcpRules(t, b)
	want := []string{"LOG:ns[ns]-policy[audit]-rule[0]", "DENY:ns[ns]-policy[deny]-rule[0]", "ALLOW:ns[ns]-policy[allow-nothing]-rule[0]"}
	if !slices.Equal(got, want) {
		t.Fatalf("TCP filters %v, want %v", got, want)
	}
	r := unpack(t, b.TCP()[2].GetTypedConfig(), &rbactcp.RBAC{})
	if !proto.Equal(r.GetRules().GetPolicies()["ns[ns]-policy[allow-nothing]-rule[0]"], matchNever()) {
		t.Fatal("a policy without rules must never match")
	}
}

func TestCustomProviders(t *testing.T) {
	custom := func(provider string) *security.AuthorizationPolicy {
		return &security.AuthorizationPolicy{Action: security.AuthorizationPolicy_CUSTOM, Rules: []*security.Rule{{}},
			ActionDetail: &security.AuthorizationPolicy_Provider{Provider: &security.AuthorizationPolicy_ExtensionProvider{Name: provider}}}
	}
	grpcProvider := &meshv1alpha1.MeshConfig_ExtensionProvider{Name: "ext", Provider: &meshv1alpha1.MeshConfig_ExtensionProvider_EnvoyExtAuthzGrpc{
		EnvoyExtAuthzGrpc: &meshv1alpha1.MeshConfig_ExtensionProvider_EnvoyExternalAuthorizationGrpcProvider{Service: "authz.ns.svc.cluster.local", Port: 9000}}}
	for _, tc := range []struct {
		name      string
		providers []string
		wantHTTP  []string
		wantTCP   []string
	}{
		{name: "gRPC provider", providers: []string{"ext"},
			wantHTTP: []string{HTTPRBACFilter, httpExtAuthz}, wantTCP: []string{NetworkRBACFilter, networkExtAuthz}},
		{name: "unknown provider denies", providers: []string{"missing"},
			wantHTTP: []string{HTTPRBACFilter}, wantTCP: []string{NetworkRBACFilter}},
		{name: "two providers deny", providers: []string{"ext", "missing"},
			wantHTTP: []string{HTTPRBACFilter, HTTPRBACFilter}, wantTCP: []string{NetworkRBACFilter, NetworkRBACFilter}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ps []model.Config[*security.AuthorizationPolicy]
			for i, p := range tc.providers {
				ps = append(ps, policy("ns", "c"+string(rune('0'+i)), custom(p)))
			}
			snap := snapshot(ps...)
			snap.Mesh.ExtensionProviders = []*meshv1alpha1.MeshConfig_ExtensionProvider{grpcProvider}
			snap.Services["authz.ns.svc.cluster.local"] = &model.Service{Spec: &discoveryv1.Service{Hostname: "authz.ns.svc.cluster.local", Namespace: "ns"}}
			b := NewBuilder(snap, "ns", nil)
			custom, _ := b.HTTP()
			var names []string
			for _, f := range custom {
				names = append(names, f.GetName())
			}
			if !slices.Equal(names, tc.wantHTTP) {
				t.Fatalf("HTTP filters %v, want %v", names, tc.wantHTTP)
			}
			names = nil
			for _, f := range b.TCP() {
				names = append(names, f.GetName())
			}
			if !slices.Equal(names, tc.wantTCP) {
				t.Fatalf("TCP filters %v, want %v", names, tc.wantTCP)
			}
			if len(tc.wantHTTP) == 1 || tc.wantHTTP[1] == HTTPRBACFilter {
				r := unpack(t, custom[0].GetTypedConfig(), &rbachttp.RBAC{})
				if r.GetRules().GetAction() != rbacpb.RBAC_DENY {
					t.Fatalf("a broken CUSTOM setup must deny, got %v", r)
				}
				for name := range r.GetRules().GetPolicies() {
					if !strings.HasSuffix(name, badCustomActionSuffix) {
						t.Fatalf("policy %q lacks %q", name, badCustomActionSuffix)
					}
				}
			}
		})
	}
}

func TestGRPCFilters(t *testing.T) {
	b := NewBuilder(snapshot(
		policy("ns", "allow-nothing", &security.AuthorizationPolicy{}),
		policy("ns", "deny", &security.AuthorizationPolicy{Action: security.AuthorizationPolicy_DENY, Rules: []*security.Rule{{}}}),
		policy("ns", "audit", &security.AuthorizationPolicy{Action: security.AuthorizationPolicy_AUDIT, Rules: []*security.Rule{{}}}),
	), "ns", nil)
	fs := b.GRPC()
	if len(fs) != 2 || fs[0].GetName() != GRPCDenyFilter || fs[1].GetName() != HTTPRBACFilter {
		t.Fatalf("gRPC filters %v, want DENY then ALLOW", fs)
	}
	deny := unpack(t, fs[0].GetTypedConfig(), &rbachttp.RBAC{})
	if _, ok := deny.GetRules().GetPolicies()["ns-deny-0"]; !ok {
		t.Fatalf("DENY policies %v, want ns-deny-0", deny.GetRules().GetPolicies())
	}
	// An ALLOW policy without rules leaves an ALLOW filter with no policy: everything denied.
	allow := unpack(t, fs[1].GetTypedConfig(), &rbachttp.RBAC{})
	if len(allow.GetRules().GetPolicies()) != 0 || allow.GetRules().GetAction() != rbacpb.RBAC_ALLOW {
		t.Fatalf("ALLOW filter %v, want no policies", allow)
	}
}

func TestNestedClaims(t *testing.T) {
	for in, want := range map[string]string{"[a]": "a", "[a][b]": "a,b", "[a.b]": "a.b", "[a][b][c]": "a,b,c"} {
		got, err := nestedClaims(in)
		if err != nil || strings.Join(got, ",") != want {
			t.Errorf("nestedClaims(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	for _, in := range []string{"a", "[a", ""} {
		if _, err := nestedClaims(in); err == nil {
			t.Errorf("nestedClaims(%q): want an error", in)
		}
	}
}

func TestJWKSCluster(t *testing.T) {
	for in, want := range map[string]string{
		"https://idp.example.com/keys":      "outbound|443||idp.example.com",
		"http://idp.example.com:8080/jwks":  "outbound|8080||idp.example.com",
		"http://keys.ns.svc.cluster.local/": "outbound|80||keys.ns.svc.cluster.local",
	} {
		if got := jwksCluster(in); got != want {
			t.Errorf("jwksCluster(%q) = %q, want %q", in, got, want)
		}
	}
}

// A jwksUri's keys are inlined once fetched (istiod's default); before, Envoy fetches them.
func TestJWTKeysFromURI(t *testing.T) {
	const uri = "https://idp.example.com/keys"
	snap := snapshot()
	snap.RequestAuthentications = []model.Config[*security.RequestAuthentication]{{Namespace: "ns", Name: "jwt",
		Spec: &security.RequestAuthentication{JwtRules: []*security.JWTRule{{Issuer: "idp", JwksUri: uri}}}}}
	if got := JWKSURIs(snap); len(got) != 1 || got[0] != uri {
		t.Fatalf("JWKSURIs = %v", got)
	}
	provider := func() *jwtv3.JwtProvider {
		fs := NewBuilder(snap, "ns", nil).JWT(false)
		if len(fs) != 1 {
			t.Fatalf("%d JWT filters, want 1", len(fs))
		}
		return unpack(t, fs[0].GetTypedConfig(), &jwtv3.JwtAuthentication{}).GetProviders()["origins-0"]
	}
	if p := provider(); p.GetRemoteJwks().GetHttpUri().GetCluster() != "outbound|443||idp.example.com" {
		t.Fatalf("before fetching: %v, want remote_jwks", p)
	}
	snap.JWKS = map[string]string{uri: `{"keys":[]}`}
	if p := provider(); p.GetLocalJwks().GetInlineString() != `{"keys":[]}` {
		t.Fatalf("after fetching: %v, want the keys inline", p)
	}
}
