package translate

import (
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
)

// How Istio tells endpoints that can take its mTLS: the injector labels sidecar workloads
// security.istio.io/tlsMode=istio, and istiod copies that to the endpoint's metadata under
// envoy.transport_socket_match, where a cluster's transport socket matches look.
const (
	TLSModeLabel            = "security.istio.io/tlsMode"
	TLSModeKey              = "tlsMode"
	TLSModeIstio            = "istio"
	TransportSocketMatchKey = "envoy.transport_socket_match"
)

// HasSidecar reports whether an endpoint's workload is labelled as taking Istio mTLS.
func HasSidecar(ep *discoveryv1.Endpoint) bool {
	return ep.GetLabels()[TLSModeLabel] == TLSModeIstio
}

// tlsModeMetadata marks an endpoint as taking Istio mTLS. Shared by every marked endpoint:
// generated resources are never modified.
var tlsModeMetadata = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
	TransportSocketMatchKey: {Fields: map[string]*structpb.Value{TLSModeKey: structpb.NewStringValue(TLSModeIstio)}},
}}
