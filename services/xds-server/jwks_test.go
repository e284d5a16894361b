package xdsserver

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	jwtv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resource "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"sailplane.dev/services/xds-server/internal/fakebus"
)

// inlineKeys reads the keys of the first jwt_authn provider on virtualInbound's HTTP chains
// ("" when they are not inline).
func inlineKeys(t *testing.T, resp *discoverygrpc.DiscoveryResponse) string {
	t.Helper()
	for _, a := range resp.GetResources() {
		var l listenerv3.Listener
		if err := a.UnmarshalTo(&l); err != nil {
			t.Fatal(err)
		}
		if l.GetName() != "virtualInbound" {
			continue
		}
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				var h hcmv3.HttpConnectionManager
				if f.GetTypedConfig().UnmarshalTo(&h) != nil {
					continue
				}
				for _, hf := range h.GetHttpFilters() {
					var j jwtv3.JwtAuthentication
					if hf.GetTypedConfig().UnmarshalTo(&j) == nil && hf.GetName() == "envoy.filters.http.jwt_authn" {
						return j.GetProviders()["origins-0"].GetLocalJwks().GetInlineString()
					}
				}
			}
		}
	}
	return ""
}

// The xds-server fetches a RequestAuthentication's jwksUri and inlines the keys into the
// sidecar's jwt_authn filter, pushing the listener again once they are fetched.
func TestJWKSInlined(t *testing.T) {
	var keys atomic.Value
	keys.Store(`{"keys":[{"kty":"RSA","e":"AQAB","n":"first"}]}`)
	idp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(keys.Load().(string))) }))
	defer idp.Close()
	src := fakebus.New(append(changes(t, `
apiVersion: sailplane.dev/v1
kind: Service
spec:
  hostname: web.demo.svc.cluster.local
  namespace: demo
  ports: [{name: http, number: 80, protocol: HTTP}]
---
apiVersion: sailplane.dev/v1
kind: Endpoints
spec:
  hostname: web.demo.svc.cluster.local
  namespace: demo
  endpoints: [{address: 10.0.0.1}]
`), changes(t, fmt.Sprintf(`
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {name: jwt, namespace: demo}
spec:
  jwtRules: [{issuer: idp, jwksUri: %q}]
`, idp.URL+"/keys"))...)...)
	srv := startServer(t, src)
	client := adsClient(t, srv.Addr())
	stream, err := client.StreamAggregatedResources(streamContext(t), grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	md, _ := structpb.NewStruct(map[string]any{"NAMESPACE": "demo"})
	node := &corev3.Node{Id: "sidecar~10.0.0.1~web-1.demo~demo.svc.cluster.local", Metadata: md}
	req := &discoverygrpc.DiscoveryRequest{Node: node, TypeUrl: resource.ListenerType}
	if err := stream.Send(req); err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if got := inlineKeys(t, resp); got == keys.Load().(string) {
			return
		}
		// ACK and wait for the push that carries the fetched keys.
		req.VersionInfo, req.ResponseNonce = resp.GetVersionInfo(), resp.GetNonce()
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
	}
}
