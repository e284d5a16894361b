package model

import (
	"slices"
	"testing"

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
