package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	resource "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/tools/testenv"
)

// TestKubeGatewayAPINamespaceSelector: a Gateway listener admitting routes by namespace label
// (allowedRoutes from: Selector) serves, to the gateway's router node, the route of a namespace
// while it carries the label, and stops when the label is removed, in both topologies: the
// labels travel from config-ingest to the xds-server on the bus.
func TestKubeGatewayAPINamespaceSelector(t *testing.T) {
	for _, topo := range kubeTopologies {
		t.Run(topo.name, func(t *testing.T) { testKubeGatewayAPINamespaceSelector(t, topo.start) })
	}
}

const selectorGateway = `apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: istio}
spec: {controllerName: istio.io/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: istio-system}
spec:
  gatewayClassName: istio
  listeners:
  - name: http
    port: 80
    protocol: HTTP
    allowedRoutes: {namespaces: {from: Selector, selector: {matchLabels: {team: web}}}}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: web}
spec: {ports: [{name: http, port: 80}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web, namespace: web}
spec:
  parentRefs: [{name: gw, namespace: istio-system}]
  hostnames: [web.example.com]
  rules: [{backendRefs: [{name: web, port: 80}]}]
`

func webNamespace(labels string) string {
	return "apiVersion: v1\nkind: Namespace\nmetadata: {name: web, labels: {" + labels + "}}\n"
}

func testKubeGatewayAPINamespaceSelector(t *testing.T, start func(*testing.T, *testenv.Kube, *framework.Kube) sailplaneOnKube) {
	k := testenv.KubeForTest(t, testenv.WithGatewayAPICRDs())
	kube := framework.NewKube(t, k.RestConfig())
	kube.EnsureNamespace(t, "istio-system")
	kube.Apply(t, webNamespace("team: web"))
	kube.Apply(t, selectorGateway)
	sp := start(t, k, kube)

	// The router node of the gateway's pods, as the deployment controller labels them.
	node := framework.XDSNode{
		ID: "router~198.18.0.10~gw-istio-0.istio-system~istio-system.svc.cluster.local",
		Metadata: map[string]any{"NAMESPACE": "istio-system", "CLUSTER_ID": "Kubernetes",
			"LABELS": map[string]any{"gateway.networking.k8s.io/gateway-name": "gw"}},
	}
	served := func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		snap, err := framework.FetchXDS(ctx, sp.xds, node, 500*time.Millisecond)
		if err != nil {
			return false, err
		}
		for _, a := range snap[resource.RouteType] {
			var rc routev3.RouteConfiguration
			if err := a.UnmarshalTo(&rc); err != nil {
				return false, err
			}
			for _, vh := range rc.GetVirtualHosts() {
				if slices.Contains(vh.GetDomains(), "web.example.com") {
					return true, nil
				}
			}
		}
		return false, nil
	}
	want := func(what string, attached bool) {
		t.Helper()
		framework.Eventually(t, time.Minute, func() error {
			got, err := served()
			if err != nil {
				return err
			}
			if got != attached {
				return fmt.Errorf("web.example.com served: %v, want %v", got, attached)
			}
			return nil
		})
		t.Log(what)
	}
	want("the route of the labelled namespace is served", true)
	kube.Apply(t, webNamespace(""))
	want("the route is no longer served once the label is removed", false)
	kube.Apply(t, webNamespace("team: web"))
	want("the route is served again with the label back", true)
}
