package xdsserver

import (
	"slices"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resource "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"sailplane.dev/services/xds-server/internal/fakebus"
	"sailplane.dev/shared/schema"
)

const gatewayAPIInput = `
apiVersion: sailplane.dev/v1
kind: Service
spec:
  hostname: httpbin.default.svc.cluster.local
  namespace: default
  ports: [{name: http, number: 80, protocol: HTTP}]
---
apiVersion: sailplane.dev/v1
kind: Service
spec:
  hostname: echo.default.svc.cluster.local
  namespace: default
  ports: [{name: http, number: 80, protocol: HTTP}]
---
apiVersion: sailplane.dev/v1
kind: Service
spec:
  hostname: echo-v1.default.svc.cluster.local
  namespace: default
  ports: [{name: http, number: 80, protocol: HTTP}]
---
apiVersion: sailplane.dev/v1
kind: Service
spec:
  hostname: echo-v2.default.svc.cluster.local
  namespace: default
  ports: [{name: http, number: 80, protocol: HTTP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: istio-system}
spec:
  gatewayClassName: istio
  listeners:
  - {name: http, port: 80, protocol: HTTP, hostname: "*.example.com", allowedRoutes: {namespaces: {from: All}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web, namespace: default}
spec:
  parentRefs: [{name: gw, namespace: istio-system}]
  hostnames: [web.example.com]
  rules:
  - matches: [{path: {type: PathPrefix, value: /get}}]
    backendRefs: [{name: httpbin, port: 80}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: echo-split, namespace: default}
spec:
  parentRefs: [{group: "", kind: Service, name: echo}]
  rules:
  - matches: [{headers: [{name: x-version, value: v2}]}]
    backendRefs: [{name: echo-v2, port: 80}]
  - backendRefs: [{name: echo-v1, port: 80, weight: 80}, {name: echo-v2, port: 80, weight: 20}]
`

// rdsStream asks for route configurations and returns a function waiting for one that
// satisfies ok, ACKing every response.
func rdsStream(t *testing.T, srv *Server, node *corev3.Node, names ...string) func(what string, ok func(*routev3.RouteConfiguration) bool) {
	t.Helper()
	stream, err := adsClient(t, srv.Addr()).DeltaAggregatedResources(streamContext(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discoverygrpc.DeltaDiscoveryRequest{Node: node, TypeUrl: resource.RouteType,
		ResourceNamesSubscribe: names}); err != nil {
		t.Fatal(err)
	}
	return func(what string, ok func(*routev3.RouteConfiguration) bool) {
		t.Helper()
		for {
			resp, err := stream.Recv()
			if err != nil {
				t.Fatalf("waiting for %s: %v", what, err)
			}
			if err := stream.Send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}); err != nil {
				t.Fatal(err)
			}
			for _, r := range resp.GetResources() {
				rc := &routev3.RouteConfiguration{}
				if r.GetResource() == nil || r.GetResource().UnmarshalTo(rc) != nil {
					continue
				}
				if ok(rc) {
					return
				}
			}
		}
	}
}

func virtualHost(rc *routev3.RouteConfiguration, domain string) *routev3.VirtualHost {
	for _, vh := range rc.GetVirtualHosts() {
		if slices.Contains(vh.GetDomains(), domain) {
			return vh
		}
	}
	return nil
}

// An HTTPRoute on a Gateway reaches the gateway proxy's RDS; an edit of it is pushed.
func TestGatewayAPIGatewayRoutes(t *testing.T) {
	src := fakebus.New(changes(t, gatewayAPIInput)...)
	srv := startServer(t, src)
	md, _ := structpb.NewStruct(map[string]any{"NAMESPACE": "istio-system",
		"LABELS": map[string]any{"gateway.networking.k8s.io/gateway-name": "gw"}})
	wait := rdsStream(t, srv, &corev3.Node{Id: "router~10.0.0.5~gw-istio-1.istio-system~istio-system.svc.cluster.local",
		Metadata: md}, "http.80")
	routesTo := func(path, cluster string) func(*routev3.RouteConfiguration) bool {
		return func(rc *routev3.RouteConfiguration) bool {
			vh := virtualHost(rc, "web.example.com")
			return vh != nil && slices.ContainsFunc(vh.GetRoutes(), func(r *routev3.Route) bool {
				return (r.GetMatch().GetPathSeparatedPrefix() == path || r.GetMatch().GetPrefix() == path) &&
					r.GetRoute().GetCluster() == cluster
			})
		}
	}
	wait("web.example.com /get to httpbin", routesTo("/get", "outbound|80||httpbin.default.svc.cluster.local"))

	edited := strings.Replace(gatewayAPIInput, "value: /get}", "value: /edited}", 1)
	for _, c := range changes(t, edited) {
		if c.TypeURL == schema.HTTPRoute.TypeURL {
			src.Push(c)
		}
	}
	wait("the edited route", routesTo("/edited", "outbound|80||httpbin.default.svc.cluster.local"))
}

