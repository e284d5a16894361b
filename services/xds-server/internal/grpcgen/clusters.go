package grpcgen

import (
	"cmp"
	"math"
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

// maxRingSize is Envoy's (and gRPC's) upper bound for ring_hash minimum_ring_size.
const maxRingSize = 8 * 1024 * 1024

type subsetCluster struct {
	cluster *clusterv3.Cluster
	subset  *networking.Subset // nil for the whole service
}

func (g *generator) clusters(svc *model.Service, port *discoveryv1.Port,
	dr *model.Config[*networking.DestinationRule]) []subsetCluster {
	host := svc.Spec.GetHostname()
	out := []subsetCluster{{cluster: g.cluster(ClusterName(port.GetNumber(), "", host), dr, port.GetNumber(), "")}}
	if dr == nil {
		return out
	}
	seen := map[string]bool{}
	for _, ss := range dr.Spec.GetSubsets() {
		if ss.GetName() == "" || seen[ss.GetName()] {
			continue
		}
		seen[ss.GetName()] = true
		name := ClusterName(port.GetNumber(), ss.GetName(), host)
		out = append(out, subsetCluster{cluster: g.cluster(name, dr, port.GetNumber(), ss.GetName()), subset: ss})
	}
	return out
}

func (g *generator) cluster(name string, dr *model.Config[*networking.DestinationRule], port uint32,
	subset string) *clusterv3.Cluster {
	c := &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{
			EdsConfig:   adsConfigSource(),
			ServiceName: name,
		},
		LbPolicy: clusterv3.Cluster_ROUND_ROBIN,
	}
	if dr == nil {
		return c
	}
	lb := effectiveLB(dr.Spec, port, subset)
	log := g.log.With("destinationRule", dr.Namespace+"/"+dr.Name, "cluster", name)
	switch {
	case lb == nil:
	case lb.GetConsistentHash() != nil:
		ch := lb.GetConsistentHash()
		if ch.GetMaglev() != nil {
			log.Debug("maglev is not supported by gRPC, using ring hash")
		}
		c.LbPolicy = clusterv3.Cluster_RING_HASH
		size := ch.GetRingHash().GetMinimumRingSize()
		if size == 0 {
			size = ch.GetMinimumRingSize() //nolint:staticcheck // still honoured by Istio
		}
		if size > 0 {
			c.LbConfig = &clusterv3.Cluster_RingHashLbConfig_{RingHashLbConfig: &clusterv3.Cluster_RingHashLbConfig{
				MinimumRingSize: wrapperspb.UInt64(min(size, maxRingSize)),
			}}
		}
	default:
		switch lb.GetSimple() {
		case networking.LoadBalancerSettings_UNSPECIFIED, networking.LoadBalancerSettings_ROUND_ROBIN:
		case networking.LoadBalancerSettings_LEAST_REQUEST, networking.LoadBalancerSettings_LEAST_CONN:
			c.LbPolicy = clusterv3.Cluster_LEAST_REQUEST
		default:
			// gRPC NACKs any other lb_policy, which would break the whole cluster.
			log.Debug("load balancer not supported by gRPC, using round robin", "simple", lb.GetSimple().String())
		}
	}
	return c
}

// effectiveLB applies Istio's precedence: subset over port level over the rule's default.
func effectiveLB(dr *networking.DestinationRule, port uint32, subset string) *networking.LoadBalancerSettings {
	lb := policyLB(dr.GetTrafficPolicy(), port)
	if subset == "" {
		return lb
	}
	for _, ss := range dr.GetSubsets() {
		if ss.GetName() == subset {
			if s := policyLB(ss.GetTrafficPolicy(), port); s != nil {
				lb = s
			}
			break
		}
	}
	return lb
}

func policyLB(tp *networking.TrafficPolicy, port uint32) *networking.LoadBalancerSettings {
	lb := tp.GetLoadBalancer()
	for _, pls := range tp.GetPortLevelSettings() {
		if pls.GetPort().GetNumber() == port && pls.GetLoadBalancer() != nil {
			lb = pls.GetLoadBalancer()
		}
	}
	return lb
}

func (g *generator) loadAssignment(name string, svc *model.Service, port *discoveryv1.Port,
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
		if ep.GetHealth() != discoveryv1.Health_HEALTHY || ep.GetAddress() == "" || !labelsMatch(subset.GetLabels(), ep.GetLabels()) {
			continue
		}
		p := endpointPort(ep, port)
		w := max(ep.GetWeight(), 1)
		l := find(ep.GetLocality())
		l.weights += uint64(w)
		l.eps = append(l.eps, &endpointv3.LbEndpoint{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
					Address:       ep.GetAddress(),
					PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: p},
				}}},
			}},
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
			Locality: &corev3.Locality{Region: l.loc.GetRegion(), Zone: l.loc.GetZone(), SubZone: l.loc.GetSubZone()},
			// gRPC ignores localities without a weight.
			LoadBalancingWeight: wrapperspb.UInt32(uint32(min(l.weights, math.MaxUint32))),
			LbEndpoints:         l.eps,
		})
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

func labelsMatch(selector, labels map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}
