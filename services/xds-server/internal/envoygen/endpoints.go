package envoygen

import (
	"slices"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/services/xds-server/internal/translate"
)

// endpoints returns a load assignment for every EDS cluster the proxy gets.
func (b *builder) endpoints() []*endpointv3.ClusterLoadAssignment {
	var out []*endpointv3.ClusterLoadAssignment
	for _, oc := range b.outboundClusters(false) {
		if oc.cluster.GetType() != clusterv3.Cluster_EDS {
			continue
		}
		cla := translate.LoadAssignmentFor(oc.cluster.GetName(), oc.svc, oc.port, oc.subset, oc.lb,
			b.endpointMTLS(oc.svc, oc.port, oc.subset.GetName()), b.splitHorizon)
		if oc.sniDNAT {
			// The gateway cannot tell mTLS from other TLS it passes through: as istiod, it
			// only balances over endpoints that take mTLS, so plaintext ones stay unreachable.
			translate.KeepIstioMTLS(cla)
		}
		out = append(out, cla)
	}
	slices.SortStableFunc(out, func(a, b *endpointv3.ClusterLoadAssignment) int {
		return strings.Compare(a.GetClusterName(), b.GetClusterName())
	})
	return out
}

// dnsLoadAssignment is the inline assignment of a DNS cluster: the endpoints' names, or the
// service's own hostname when it has none (a ServiceEntry with DNS resolution and no endpoints).
// LOGICAL_DNS clusters take exactly one endpoint.
func (b *builder) dnsLoadAssignment(name string, svc *model.Service, port *discoveryv1.Port,
	subset *networking.Subset, lb *translate.LocalityLB, istioMTLS func(*discoveryv1.Endpoint) bool) *endpointv3.ClusterLoadAssignment {
	cla := translate.LoadAssignmentFor(name, svc, port, subset, lb, istioMTLS, b.splitHorizon)
	if len(svc.Endpoints) == 0 {
		target := port.GetTargetPort()
		if target == 0 {
			target = port.GetNumber()
		}
		cla.Endpoints = []*endpointv3.LocalityLbEndpoints{{
			Locality: &corev3.Locality{},
			LbEndpoints: []*endpointv3.LbEndpoint{{
				HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
					Address: translate.SocketAddress(svc.Spec.GetHostname(), target)}},
				LoadBalancingWeight: wrapperspb.UInt32(1),
			}},
			LoadBalancingWeight: wrapperspb.UInt32(1),
		}}
	}
	if len(cla.Endpoints) == 0 {
		kind := "STRICT_DNS"
		if svc.Spec.GetResolution() == discoveryv1.Resolution_DNS_ROUND_ROBIN {
			kind = "LOGICAL_DNS"
		}
		b.report(model.MetricDNSClusterNoEndpoints, name, kind+" cluster without endpoints "+name+" found while pushing CDS")
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

// endpointMTLS tells which endpoints of a cluster EDS marks as taking Istio mTLS
// (translate.EndpointMTLS).
func (b *builder) endpointMTLS(svc *model.Service, port *discoveryv1.Port, subset string) func(*discoveryv1.Endpoint) bool {
	return translate.EndpointMTLS(b.snap, specOf(b.binds.DestinationRule(svc.Spec.GetHostname())), svc, port, subset, b.ix.peerDisables)
}
