package envoygen

import (
	"cmp"
	"math"
	"net/netip"
	"slices"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/xds-server/internal/model"
)

// endpoints returns a load assignment for every EDS cluster the proxy gets.
func (b *builder) endpoints() []*endpointv3.ClusterLoadAssignment {
	var out []*endpointv3.ClusterLoadAssignment
	for _, oc := range b.outboundClusters() {
		if oc.cluster.GetType() != clusterv3.Cluster_EDS {
			continue
		}
		out = append(out, b.loadAssignment(oc.cluster.GetName(), oc.svc, oc.port, oc.subset))
	}
	slices.SortStableFunc(out, func(a, b *endpointv3.ClusterLoadAssignment) int {
		return strings.Compare(a.GetClusterName(), b.GetClusterName())
	})
	return out
}

// loadAssignment groups a service's healthy endpoints (of subset, if any) by locality.
func (b *builder) loadAssignment(name string, svc *model.Service, port *discoveryv1.Port,
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
			!labelsMatch(subset.GetLabels(), ep.GetLabels()) {
			continue
		}
		w := max(ep.GetWeight(), 1)
		l := find(ep.GetLocality())
		l.weights += uint64(w)
		l.eps = append(l.eps, &endpointv3.LbEndpoint{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: socketAddress(ep.GetAddress(), endpointPort(ep, port))}},
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

// dnsLoadAssignment is the inline assignment of a DNS cluster: the endpoints' names, or the
// service's own hostname when it has none (a ServiceEntry with DNS resolution and no endpoints).
// LOGICAL_DNS clusters take exactly one endpoint.
func (b *builder) dnsLoadAssignment(name string, svc *model.Service, port *discoveryv1.Port,
	subset *networking.Subset) *endpointv3.ClusterLoadAssignment {
	cla := b.loadAssignment(name, svc, port, subset)
	if len(svc.Endpoints) == 0 {
		target := port.GetTargetPort()
		if target == 0 {
			target = port.GetNumber()
		}
		cla.Endpoints = []*endpointv3.LocalityLbEndpoints{{
			Locality: &corev3.Locality{},
			LbEndpoints: []*endpointv3.LbEndpoint{{
				HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
					Address: socketAddress(svc.Spec.GetHostname(), target)}},
				LoadBalancingWeight: wrapperspb.UInt32(1),
			}},
			LoadBalancingWeight: wrapperspb.UInt32(1),
		}}
	}
	if svc.Spec.GetResolution() == discoveryv1.Resolution_DNS_ROUND_ROBIN && len(cla.Endpoints) > 0 {
		first := cla.Endpoints[0]
		if len(cla.Endpoints) > 1 || len(first.LbEndpoints) > 1 {
			b.log.Debug("LOGICAL_DNS cluster takes one endpoint; using the first", "cluster", name)
		}
		first.LbEndpoints = first.LbEndpoints[:min(len(first.LbEndpoints), 1)]
		cla.Endpoints = cla.Endpoints[:1]
	}
	return cla
}

// endpointPort is the port an endpoint serves a service port on: its own mapping for the
// port's name, else the service's target port, else the service port itself.
func endpointPort(ep *discoveryv1.Endpoint, port *discoveryv1.Port) uint32 {
	if p := ep.GetPorts()[port.GetName()]; p != 0 && port.GetName() != "" {
		return p
	}
	if port.GetTargetPort() != 0 {
		return port.GetTargetPort()
	}
	return port.GetNumber()
}

func compareLocality(a, b *discoveryv1.Locality) int {
	return cmp.Or(strings.Compare(a.GetRegion(), b.GetRegion()), strings.Compare(a.GetZone(), b.GetZone()),
		strings.Compare(a.GetSubZone(), b.GetSubZone()))
}

// inboundPort is a port the proxy's own workload serves, reached through virtualInbound.
type inboundPort struct {
	port     uint32 // the workload's port, which captured traffic is addressed to
	proto    protocol
	endpoint *corev3.Address
}

// inboundPorts lists the workload's ports (see snapIndex.inboundPorts).
func (b *builder) inboundPorts() []inboundPort {
	return b.ix.inboundPorts(specOf(b.sidecar), b.proxy, b.log)
}

// parseDefaultEndpoint reads "127.0.0.1:8080", "0.0.0.0:8080" (the instance IP in Istio; here
// loopback) or "unix:///path".
func parseDefaultEndpoint(s string) (*corev3.Address, bool) {
	if path, ok := strings.CutPrefix(s, "unix://"); ok && path != "" {
		return &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: path}}}, true
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil || ap.Port() == 0 {
		return nil, false
	}
	ip := ap.Addr().String()
	if ap.Addr().IsUnspecified() {
		ip = "127.0.0.1"
	}
	return socketAddress(ip, uint32(ap.Port())), true
}
