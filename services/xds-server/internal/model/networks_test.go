package model

import (
	"fmt"
	"slices"
	"testing"

	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
)

// TestNetworkGateways: gateways of every Service, deduplicated, IP addresses only; an endpoint
// of a cluster with gateways of its own uses those, else its network's; weights scale by the
// least common multiple of the gateway counts.
func TestNetworkGateways(t *testing.T) {
	gw := func(network, cluster, addr string) *discoveryv1.NetworkGateway {
		return &discoveryv1.NetworkGateway{Network: network, ClusterId: cluster, Address: addr, Port: 15443}
	}
	snap := &Snapshot{Services: map[string]*Service{
		"a": {Spec: &discoveryv1.Service{Hostname: "a", NetworkGateways: []*discoveryv1.NetworkGateway{
			gw("net2", "c2", "198.18.2.2"), gw("net2", "c2", "198.18.2.1"), gw("net3", "c3", "gw.example.com"),
		}}},
		"b": {Spec: &discoveryv1.Service{Hostname: "b", NetworkGateways: []*discoveryv1.NetworkGateway{
			gw("net2", "c2", "198.18.2.1"), gw("net2", "c4", "198.18.4.1"), gw("net2", "c4", "198.18.4.2"), gw("net2", "c4", "198.18.4.3"),
		}}},
		"none": {Spec: &discoveryv1.Service{Hostname: "none"}},
	}}
	g := snap.NetworkGateways()
	addrs := func(gws []*discoveryv1.NetworkGateway) []string {
		var out []string
		for _, gw := range gws {
			out = append(out, gw.GetAddress())
		}
		return out
	}
	for _, tc := range []struct {
		network, cluster string
		want             []string
	}{
		{"net2", "c2", []string{"198.18.2.1", "198.18.2.2"}},
		{"net2", "c4", []string{"198.18.4.1", "198.18.4.2", "198.18.4.3"}},
		{"net2", "other", []string{"198.18.2.1", "198.18.2.2", "198.18.4.1", "198.18.4.2", "198.18.4.3"}},
		{"net3", "c3", nil}, // a DNS name only: no gateway
		{"net1", "c1", nil},
	} {
		if got := addrs(g.ForEndpoint(tc.network, tc.cluster)); !slices.Equal(got, tc.want) {
			t.Errorf("ForEndpoint(%s, %s) = %v, want %v", tc.network, tc.cluster, got, tc.want)
		}
	}
	// Per network: 5; per network and cluster: 2 and 3.
	if s := g.Scale(); s != 30 {
		t.Errorf("Scale() = %d, want 30", s)
	}
	if g := (&Snapshot{Services: map[string]*Service{"none": {Spec: &discoveryv1.Service{Hostname: "none"}}}}).NetworkGateways(); g != nil || g.Scale() != 1 {
		t.Errorf("without gateways: %v, scale %d; want nil, 1", g, g.Scale())
	}
}

