package translate

import (
	"math"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// How an endpoint that can take Istio mTLS (its workload labelled model.TLSModeLabel=istio) is
// told to a cluster's transport socket matches: istiod puts {tlsMode: istio} in its
// envoy.transport_socket_match metadata.
const (
	TLSModeKey              = "tlsMode"
	TLSModeIstio            = "istio"
	TransportSocketMatchKey = "envoy.transport_socket_match"
)

// tlsModeMetadata marks an endpoint as taking Istio mTLS. Shared by every marked endpoint:
// generated resources are never modified.
var tlsModeMetadata = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
	TransportSocketMatchKey: {Fields: map[string]*structpb.Value{TLSModeKey: structpb.NewStringValue(TLSModeIstio)}},
}}

// KeepIstioMTLS drops from cla the endpoints not marked as taking Istio mTLS, and localities
// left without any keep no weight.
func KeepIstioMTLS(cla *endpointv3.ClusterLoadAssignment) {
	for i, lle := range cla.GetEndpoints() {
		var keep []*endpointv3.LbEndpoint
		var sum uint64
		for _, le := range lle.GetLbEndpoints() {
			if le.GetMetadata().GetFilterMetadata()[TransportSocketMatchKey].GetFields()[TLSModeKey].GetStringValue() == TLSModeIstio {
				keep = append(keep, le)
				sum += uint64(le.GetLoadBalancingWeight().GetValue())
			}
		}
		if len(keep) == len(lle.GetLbEndpoints()) {
			continue
		}
		cp := &endpointv3.LocalityLbEndpoints{Locality: lle.GetLocality(), Priority: lle.GetPriority(), LbEndpoints: keep}
		if len(keep) > 0 {
			cp.LoadBalancingWeight = wrapperspb.UInt32(uint32(min(sum, math.MaxUint32)))
		}
		cla.Endpoints[i] = cp
	}
}
