package envoygen

import (
	"testing"

	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	"sailplane.dev/services/xds-server/internal/model"
)

// TestClientCertDetails: x-forwarded-client-cert as istiod sets it on inbound and gateway HTTP
// managers, with the mesh's defaultConfig overrides.
func TestClientCertDetails(t *testing.T) {
	inboundDefault := &hcmv3.HttpConnectionManager_SetCurrentClientCertDetails{Subject: wrapperspb.Bool(true), Dns: true, Uri: true}
	gatewayDefault := &hcmv3.HttpConnectionManager_SetCurrentClientCertDetails{Subject: wrapperspb.Bool(true), Cert: true, Dns: true, Uri: true}
	for _, tc := range []struct {
		name    string
		pc      *meshv1alpha1.ProxyConfig
		gateway bool
		mode    hcmv3.HttpConnectionManager_ForwardClientCertDetails
		set     *hcmv3.HttpConnectionManager_SetCurrentClientCertDetails
	}{
		{name: "inbound default", mode: hcmv3.HttpConnectionManager_APPEND_FORWARD, set: inboundDefault},
		{name: "gateway default", gateway: true, mode: hcmv3.HttpConnectionManager_SANITIZE_SET, set: gatewayDefault},
		{name: "inbound proxyHeaders", pc: &meshv1alpha1.ProxyConfig{ProxyHeaders: &meshv1alpha1.ProxyConfig_ProxyHeaders{
			ForwardedClientCert: meshv1alpha1.ForwardClientCertDetails_FORWARD_ONLY,
			SetCurrentClientCertDetails: &meshv1alpha1.ProxyConfig_ProxyHeaders_SetCurrentClientCertDetails{
				Subject: wrapperspb.Bool(false), Chain: wrapperspb.Bool(true)}}},
			mode: hcmv3.HttpConnectionManager_FORWARD_ONLY,
			set:  &hcmv3.HttpConnectionManager_SetCurrentClientCertDetails{Subject: wrapperspb.Bool(false), Dns: true, Uri: true, Chain: true}},
		{name: "gateway topology append", gateway: true, pc: &meshv1alpha1.ProxyConfig{GatewayTopology: &meshv1alpha1.Topology{
			ForwardClientCertDetails: meshv1alpha1.ForwardClientCertDetails_APPEND_FORWARD}},
			mode: hcmv3.HttpConnectionManager_APPEND_FORWARD, set: gatewayDefault},
		// Envoy writes no details in the other modes, so none are set.
		{name: "gateway topology forward only", gateway: true, pc: &meshv1alpha1.ProxyConfig{GatewayTopology: &meshv1alpha1.Topology{
			ForwardClientCertDetails: meshv1alpha1.ForwardClientCertDetails_FORWARD_ONLY}},
			mode: hcmv3.HttpConnectionManager_FORWARD_ONLY},
		// The gateway ignores proxyHeaders, the sidecar gatewayTopology.
		{name: "gateway ignores proxyHeaders", gateway: true, pc: &meshv1alpha1.ProxyConfig{ProxyHeaders: &meshv1alpha1.ProxyConfig_ProxyHeaders{
			ForwardedClientCert: meshv1alpha1.ForwardClientCertDetails_SANITIZE}},
			mode: hcmv3.HttpConnectionManager_SANITIZE_SET, set: gatewayDefault},
		{name: "inbound ignores gatewayTopology", pc: &meshv1alpha1.ProxyConfig{GatewayTopology: &meshv1alpha1.Topology{
			ForwardClientCertDetails: meshv1alpha1.ForwardClientCertDetails_SANITIZE}},
			mode: hcmv3.HttpConnectionManager_APPEND_FORWARD, set: inboundDefault},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &builder{snap: &model.Snapshot{Mesh: &meshv1alpha1.MeshConfig{DefaultConfig: tc.pc}}}
			h := &hcmv3.HttpConnectionManager{}
			b.setClientCertDetails(h, tc.gateway)
			if h.GetForwardClientCertDetails() != tc.mode || !proto.Equal(h.GetSetCurrentClientCertDetails(), tc.set) {
				t.Errorf("got %v %v, want %v %v", h.GetForwardClientCertDetails(), h.GetSetCurrentClientCertDetails(), tc.mode, tc.set)
			}
		})
	}
}
