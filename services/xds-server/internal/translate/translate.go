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
// so the output is stable. Every locality carries a weight: gRPC ignores localities without one.
func LoadAssignment(name string, svc *model.Service, port *discoveryv1.Port,
	subset *networking.Subset) *endpointv3.ClusterLoadAssignment {
	type locality struct {
		loc     *discoveryv1.Locality
		eps     []*endpointv3.LbEndpoint
		weights uint64
	}
	var locs []*locality
	find := func(l *discoveryv1.Locality) *locality {
		for _, x := range locs {
			if compareLocality(x.loc, l) == 0 {
				return x
			}
		}
		x := &locality{loc: l}
		locs = append(locs, x)
		return x
	}
	for _, ep := range svc.Endpoints {
		if ep.GetHealth() != discoveryv1.Health_HEALTHY || ep.GetAddress() == "" ||
			!model.LabelsMatch(subset.GetLabels(), ep.GetLabels()) {
			continue
		}
		w := max(ep.GetWeight(), 1)
		l := find(ep.GetLocality())
		l.weights += uint64(w)
		l.eps = append(l.eps, &endpointv3.LbEndpoint{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: SocketAddress(ep.GetAddress(), EndpointPort(ep, port))}},
			HealthStatus:        corev3.HealthStatus_HEALTHY,
			LoadBalancingWeight: wrapperspb.UInt32(w),
		})
	}
	slices.SortFunc(locs, func(a, b *locality) int { return compareLocality(a.loc, b.loc) })
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: name}
	for _, l := range locs {
		slices.SortFunc(l.eps, func(a, b *endpointv3.LbEndpoint) int {
			sa, sb := a.GetEndpoint().GetAddress().GetSocketAddress(), b.GetEndpoint().GetAddress().GetSocketAddress()
			return cmp.Or(strings.Compare(sa.GetAddress(), sb.GetAddress()), cmp.Compare(sa.GetPortValue(), sb.GetPortValue()))
		})
		cla.Endpoints = append(cla.Endpoints, &endpointv3.LocalityLbEndpoints{
			Locality:            &corev3.Locality{Region: l.loc.GetRegion(), Zone: l.loc.GetZone(), SubZone: l.loc.GetSubZone()},
			LoadBalancingWeight: wrapperspb.UInt32(uint32(min(l.weights, math.MaxUint32))),
			LbEndpoints:         l.eps,
		})
	}
	return cla
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