// TestMeshNetworks: meshNetworks' gateways by address join a Service's (with no cluster); an
// endpoint without a network takes the network naming its cluster in fromRegistry, else the
// widest fromCidr holding its address.
func TestMeshNetworks(t *testing.T) {
	snap := &Snapshot{
		MeshNetworks: &meshv1alpha1.MeshNetworks{Networks: map[string]*meshv1alpha1.Network{
			"net2": {
				Endpoints: []*meshv1alpha1.Network_NetworkEndpoints{{Ne: &meshv1alpha1.Network_NetworkEndpoints_FromRegistry{FromRegistry: "c2"}}},
				Gateways: []*meshv1alpha1.Network_IstioNetworkGateway{
					{Gw: &meshv1alpha1.Network_IstioNetworkGateway_Address{Address: "198.18.2.1"}, Port: 15443},
					{Gw: &meshv1alpha1.Network_IstioNetworkGateway_RegistryServiceName{RegistryServiceName: "gw.istio-system.svc.cluster.local"}, Port: 15443},
				},
			},
			"net3": {Endpoints: []*meshv1alpha1.Network_NetworkEndpoints{
				{Ne: &meshv1alpha1.Network_NetworkEndpoints_FromCidr{FromCidr: "10.3.0.0/16"}},
				{Ne: &meshv1alpha1.Network_NetworkEndpoints_FromCidr{FromCidr: "fd00:3::/32"}},
			}},
			"net4": {Endpoints: []*meshv1alpha1.Network_NetworkEndpoints{
				{Ne: &meshv1alpha1.Network_NetworkEndpoints_FromCidr{FromCidr: "10.3.5.1/24"}}, // masked to 10.3.5.0/24
				{Ne: &meshv1alpha1.Network_NetworkEndpoints_FromCidr{FromCidr: "10.4.0.0/16"}},
				{Ne: &meshv1alpha1.Network_NetworkEndpoints_FromCidr{FromCidr: "not-a-cidr"}},
			}},
		}},
		Services: map[string]*Service{
			// Its outside addresses as endpoint-watcher lists them (no network, no port): in c2
			// (net2's fromRegistry) it is net2's gateway; in c9 it is none.
			"gw.istio-system.svc.cluster.local": {Spec: &discoveryv1.Service{Hostname: "gw.istio-system.svc.cluster.local",
				NetworkGateways: []*discoveryv1.NetworkGateway{{ClusterId: "c2", Address: "198.18.2.50"}, {ClusterId: "c9", Address: "198.18.9.50"}}}},
			// Without meshNetworks naming it, a Service's outside addresses are no gateway.
			"lb.shop.svc.cluster.local": {Spec: &discoveryv1.Service{Hostname: "lb.shop.svc.cluster.local",
				NetworkGateways: []*discoveryv1.NetworkGateway{{ClusterId: "c2", Address: "198.18.2.60"}}}},
		},
	}
	g := snap.NetworkGateways()
	var got []string
	for _, gw := range g.ForEndpoint("net2", "c2") {
		got = append(got, fmt.Sprintf("%s:%d/%s", gw.GetAddress(), gw.GetPort(), gw.GetClusterId()))
	}
	if want := []string{"198.18.2.50:15443/c2"}; !slices.Equal(got, want) {
		t.Errorf("ForEndpoint(net2, c2) = %v, want %v (the registryServiceName gateway of c2)", got, want)
	}
	got = nil
	for _, gw := range g.ForEndpoint("net2", "c7") {
		got = append(got, fmt.Sprintf("%s:%d/%s", gw.GetAddress(), gw.GetPort(), gw.GetClusterId()))
	}
	if want := []string{"198.18.2.1:15443/", "198.18.2.50:15443/c2"}; !slices.Equal(got, want) {
		t.Errorf("ForEndpoint(net2, c7) = %v, want %v (every net2 gateway)", got, want)
	}
	for _, tc := range []struct {
		ep   *discoveryv1.Endpoint
		want string
	}{
		{&discoveryv1.Endpoint{Address: "10.3.1.1", Network: "net1", ClusterId: "c2"}, "net1"},
		{&discoveryv1.Endpoint{Address: "10.3.1.1", ClusterId: "c2"}, "net2"},
		{&discoveryv1.Endpoint{Address: "10.3.1.1", ClusterId: "c9"}, "net3"},
		{&discoveryv1.Endpoint{Address: "10.3.5.1", ClusterId: "c9"}, "net3"},
		{&discoveryv1.Endpoint{Address: "10.4.0.7", ClusterId: "c9"}, "net4"},
		{&discoveryv1.Endpoint{Address: "::ffff:10.4.0.7", ClusterId: "c9"}, "net4"},
		{&discoveryv1.Endpoint{Address: "fd00:3::9", ClusterId: "c9"}, "net3"},
		{&discoveryv1.Endpoint{Address: "10.9.0.1", ClusterId: "c9"}, ""},
		{&discoveryv1.Endpoint{Address: "db.example.com", ClusterId: "c9"}, ""},
	} {
		if got := g.EndpointNetwork(tc.ep); got != tc.want {
			t.Errorf("EndpointNetwork(%s in %s, network %q) = %q, want %q", tc.ep.GetAddress(), tc.ep.GetClusterId(), tc.ep.GetNetwork(), got, tc.want)
		}
	}
	if got := (*NetworkGateways)(nil).EndpointNetwork(&discoveryv1.Endpoint{Network: "net1"}); got != "net1" {
		t.Errorf("nil EndpointNetwork = %q, want the endpoint's own", got)
	}
}
