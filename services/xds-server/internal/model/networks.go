package model

import (
	"cmp"
	"net/netip"
	"slices"
	"sync"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
)

// NetworkGateways indexes the mesh's east-west gateways (the network_gateways of every
// Service) for split-horizon EDS, as istiod's NetworkManager does: by network, and by network
// and cluster. Only gateways with an IP address are kept (istiod resolves DNS names in the
// control plane; we do not yet). A nil *NetworkGateways has none: the mesh is one network.
type NetworkGateways struct {
	byNetwork        map[string][]*discoveryv1.NetworkGateway
	byNetworkCluster map[[2]string][]*discoveryv1.NetworkGateway
	// scale is the least common multiple of the gateway counts per network and per network
	// and cluster: every endpoint weight is multiplied by it, so that an endpoint's weight
	// divides evenly among the gateways in front of it.
	scale uint32
}

// ForEndpoint returns the gateways in front of an endpoint of network and cluster: those of
// its network and cluster, else every gateway of its network; in address, port order.
func (g *NetworkGateways) ForEndpoint(network, cluster string) []*discoveryv1.NetworkGateway {
	if g == nil {
		return nil
	}
	if gws := g.byNetworkCluster[[2]string{network, cluster}]; len(gws) > 0 {
		return gws
	}
	return g.byNetwork[network]
}

// Scale is the factor endpoint weights are multiplied by (1 without gateways).
func (g *NetworkGateways) Scale() uint32 {
	if g == nil {
		return 1
	}
	return g.scale
}

// networkGatewaysOnce builds a snapshot's NetworkGateways on first use.
type networkGatewaysOnce struct {
	once sync.Once
	gws  *NetworkGateways
}

// NetworkGateways returns the snapshot's east-west gateways; nil when there are none.
func (s *Snapshot) NetworkGateways() *NetworkGateways {
	h := s.networks
	if h == nil {
		h = &networkGatewaysOnce{}
	}
	h.once.Do(func() { h.gws = newNetworkGateways(s) })
	return h.gws
}

func newNetworkGateways(s *Snapshot) *NetworkGateways {
	type key struct {
		network, cluster, addr string
		port                   uint32
	}
	seen := map[key]bool{}
	var all []*discoveryv1.NetworkGateway
	for _, h := range s.Hostnames() {
		for _, gw := range s.Services[h].Spec.GetNetworkGateways() {
			k := key{gw.GetNetwork(), gw.GetClusterId(), gw.GetAddress(), gw.GetPort()}
			if _, err := netip.ParseAddr(k.addr); err != nil || k.network == "" || k.port == 0 || seen[k] {
				continue
			}
			seen[k] = true
			all = append(all, gw)
		}
	}
	if len(all) == 0 {
		return nil
	}
	slices.SortFunc(all, func(a, b *discoveryv1.NetworkGateway) int {
		return cmp.Or(cmp.Compare(a.GetAddress(), b.GetAddress()), cmp.Compare(a.GetPort(), b.GetPort()),
			cmp.Compare(a.GetNetwork(), b.GetNetwork()), cmp.Compare(a.GetClusterId(), b.GetClusterId()))
	})
	g := &NetworkGateways{byNetwork: map[string][]*discoveryv1.NetworkGateway{},
		byNetworkCluster: map[[2]string][]*discoveryv1.NetworkGateway{}, scale: 1}
	for _, gw := range all {
		g.byNetwork[gw.GetNetwork()] = append(g.byNetwork[gw.GetNetwork()], gw)
		nc := [2]string{gw.GetNetwork(), gw.GetClusterId()}
		g.byNetworkCluster[nc] = append(g.byNetworkCluster[nc], gw)
	}
	for _, gws := range g.byNetwork {
		g.scale = lcm(g.scale, uint32(len(gws)))
	}
	for _, gws := range g.byNetworkCluster {
		g.scale = lcm(g.scale, uint32(len(gws)))
	}
	return g
}

func lcm(a, b uint32) uint32 {
	x, y := a, b
	for y != 0 {
		x, y = y, x%y
	}
	return a / x * b
}
