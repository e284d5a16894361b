// Package translate holds the mesh-to-xDS conversions that Envoy proxies (envoygen) and
// proxyless gRPC clients (grpcgen) share, so the two generators cannot drift apart.
package translate

import (
	"cmp"
	"math"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/xds-server/internal/model"
)

// LoadAssignment groups a service's healthy endpoints (of subset, if any) by locality, sorted
// so the output is stable, and applies locality load balancing when lb is not nil. Every
// locality carries a weight: gRPC ignores localities without one.
func LoadAssignment(name string, svc *model.Service, port *discoveryv1.Port,
	subset *networking.Subset, lb *LocalityLB) *endpointv3.ClusterLoadAssignment {
	return LoadAssignmentMTLS(name, svc, port, subset, lb, nil)
}

// LoadAssignmentMTLS is LoadAssignment with the endpoints istioMTLS accepts marked as able to
// take Istio mTLS (TLSModeMetadata), which auto-mTLS clusters' transport socket matches read;
// nil marks none.
func LoadAssignmentMTLS(name string, svc *model.Service, port *discoveryv1.Port, subset *networking.Subset,
	lb *LocalityLB, istioMTLS func(*discoveryv1.Endpoint) bool) *endpointv3.ClusterLoadAssignment {
	return LoadAssignmentFor(name, svc, port, subset, lb, istioMTLS, nil)
}

// LoadAssignmentFor is LoadAssignmentMTLS for a proxy in a multi-network mesh: with sh not
// nil, endpoints of other networks are replaced by their networks' gateways (SplitHorizon).
func LoadAssignmentFor(name string, svc *model.Service, port *discoveryv1.Port, subset *networking.Subset,
	lb *LocalityLB, istioMTLS func(*discoveryv1.Endpoint) bool, sh *SplitHorizon) *endpointv3.ClusterLoadAssignment {
	var groups []localityGroup
	find := func(l *discoveryv1.Locality) *localityGroup {
		for i := range groups {
			if compareLocality(groups[i].loc, l) == 0 {
				return &groups[i]
			}
		}
		groups = append(groups, localityGroup{loc: l, lle: &endpointv3.LocalityLbEndpoints{
			Locality: &corev3.Locality{Region: l.GetRegion(), Zone: l.GetZone(), SubZone: l.GetSubZone()}}})
		return &groups[len(groups)-1]
	}
	for _, ep := range svc.Endpoints {
		if !Balanced(ep, subset) {
			continue
		}
		g := find(ep.GetLocality())
		g.eps = append(g.eps, ep)
	}
	slices.SortFunc(groups, func(a, b localityGroup) int { return compareLocality(a.loc, b.loc) })
	for i := range groups {
		g := &groups[i]
		slices.SortStableFunc(g.eps, func(a, b *discoveryv1.Endpoint) int {
			return cmp.Or(strings.Compare(a.GetAddress(), b.GetAddress()), cmp.Compare(EndpointPort(a, port), EndpointPort(b, port)))
		})
		var weights uint64
		for _, ep := range g.eps {
			w := max(ep.GetWeight(), 1)
			weights += uint64(w)
			lbe := &endpointv3.LbEndpoint{
				HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
					Address: SocketAddress(ep.GetAddress(), EndpointPort(ep, port))}},
				HealthStatus:        corev3.HealthStatus_HEALTHY,
				LoadBalancingWeight: wrapperspb.UInt32(w),
			}
			if istioMTLS != nil && istioMTLS(ep) {
				lbe.Metadata = tlsModeMetadata
			}
			g.lle.LbEndpoints = append(g.lle.LbEndpoints, lbe)
		}
		g.lle.LoadBalancingWeight = wrapperspb.UInt32(uint32(min(weights, math.MaxUint32)))
		if sh != nil {
			sh.apply(g, istioMTLS)
		}
	}
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: name}
	if lb != nil {
		cla.Endpoints = applyLocalityLB(groups, lb)
		return cla
	}
	for _, g := range groups {
		cla.Endpoints = append(cla.Endpoints, g.lle)
	}
	return cla
}

// Balanced reports whether load assignments of subset (nil: the whole service) balance over
// ep: it is healthy, has an address, and has the subset's labels.
func Balanced(ep *discoveryv1.Endpoint, subset *networking.Subset) bool {
	return ep.GetHealth() == discoveryv1.Health_HEALTHY && ep.GetAddress() != "" &&
		model.LabelsMatch(subset.GetLabels(), ep.GetLabels())
}

// EndpointPort is the port an endpoint serves a service port on: its own mapping for the
// port's name, else the service's target port, else the service port itself.
func EndpointPort(ep *discoveryv1.Endpoint, port *discoveryv1.Port) uint32 {
	if p := ep.GetPorts()[port.GetName()]; p != 0 && port.GetName() != "" {
		return p
	}
	if port.GetTargetPort() != 0 {
		return port.GetTargetPort()
	}
	return port.GetNumber()
}

// SocketAddress is a TCP address.
func SocketAddress(ip string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: ip, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port}}}}
}

// SortedKeys returns the keys of m in order, so generated output is stable.
func SortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func compareLocality(a, b *discoveryv1.Locality) int {
	return cmp.Or(strings.Compare(a.GetRegion(), b.GetRegion()), strings.Compare(a.GetZone(), b.GetZone()),
		strings.Compare(a.GetSubZone(), b.GetSubZone()))
}
