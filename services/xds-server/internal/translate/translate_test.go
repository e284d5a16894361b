package translate

import (
	"slices"
	"testing"

	"go.uber.org/goleak"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/xds-server/internal/model"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestLoadAssignment(t *testing.T) {
	svc := &model.Service{Endpoints: []*discoveryv1.Endpoint{
		{Address: "10.0.0.2", Health: discoveryv1.Health_HEALTHY, Labels: map[string]string{"v": "1"},
			Ports: map[string]uint32{"http": 9090}, Locality: &discoveryv1.Locality{Region: "b"}},
		{Address: "10.0.0.1", Health: discoveryv1.Health_HEALTHY, Labels: map[string]string{"v": "1"}, Weight: 3,
			Locality: &discoveryv1.Locality{Region: "a"}},
		{Address: "10.0.0.3", Health: discoveryv1.Health_UNHEALTHY, Labels: map[string]string{"v": "1"}},
		{Address: "10.0.0.4", Health: discoveryv1.Health_HEALTHY, Labels: map[string]string{"v": "2"}},
	}}
	port := &discoveryv1.Port{Name: "http", Number: 80, TargetPort: 8080}
	cla := LoadAssignment("c", svc, port, &networking.Subset{Labels: map[string]string{"v": "1"}}, nil)
	if got := len(cla.GetEndpoints()); got != 2 {
		t.Fatalf("localities = %d, want 2 (unhealthy and other-subset endpoints dropped)", got)
	}
	tests := []struct {
		region string
		port   uint32
		weight uint32
	}{{"a", 8080, 3}, {"b", 9090, 1}}
	for i, tc := range tests {
		l := cla.GetEndpoints()[i]
		sa := l.GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
		if l.GetLocality().GetRegion() != tc.region || sa.GetPortValue() != tc.port ||
			l.GetLoadBalancingWeight().GetValue() != tc.weight {
			t.Errorf("locality %d = %v port %d weight %d, want %+v", i, l.GetLocality(), sa.GetPortValue(),
				l.GetLoadBalancingWeight().GetValue(), tc)
		}
	}
}

func TestRouteMatchClients(t *testing.T) {
	exact := &networking.StringMatch{MatchType: &networking.StringMatch_Exact{Exact: "x"}}
	tests := []struct {
		name          string
		m             *networking.HTTPMatchRequest
		envoy, grpcOK bool
	}{
		{"nil", nil, true, true},
		{"headers", &networking.HTTPMatchRequest{Headers: map[string]*networking.StringMatch{"h": exact}}, true, true},
		{"query", &networking.HTTPMatchRequest{QueryParams: map[string]*networking.StringMatch{"q": exact}}, true, false},
		{"method", &networking.HTTPMatchRequest{Method: exact}, true, false},
		{"source (applied by the caller)", &networking.HTTPMatchRequest{SourceNamespace: "ns"}, true, true},
		{"empty regex", &networking.HTTPMatchRequest{Uri: &networking.StringMatch{
			MatchType: &networking.StringMatch_Regex{}}}, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if rm, reason := RouteMatch(tc.m, Envoy); (rm != nil) != tc.envoy {
				t.Errorf("Envoy: match %v (reason %q), want ok=%v", rm, reason, tc.envoy)
			}
			if rm, reason := RouteMatch(tc.m, Proxyless); (rm != nil) != tc.grpcOK {
				t.Errorf("Proxyless: match %v (reason %q), want ok=%v", rm, reason, tc.grpcOK)
			}
		})
	}
}

