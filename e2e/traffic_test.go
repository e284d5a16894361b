package e2e

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/tools/demo/echo"
)

const echoTarget = "xds:///echo.demo.svc.cluster.local:7070"

// topology starts Sailplane serving the config under workdir/etc/sailplane and returns the
// address of its xDS server and the process that reads the config files.
type topology struct {
	name  string
	start func(t *testing.T, workdir string) (xdsAddr string, ingest *framework.Process)
}

var topologies = []topology{
	{"hyper", func(t *testing.T, dir string) (string, *framework.Process) {
		xds := framework.FreeAddr(t)
		hyper := framework.Start(t, dir, framework.Binary(t, "hyper"),
			"--xds-listen", xds, "--bus-listen", framework.FreeAddr(t), "--xds-tls-listen", framework.FreeAddr(t))
		return xds, hyper
	}},
	{"microservices", func(t *testing.T, dir string) (string, *framework.Process) {
		mesh := filepath.Join(dir, "etc/sailplane/mesh.yaml")
		configBus, registryBus, xds := framework.FreeAddr(t), framework.FreeAddr(t), framework.FreeAddr(t)
		// Started in reverse dependency order on purpose: consumers must retry until their peers are up.
		xdsServer := framework.Start(t, dir, framework.Binary(t, "xds-server"),
			"--config-bus", configBus, "--registry-bus", registryBus, "--xds-listen", xds)
		framework.Start(t, dir, framework.Binary(t, "endpoint-watcher"),
			"--config-bus", configBus, "--bus-listen", registryBus)
		framework.Eventually(t, 30*time.Second, func() error {
			if !strings.Contains(xdsServer.Log(), "retrying") {
				return fmt.Errorf("xds-server has not reported retrying its unreachable config bus")
			}
			return nil
		})
		ingest := framework.Start(t, dir, framework.Binary(t, "config-ingest"),
			"--mesh-config", mesh, "--bus-listen", configBus)
		return xds, ingest
	}},
}

const meshYAML = `configSources:
  - address: fs://conf
`

// echoServiceEntry is the echo service; WorkloadEntries labelled app: echo are its endpoints.
const echoServiceEntry = `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: echo, namespace: demo}
spec:
  hosts: [echo.demo.svc.cluster.local]
  resolution: STATIC
  ports: [{name: grpc, number: 7070, protocol: GRPC}]
  workloadSelector: {labels: {app: echo}}
---
`

func serviceYAML(v1, v2 *framework.Echo) string {
	return echoServiceEntry + fmt.Sprintf(`apiVersion: networking.istio.io/v1beta1
kind: WorkloadEntry
metadata: {name: echo-v1, namespace: demo}
spec: {address: 127.0.0.1, ports: {grpc: %s}, labels: {app: echo, version: v1}}
---
apiVersion: networking.istio.io/v1alpha3
kind: WorkloadEntry
metadata: {name: echo-v2, namespace: demo}
spec: {address: 127.0.0.1, ports: {grpc: %s}, labels: {app: echo, version: v2}}
`, port(v1.Addr), port(v2.Addr))
}

func trafficYAML(w1, w2 int) string {
	return fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: echo, namespace: demo}
spec:
  host: echo.demo.svc.cluster.local
  subsets:
    - {name: v1, labels: {version: v1}}
    - {name: v2, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: echo, namespace: demo}
spec:
  hosts: [echo.demo.svc.cluster.local]
  http:
    - match: [{headers: {x-canary: {exact: "true"}}}]
      route: [{destination: {host: echo.demo.svc.cluster.local, subset: v2}}]
    - route:
        - {destination: {host: echo.demo.svc.cluster.local, subset: v1}, weight: %d}
        - {destination: {host: echo.demo.svc.cluster.local, subset: v2}, weight: %d}
`, w1, w2)
}

// TestTrafficManagement drives a real gRPC xDS client through Sailplane in both topologies:
// weighted split, a live config change, and a header-matched route.
func TestTrafficManagement(t *testing.T) {
	for _, topo := range topologies {
		t.Run(topo.name, func(t *testing.T) {
			v1 := framework.StartEcho(t, "v1", "127.0.0.1:0")
			v2 := framework.StartEcho(t, "v2", "127.0.0.1:0")
			dir := t.TempDir()
			framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", meshYAML)
			framework.WriteFile(t, dir, "etc/sailplane/conf/echo/service.yaml", serviceYAML(v1, v2))
			framework.WriteFile(t, dir, "etc/sailplane/conf/echo/traffic.yaml", trafficYAML(80, 20))

			xdsAddr, ingest := topo.start(t, dir)
			client := framework.XDSClient(t, xdsAddr, echoTarget)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			framework.WaitServing(ctx, t, client)

			checkCanaryRouting(ctx, t, client, func() {
				framework.WriteFile(t, dir, "etc/sailplane/conf/echo/traffic.yaml", trafficYAML(0, 100))
			})
			t.Run("broken file keeps what was served", func(t *testing.T) {
				framework.WriteFile(t, dir, "etc/sailplane/conf/echo/traffic.yaml", "kind: VirtualService\nspec: [unclosed\n")
				framework.Eventually(t, 30*time.Second, func() error {
					for _, line := range strings.Split(ingest.Log(), "\n") {
						if strings.Contains(line, "traffic.yaml") && (strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR")) {
							return nil
						}
					}
					return fmt.Errorf("the broken file is not reported in the log")
				})
				if counts := countBackends(ctx, t, client, 200); counts["v2"] != 200 {
					t.Fatalf("after a broken file, want the last good config (all on v2), got %v", counts)
				}
			})
		})
	}
}

// checkCanaryRouting checks what the canary config of a traffic test (header x-canary: true to
// v2, the rest 80/20 between v1 and v2) does to the client's RPCs, then that moveAll (the same
// config at 0/100) moves every RPC to v2.
func checkCanaryRouting(ctx context.Context, t *testing.T, client framework.EchoClient, moveAll func()) {
	t.Helper()
	t.Run("weighted 80/20", func(t *testing.T) {
		counts := countBackends(ctx, t, client, 1000)
		if counts["v1"] < 750 || counts["v1"] > 850 || counts["v1"]+counts["v2"] != 1000 {
			t.Fatalf("want v1 80±5%% of 1000 RPCs, got %v", counts)
		}
	})
	t.Run("header match goes to v2", func(t *testing.T) {
		counts := countBackends(ctx, t, client, 100, "x-canary", "true")
		if counts["v2"] != 100 {
			t.Fatalf("want all 100 canary RPCs on v2, got %v", counts)
		}
	})
	t.Run("rewritten config moves traffic", func(t *testing.T) {
		moveAll()
		framework.Eventually(t, 30*time.Second, func() error {
			if c := countBackends(ctx, t, client, 20); c["v1"] > 0 {
				return fmt.Errorf("still reaching v1: %v", c)
			}
			return nil
		})
		if counts := countBackends(ctx, t, client, 500); counts["v2"] != 500 {
			t.Fatalf("after 0/100, want all 500 RPCs on v2, got %v", counts)
		}
	})
}

func countBackends(ctx context.Context, t *testing.T, c framework.EchoClient, n int, headers ...string) echo.Counts {
	t.Helper()
	counts, err := echo.Count(ctx, c, n, headers...)
	if err != nil {
		t.Fatal(err)
	}
	return counts
}

func port(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}
