package grpcgen

import (
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/services/xds-server/internal/translate"
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
	for _, ss := range translate.Subsets(dr.Spec) {
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
	pol := translate.TrafficPolicy(dr.Spec, port, subset)
	// gRPC limits only concurrent requests (gRFC A32), as istiod sets it.
	if n := pol.Pool.GetHttp().GetHttp2MaxRequests(); n > 0 {
		c.CircuitBreakers = &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{{
			MaxRequests: wrapperspb.UInt32(uint32(n))}}}
	}
	lb := pol.LB
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
