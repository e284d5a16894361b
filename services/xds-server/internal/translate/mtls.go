package translate

import (
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"
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
