package xdsserver

import (
	"slices"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"sailplane.dev/services/xds-server/internal/model"
)

const scopeInput = `apiVersion: sailplane.dev/v1
kind: Service
spec:
  hostname: echo.demo.svc.cluster.local
  namespace: demo
  ports: [{name: grpc, number: 7070, protocol: GRPC}, {name: admin, number: 8080, protocol: GRPC}]
---
apiVersion: sailplane.dev/v1
kind: Service
spec:
  hostname: cart.backend.svc.cluster.local
  namespace: backend
  ports: [{name: grpc, number: 9090, protocol: GRPC}]
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: scoped, namespace: demo}
spec:
  workloadSelector: {labels: {scope: narrow}}
  egress:
  - port: {number: 7070, protocol: GRPC, name: grpc}
    hosts: ["./*"]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: echo, namespace: demo}
spec:
  hosts: [echo]
  http:
  - name: from-canary
    match: [{sourceLabels: {track: canary}}]
    route: [{destination: {host: echo, port: {number: 7070}}}]
    timeout: 5s
  - route: [{destination: {host: echo, port: {number: 7070}}}]
`

// TestProxylessScope: a proxyless client sees the mesh through the Sidecar that selects it
// (egress hosts and ports), as istiod's SidecarScope, and routes whose sourceLabels its labels
// hold; clients that differ there never share cached output.
func TestProxylessScope(t *testing.T) {
	snap := snapshotOf(t, []byte(scopeInput))
	gen := newProxylessGenerator(testLogger(t))
	client := func(labels map[string]string) *model.Proxy {
		return &model.Proxy{Type: model.Proxyless, ID: "c.demo", Namespace: "demo",
			DNSDomain: "demo.svc.cluster.local", Labels: labels}
	}
	names := func(p *model.Proxy, typeURL string) []string {
		t.Helper()
		res, err := gen.Generate(snap, p, typeURL, nil)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range res {
			out = append(out, cachev3.GetResourceName(r))
		}
		return out
	}
	// routeNames lists the route names of echo's port 7070.
	routeNames := func(p *model.Proxy) []string {
		t.Helper()
		res, err := gen.Generate(snap, p, resource.RouteType, []string{"outbound|7070||echo.demo.svc.cluster.local"})
		if err != nil || len(res) != 1 {
			t.Fatalf("routes: %v, %d resources", err, len(res))
		}
		var out []string
		for _, r := range res[0].(*routev3.RouteConfiguration).GetVirtualHosts()[0].GetRoutes() {
			out = append(out, r.GetName())
		}
		return out
	}

	all, narrow := client(map[string]string{"app": "c"}), client(map[string]string{"scope": "narrow"})
	if got, want := names(all, resource.ListenerType), []string{"cart.backend.svc.cluster.local:9090",
		"echo.demo.svc.cluster.local:7070", "echo.demo.svc.cluster.local:8080"}; !slices.Equal(got, want) {
		t.Errorf("without Sidecar: listeners %v, want %v", got, want)
	}
	if got, want := names(narrow, resource.ListenerType), []string{"echo.demo.svc.cluster.local:7070"}; !slices.Equal(got, want) {
		t.Errorf("with the Sidecar: listeners %v, want %v (its namespace, its egress port)", got, want)
	}
	// For the canary client the first route matches every request: nothing follows it.
	canary := client(map[string]string{"app": "c", "track": "canary"})
	if got, want := routeNames(canary), []string{"from-canary"}; !slices.Equal(got, want) {
		t.Errorf("canary client: routes %v, want %v", got, want)
	}
	if got, want := routeNames(all), []string{""}; !slices.Equal(got, want) {
		t.Errorf("other client: routes %v, want %v", got, want)
	}
	for _, typeURL := range []string{resource.ListenerType, resource.RouteType, resource.ClusterType, resource.EndpointType} {
		if gen.CacheScope(snap, all, typeURL) == gen.CacheScope(snap, narrow, typeURL) {
			t.Errorf("%s: clients under different Sidecars share a cache scope", typeURL)
		}
		if gen.CacheScope(snap, all, typeURL) == gen.CacheScope(snap, canary, typeURL) {
			t.Errorf("%s: clients of different source labels share a cache scope", typeURL)
		}
	}
}
