package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"sailplane.dev/e2e/framework"
)

// gammaServices are echo (the service clients call) and echo-v1/echo-v2 (its versions), from
// ServiceEntries over WorkloadEntries, as files mode has services.
func gammaServices(v1, v2 *framework.Echo) string {
	se := func(name, version string) string {
		sel := "{app: echo}"
		if version != "" {
			sel = "{app: echo, version: " + version + "}"
		}
		return fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: %s, namespace: demo}
spec:
  hosts: [%s.demo.svc.cluster.local]
  resolution: STATIC
  ports: [{name: grpc, number: 7070, protocol: GRPC}]
  workloadSelector: {labels: %s}
---
`, name, name, sel)
	}
	return se("echo", "") + se("echo-v1", "v1") + se("echo-v2", "v2") + fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: echo-v1, namespace: demo}
spec: {address: 127.0.0.1, ports: {grpc: %s}, labels: {app: echo, version: v1}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: echo-v2, namespace: demo}
spec: {address: 127.0.0.1, ports: {grpc: %s}, labels: {app: echo, version: v2}}
`, port(v1.Addr), port(v2.Addr))
}

// gammaRoute is a GAMMA HTTPRoute on the echo Service: x-canary: true to v2, the rest split
// w1/w2 between v1 and v2.
func gammaRoute(w1, w2 int) string {
	return fmt.Sprintf(`apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: echo, namespace: demo}
spec:
  parentRefs: [{group: "", kind: Service, name: echo, port: 7070}]
  rules:
  - matches: [{headers: [{name: x-canary, value: "true"}]}]
    backendRefs: [{name: echo-v2, port: 7070}]
  - backendRefs:
    - {name: echo-v1, port: 7070, weight: %d}
    - {name: echo-v2, port: 7070, weight: %d}
`, w1, w2)
}

// TestGatewayAPIGAMMA drives a real proxyless gRPC client through a GAMMA HTTPRoute (parentRef
// the echo Service) read from files, in both topologies: the weighted split, the header match, and a
// rewritten route moving the traffic.
func TestGatewayAPIGAMMA(t *testing.T) {
	for _, topo := range topologies {
		t.Run(topo.name, func(t *testing.T) {
			v1 := framework.StartEcho(t, "v1", "127.0.0.1:0")
			v2 := framework.StartEcho(t, "v2", "127.0.0.1:0")
			dir := t.TempDir()
			framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", meshYAML)
			framework.WriteFile(t, dir, "etc/sailplane/conf/echo/service.yaml", gammaServices(v1, v2))
			framework.WriteFile(t, dir, "etc/sailplane/conf/echo/route.yaml", gammaRoute(80, 20))

			xdsAddr, _ := topo.start(t, dir)
			client := framework.XDSClient(t, xdsAddr, echoTarget)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			framework.WaitServing(ctx, t, client)

			checkCanaryRouting(ctx, t, client, func() {
				framework.WriteFile(t, dir, "etc/sailplane/conf/echo/route.yaml", gammaRoute(0, 100))
			})
		})
	}
}

// gammaGRPCRoute is a GAMMA GRPCRoute on the echo Service: UnaryCall with x-canary: true to v2,
// the rest of the TestService split 70/30 between v1 and v2.
const gammaGRPCRoute = `apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: echo, namespace: demo}
spec:
  parentRefs: [{group: "", kind: Service, name: echo}]
  rules:
  - matches:
    - method: {service: grpc.testing.TestService, method: UnaryCall}
      headers: [{name: x-canary, value: "true"}]
    backendRefs: [{name: echo-v2, port: 7070}]
  - matches:
    - method: {service: grpc.testing.TestService}
    backendRefs:
    - {name: echo-v1, port: 7070, weight: 70}
    - {name: echo-v2, port: 7070, weight: 30}
`

// TestGatewayAPIGAMMAGRPCRoute drives a real proxyless gRPC client through a GAMMA GRPCRoute
// (method and header matches, a weighted split) read from files by hyper.
func TestGatewayAPIGAMMAGRPCRoute(t *testing.T) {
	v1 := framework.StartEcho(t, "v1", "127.0.0.1:0")
	v2 := framework.StartEcho(t, "v2", "127.0.0.1:0")
	dir := t.TempDir()
	framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", meshYAML)
	framework.WriteFile(t, dir, "etc/sailplane/conf/echo/service.yaml", gammaServices(v1, v2))
	framework.WriteFile(t, dir, "etc/sailplane/conf/echo/route.yaml", gammaGRPCRoute)

	xdsAddr, _ := topologies[0].start(t, dir)
	client := framework.XDSClient(t, xdsAddr, echoTarget)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	framework.WaitServing(ctx, t, client)

	t.Run("service match split 70/30", func(t *testing.T) {
		counts := countBackends(ctx, t, client, 1000)
		if counts["v1"] < 650 || counts["v1"] > 750 || counts["v1"]+counts["v2"] != 1000 {
			t.Fatalf("want v1 70±5%% of 1000 RPCs, got %v", counts)
		}
	})
	t.Run("method and header match goes to v2", func(t *testing.T) {
		counts := countBackends(ctx, t, client, 100, "x-canary", "true")
		if counts["v2"] != 100 {
			t.Fatalf("want all 100 canary RPCs on v2, got %v", counts)
		}
	})
}
