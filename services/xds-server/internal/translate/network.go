package translate

import (
	"cmp"
	"math"
	"net/netip"
	"slices"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/xds-server/internal/model"
)

// SplitHorizon is what a proxy's load assignments depend on in a multi-network mesh: its own
// network and IP families, and the mesh's east-west gateways.
type SplitHorizon struct {
	Network  string
	V4, V6   bool
	Gateways *model.NetworkGateways
}

// SplitHorizonFor returns the split horizon of proxy at snap; nil when the mesh has no
// network gateway, as istiod then sends every endpoint as it is.
func SplitHorizonFor(snap *model.Snapshot, proxy *model.Proxy) *SplitHorizon {
	gws := snap.NetworkGateways()
	if gws == nil {
		return nil
	}
	v4, v6 := proxy.IPFamilies()
	return &SplitHorizon{Network: proxy.Network, V4: v4, V6: v6, Gateways: gws}
}

// Key names the proxy's side of the split horizon for cache keys (the gateways come from
// Service specs: when they change, so does the snapshot's ConfigVersion).
func (sh *SplitHorizon) Key() string {
	if sh == nil {
		return ""
	}
	fam := "46"
	switch {
	case sh.V4 && !sh.V6:
		fam = "4"
	case sh.V6 && !sh.V4:
		fam = "6"
	}
	return "/net=" + sh.Network + "/" + fam
}

// inNetwork is istiod's Proxy.InNetwork: an empty network on either side matches any.
func (sh *SplitHorizon) inNetwork(network string) bool {
	return network == "" || sh.Network == "" || network == sh.Network
}

// reachable keeps the gateways of the proxy's IP families.
func (sh *SplitHorizon) reachable(gws []*discoveryv1.NetworkGateway) []*discoveryv1.NetworkGateway {
	if sh.V4 && sh.V6 {
		return gws
	}
	var out []*discoveryv1.NetworkGateway
	for _, gw := range gws {
		if v4 := isIPv4(gw.GetAddress()); (v4 && sh.V4) || (!v4 && sh.V6) {
			out = append(out, gw)
		}
	}
	return out
}

// apply rewrites one locality's endpoints as istiod's split-horizon EDS does: every weight is
// scaled by the gateways' common multiple; an endpoint the proxy reaches directly (its own
// network, or a network without gateway) stays; one behind gateways is replaced by them, each
// gateway taking an equal share of its weight, and only when the endpoint takes Istio mTLS:
// the gateway routes by the SNI of the mTLS connection and cannot route plaintext.
func (sh *SplitHorizon) apply(g *localityGroup, istioMTLS func(*discoveryv1.Endpoint) bool) {
	scale := sh.Gateways.Scale()
	var eps []*discoveryv1.Endpoint
	var lbes []*endpointv3.LbEndpoint
	weights := map[*discoveryv1.NetworkGateway]uint32{}
	var order []*discoveryv1.NetworkGateway
	for i, ep := range g.eps {
		lbe := g.lle.GetLbEndpoints()[i]
		w := scaleWeight(lbe.GetLoadBalancingWeight().GetValue(), scale)
		if w != lbe.GetLoadBalancingWeight().GetValue() {
			lbe = &endpointv3.LbEndpoint{HostIdentifier: lbe.GetHostIdentifier(), HealthStatus: lbe.GetHealthStatus(),
				Metadata: lbe.GetMetadata(), LoadBalancingWeight: wrapperspb.UInt32(w)}
		}
		nw := sh.Gateways.EndpointNetwork(ep)
		gws := sh.Gateways.ForEndpoint(nw, ep.GetClusterId())
		// A proxy without a network still goes through the gateways of an endpoint's network.
		force := sh.Network == "" && nw != "" && len(gws) > 0
		if !force && (sh.inNetwork(nw) || len(gws) == 0) {
			eps, lbes = append(eps, ep), append(lbes, lbe)
			continue
		}
		gws = sh.reachable(gws)
		if len(gws) == 0 || istioMTLS == nil || !istioMTLS(ep) {
			continue
		}
		share := w / uint32(len(gws))
		for _, gw := range gws {
			if _, ok := weights[gw]; !ok {
				order = append(order, gw)
			}
			weights[gw] += share
		}
	}
	sortGateways(order)
	for _, gw := range order {
		w := max(weights[gw], 1)
		eps = append(eps, &discoveryv1.Endpoint{Address: gw.GetAddress(), Network: gw.GetNetwork(), ClusterId: gw.GetClusterId()})
		lbes = append(lbes, &endpointv3.LbEndpoint{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: SocketAddress(gw.GetAddress(), gw.GetPort())}},
			LoadBalancingWeight: wrapperspb.UInt32(w),
			Metadata:            tlsModeMetadata,
		})
	}
	g.eps = eps
	g.lle = &endpointv3.LocalityLbEndpoints{Locality: g.lle.GetLocality(), Priority: g.lle.GetPriority(), LbEndpoints: lbes}
	if len(lbes) > 0 {
		var sum uint64
		for _, l := range lbes {
			sum += uint64(l.GetLoadBalancingWeight().GetValue())
		}
		g.lle.LoadBalancingWeight = wrapperspb.UInt32(uint32(min(sum, math.MaxUint32)))
	}
}

func scaleWeight(w, scale uint32) uint32 {
	if w == 0 {
		return scale
	}
	if w >= math.MaxUint32/scale {
		return math.MaxUint32
	}
	return w * scale
}

func isIPv4(addr string) bool {
	a, err := netip.ParseAddr(addr)
	return err == nil && a.Unmap().Is4()
}

// sortGateways orders gateways by address, then port, as istiod's SortGateways.
func sortGateways(gws []*discoveryv1.NetworkGateway) {
	slices.SortFunc(gws, func(a, b *discoveryv1.NetworkGateway) int {
		return cmp.Or(cmp.Compare(a.GetAddress(), b.GetAddress()), cmp.Compare(a.GetPort(), b.GetPort()))
	})
}
