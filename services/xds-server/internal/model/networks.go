package model

import (
	"cmp"
	"maps"
	"net/netip"
	"slices"
	"sync"

	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
)

// NetworkGateways indexes the mesh's east-west gateways (the network_gateways of every
// Service) for split-horizon EDS, as istiod's NetworkManager does: by network, and by network
// and cluster. Only gateways with an IP address are kept (istiod resolves DNS names in the
// control plane; we do not yet). A nil *NetworkGateways has none: the mesh is one network.
type NetworkGateways struct {
	byNetwork        map[string][]*discoveryv1.NetworkGateway
	byNetworkCluster map[[2]string][]*discoveryv1.NetworkGateway
	// byCluster and cidrs are meshNetworks' fromRegistry and fromCidr (see EndpointNetwork).
	byCluster map[string]string
	cidrs     []networkCIDR
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

// networkCIDR is one fromCidr of meshNetworks.
type networkCIDR struct {
	prefix  netip.Prefix
	network string
}

// EndpointNetwork is the network of an endpoint, as istiod assigns it: the network
// endpoint-watcher gave it (its Pod's or WorkloadEntry's, else its cluster's istio-system
// label), else the meshNetworks network whose fromRegistry names its cluster, else the one
// whose fromCidr contains its address (the widest such range, as istiod's CIDR trie returns it
// first), else none.
func (g *NetworkGateways) EndpointNetwork(ep *discoveryv1.Endpoint) string {
	if nw := ep.GetNetwork(); nw != "" || g == nil {
		return nw
	}
	if nw := g.byCluster[ep.GetClusterId()]; nw != "" {
		return nw
	}
	if len(g.cidrs) == 0 {
		return ""
	}
	addr, err := netip.ParseAddr(ep.GetAddress())
	if err != nil {
		return ""
	}
	addr = addr.Unmap()
	for _, c := range g.cidrs {
		if c.prefix.Contains(addr) {
			return c.network
		}
	}
	return ""
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
	add := func(gw *discoveryv1.NetworkGateway) {
		k := key{gw.GetNetwork(), gw.GetClusterId(), gw.GetAddress(), gw.GetPort()}
		if _, err := netip.ParseAddr(k.addr); err != nil || k.network == "" || k.port == 0 || seen[k] {
			return
		}
		seen[k] = true
		all = append(all, gw)
	}
	// meshNetworks' gateways by address belong to no cluster (istiod's API has none).
	nets := s.MeshNetworks.GetNetworks()
	for _, name := range slices.Sorted(maps.Keys(nets)) {
		for _, gw := range nets[name].GetGateways() {
			if a := gw.GetAddress(); a != "" {
				add(&discoveryv1.NetworkGateway{Network: name, Address: a, Port: gw.GetPort()})
			}
		}
	}
	for _, h := range s.Hostnames() {
		for _, gw := range s.Services[h].Spec.GetNetworkGateways() {
			add(gw)
		}
	}
	// registryServiceName: the named Service's outside addresses in the network's fromRegistry
	// clusters (those endpoint-watcher lists with no network: a Service labelled with a
	// network is that network's gateway only, as in istiod), on meshNetworks' port.
	for _, name := range slices.Sorted(maps.Keys(nets)) {
		var clusters []string
		for _, ep := range nets[name].GetEndpoints() {
			if c := ep.GetFromRegistry(); c != "" {
				clusters = append(clusters, c)
			}
		}
		for _, gw := range nets[name].GetGateways() {
			svc := s.Services[gw.GetRegistryServiceName()]
			if gw.GetRegistryServiceName() == "" || svc == nil {
				continue
			}
			for _, a := range svc.Spec.GetNetworkGateways() {
				if a.GetNetwork() == "" && slices.Contains(clusters, a.GetClusterId()) {
					add(&discoveryv1.NetworkGateway{Network: name, ClusterId: a.GetClusterId(), Address: a.GetAddress(), Port: gw.GetPort()})
				}
			}
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
	g.byCluster, g.cidrs = meshNetworkEndpoints(nets)
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

// meshNetworkEndpoints indexes meshNetworks' endpoints: the network of each fromRegistry cluster
// (the first network by name when several claim one, where istiod's pick is random) and the
// fromCidr ranges, widest first. Bad CIDRs were refused by config-ingest; any left are skipped.
func meshNetworkEndpoints(nets map[string]*meshv1alpha1.Network) (map[string]string, []networkCIDR) {
	byCluster := map[string]string{}
	var cidrs []networkCIDR
	for _, name := range slices.Sorted(maps.Keys(nets)) {
		for _, ep := range nets[name].GetEndpoints() {
			if c := ep.GetFromRegistry(); c != "" {
				if _, ok := byCluster[c]; !ok {
					byCluster[c] = name
				}
			}
			if c := ep.GetFromCidr(); c != "" {
				if p, err := netip.ParsePrefix(c); err == nil {
					cidrs = append(cidrs, networkCIDR{prefix: p.Masked(), network: name})
				}
			}
		}
	}
	slices.SortStableFunc(cidrs, func(a, b networkCIDR) int { return cmp.Compare(a.prefix.Bits(), b.prefix.Bits()) })
	return byCluster, cidrs
}

func lcm(a, b uint32) uint32 {
	x, y := a, b
	for y != 0 {
		x, y = y, x%y
	}
	return a / x * b
}