func TestTrafficPolicy(t *testing.T) {
	roundRobin := &networking.LoadBalancerSettings{LbPolicy: &networking.LoadBalancerSettings_Simple{
		Simple: networking.LoadBalancerSettings_ROUND_ROBIN}}
	random := &networking.LoadBalancerSettings{LbPolicy: &networking.LoadBalancerSettings_Simple{
		Simple: networking.LoadBalancerSettings_RANDOM}}
	outlier := &networking.OutlierDetection{MinHealthPercent: 10}
	pool := &networking.ConnectionPoolSettings{Http: &networking.ConnectionPoolSettings_HTTPSettings{Http2MaxRequests: 7}}
	istioMutual := &networking.ClientTLSSettings{Mode: networking.ClientTLSSettings_ISTIO_MUTUAL}
	port := func(n uint32, lb *networking.LoadBalancerSettings) *networking.TrafficPolicy_PortTrafficPolicy {
		return &networking.TrafficPolicy_PortTrafficPolicy{Port: &networking.PortSelector{Number: n}, LoadBalancer: lb}
	}
	dr := &networking.DestinationRule{
		TrafficPolicy: &networking.TrafficPolicy{LoadBalancer: roundRobin, OutlierDetection: outlier, Tls: istioMutual,
			PortLevelSettings: []*networking.TrafficPolicy_PortTrafficPolicy{port(9090, random)}},
		Subsets: []*networking.Subset{
			{Name: "pool", TrafficPolicy: &networking.TrafficPolicy{ConnectionPool: pool}},
			{Name: "port", TrafficPolicy: &networking.TrafficPolicy{ConnectionPool: pool,
				PortLevelSettings: []*networking.TrafficPolicy_PortTrafficPolicy{port(80, random)}}},
		},
	}
	tests := []struct {
		name   string
		port   uint32
		subset string
		want   Policy
	}{
		{"rule", 80, "", Policy{LB: roundRobin, Outlier: outlier, TLS: istioMutual}},
		// The port entry replaces the whole policy: outlier detection and TLS are not inherited.
		{"rule port level replaces", 9090, "", Policy{LB: random}},
		{"unknown subset", 80, "nope", Policy{LB: roundRobin, Outlier: outlier, TLS: istioMutual}},
		{"subset overrides field by field", 80, "pool", Policy{LB: roundRobin, Pool: pool, Outlier: outlier, TLS: istioMutual}},
		{"subset over rule port level", 9090, "pool", Policy{LB: random, Pool: pool}},
		{"subset port level replaces", 80, "port", Policy{LB: random}},
		{"subset port level for another port", 9090, "port", Policy{LB: random, Pool: pool}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := TrafficPolicy(dr, tc.port, tc.subset)
			if got != tc.want {
				t.Errorf("TrafficPolicy(%d, %q) = %+v, want %+v", tc.port, tc.subset, got, tc.want)
			}
		})
	}
}

func TestLocalityMatches(t *testing.T) {
	l := &discoveryv1.Locality{Region: "us", Zone: "us-1", SubZone: "rack"}
	tests := []struct {
		rule string
		want bool
	}{
		{"us", true}, {"us/us-1", true}, {"us/us-1/rack", true}, {"us/*", true}, {"*", true},
		{"us/*/rack", true}, {"eu", false}, {"us/us-2", false}, {"us/us-1/other", false}, {"*/us-2", false},
	}
	for _, tc := range tests {
		if got := localityMatches(l, tc.rule); got != tc.want {
			t.Errorf("localityMatches(%v, %q) = %v, want %v", l, tc.rule, got, tc.want)
		}
	}
}

func TestServiceIdentities(t *testing.T) {
	svc := &model.Service{Spec: &discoveryv1.Service{Namespace: "shop", SubjectAltNames: []string{"api.example.com"}}, Endpoints: []*discoveryv1.Endpoint{
		{ServiceAccount: "b"}, {ServiceAccount: "a"}, {ServiceAccount: "a"}, {},
		{ServiceAccount: "spiffe://other.example/ns/x/sa/y"},
	}}
	got := ServiceIdentities(svc, &meshv1alpha1.MeshConfig{TrustDomain: "td", TrustDomainAliases: []string{"old"}})
	want := []string{"api.example.com", "spiffe://old/ns/shop/sa/a", "spiffe://old/ns/shop/sa/b", "spiffe://other.example/ns/x/sa/y",
		"spiffe://td/ns/shop/sa/a", "spiffe://td/ns/shop/sa/b"}
	if !slices.Equal(got, want) {
		t.Errorf("ServiceIdentities = %v, want %v", got, want)
	}
	if got := ServiceIdentities(svc, nil); got[1] != "spiffe://cluster.local/ns/shop/sa/a" {
		t.Errorf("without a mesh trust domain: %v, want cluster.local", got)
	}
}