// A GAMMA HTTPRoute (parentRef a Service) reaches a sidecar's outbound RDS for that service:
// the header match first, then the weighted split.
func TestGatewayAPIMeshRoutes(t *testing.T) {
	src := fakebus.New(changes(t, gatewayAPIInput)...)
	srv := startServer(t, src)
	md, _ := structpb.NewStruct(map[string]any{"NAMESPACE": "default"})
	wait := rdsStream(t, srv, &corev3.Node{Id: "sidecar~10.0.0.6~client-1.default~default.svc.cluster.local", Metadata: md}, "80")
	wait("echo's GAMMA routes", func(rc *routev3.RouteConfiguration) bool {
		vh := virtualHost(rc, "echo.default.svc.cluster.local")
		if vh == nil || len(vh.GetRoutes()) < 2 {
			return false
		}
		first, second := vh.GetRoutes()[0], vh.GetRoutes()[1]
		hm := first.GetMatch().GetHeaders()
		if len(hm) != 1 || hm[0].GetName() != "x-version" || first.GetRoute().GetCluster() != "outbound|80||echo-v2.default.svc.cluster.local" {
			return false
		}
		wc := second.GetRoute().GetWeightedClusters().GetClusters()
		return len(wc) == 2 && wc[0].GetName() == "outbound|80||echo-v1.default.svc.cluster.local" && wc[0].GetWeight().GetValue() == 80 &&
			wc[1].GetName() == "outbound|80||echo-v2.default.svc.cluster.local" && wc[1].GetWeight().GetValue() == 20
	})
}

// Routes of the Gateway gw that exercise the Gateway API's own semantics.
const gatewayAPISemanticsInput = `
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: refused, namespace: default}
spec:
  parentRefs: [{name: gw, namespace: istio-system}]
  hostnames: [refused.example.com]
  rules:
  - backendRefs: [{name: httpbin, namespace: other, port: 80}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: strip, namespace: default}
spec:
  parentRefs: [{name: gw, namespace: istio-system}]
  hostnames: [strip.example.com]
  rules:
  - matches: [{path: {type: PathPrefix, value: /old/}}]
    filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /}}}]
    backendRefs: [{name: httpbin, port: 80}]
`

// Config translated from the Gateway API is served as istiod serves it: a PathPrefix matches
// whole segments, a missing cluster answers 500, a backend no ReferenceGrant allows keeps its
// route on UnknownService (so it fails rather than 404), and ReplacePrefixMatch "/" strips the
// prefix and its separator.
func TestGatewayAPIRouteSemantics(t *testing.T) {
	src := fakebus.New(changes(t, gatewayAPIInput+gatewayAPISemanticsInput)...)
	srv := startServer(t, src)
	md, _ := structpb.NewStruct(map[string]any{"NAMESPACE": "istio-system",
		"LABELS": map[string]any{"gateway.networking.k8s.io/gateway-name": "gw"}})
	wait := rdsStream(t, srv, &corev3.Node{Id: "router~10.0.0.5~gw-istio-1.istio-system~istio-system.svc.cluster.local",
		Metadata: md}, "http.80")
	first := func(rc *routev3.RouteConfiguration, domain string) *routev3.Route {
		if vh := virtualHost(rc, domain); vh != nil && len(vh.GetRoutes()) > 0 {
			return vh.GetRoutes()[0]
		}
		return nil
	}
	wait("the Gateway API's semantics", func(rc *routev3.RouteConfiguration) bool {
		web, refused, strip := first(rc, "web.example.com"), first(rc, "refused.example.com"), first(rc, "strip.example.com")
		if web == nil || refused == nil || strip == nil {
			return false
		}
		const code = routev3.RouteAction_INTERNAL_SERVER_ERROR
		rw := strip.GetRoute().GetRegexRewrite()
		return web.GetMatch().GetPathSeparatedPrefix() == "/get" && web.GetRoute().GetClusterNotFoundResponseCode() == code &&
			refused.GetRoute().GetCluster() == "UnknownService" && refused.GetRoute().GetClusterNotFoundResponseCode() == code &&
			strip.GetMatch().GetPathSeparatedPrefix() == "/old" && strip.GetRoute().GetPrefixRewrite() == "" &&
			rw.GetPattern().GetRegex() == `^/old(/?)(.*)` && rw.GetSubstitution() == `/\2`
	})
}
