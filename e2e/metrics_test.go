package e2e

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/shared/telemetry/telemetrytest"
)

// TestMetricsEndpoint scrapes /metrics over HTTP, as Prometheus does, from hyper and from a
// config-ingest started with --monitoring-listen: both answer the Prometheus text format with
// the Go runtime's and the process's metrics and Sailplane's own, and those move when the
// config does (a change's bus lag, a broken file's problem).
func TestMetricsEndpoint(t *testing.T) {
	config := func() string {
		dir := t.TempDir()
		framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", meshYAML)
		framework.WriteFile(t, dir, "etc/sailplane/conf/echo/service.yaml", echoServiceEntry)
		framework.WriteFile(t, dir, "etc/sailplane/conf/echo/traffic.yaml", trafficYAML(80, 20))
		return dir
	}
	hyperDir, ingestDir := config(), config()
	hyper := framework.Start(t, hyperDir, framework.Binary(t, "hyper"),
		"--xds-listen", framework.FreeAddr(t), "--bus-listen", framework.FreeAddr(t), "--xds-tls-listen", framework.FreeAddr(t))
	ingest := framework.Start(t, ingestDir, framework.Binary(t, "config-ingest"),
		"--mesh-config", filepath.Join(ingestDir, "etc/sailplane/mesh.yaml"), "--bus-listen", framework.FreeAddr(t))
	processes := []*framework.Process{hyper, ingest}
	for _, p := range processes {
		framework.WaitReady(t, p)
		got := scrape(t, p)
		for _, name := range []string{"go_goroutines", "go_memstats_alloc_bytes", "go_gc_duration_seconds", "process_resident_memory_bytes"} {
			if _, ok := got.Value(name); !ok {
				t.Errorf("%s: no %s", p.Name, name)
			}
		}
		for _, kind := range []string{"VirtualService", "DestinationRule", "ServiceEntry"} {
			if n, _ := got.Value("sailplane_bus_resources", "type", kind); n != 1 {
				t.Errorf("%s: sailplane_bus_resources{type=%q} = %v, want 1", p.Name, kind, n)
			}
		}
	}
	// hyper's xds-server holds what its bus holds.
	if n, _ := scrape(t, hyper).Value("sailplane_bus_consumer_resources", "type", "VirtualService", "consumer", "xds-server"); n != 1 {
		t.Errorf("hyper: sailplane_bus_consumer_resources{type=VirtualService,consumer=xds-server} = %v, want 1", n)
	}

	// A change: its publication reaches hyper's consumers, whose answers land in the bus lag.
	lag := func() float64 {
		n, _ := scrape(t, hyper).Value("sailplane_bus_lag_seconds", "type", "VirtualService")
		return n
	}
	before := lag()
	framework.WriteFile(t, hyperDir, "etc/sailplane/conf/echo/traffic.yaml", trafficYAML(50, 50))
	framework.Eventually(t, time.Minute, func() error {
		if n := lag(); n <= before {
			return fmt.Errorf("hyper: sailplane_bus_lag_seconds{type=VirtualService} count %v, want more than %v", n, before)
		}
		return nil
	})

	// A broken file: a config problem of its kind in each.
	const broken = `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: broken, namespace: demo}
spec:
  hosts: [broken.demo.svc.cluster.local]
  http:
    - route: [{destination: {host: echo.demo.svc.cluster.local}, weight: -1}]
`
	for _, p := range processes {
		dir := map[*framework.Process]string{hyper: hyperDir, ingest: ingestDir}[p]
		framework.WriteFile(t, dir, "etc/sailplane/conf/echo/broken.yaml", broken)
		framework.Eventually(t, time.Minute, func() error {
			if n, _ := scrape(t, p).Value("sailplane_config_problems", "kind", "VirtualService", "reason", "invalid"); n != 1 {
				return fmt.Errorf("%s: sailplane_config_problems{kind=VirtualService,reason=invalid} = %v, want 1", p.Name, n)
			}
			return nil
		})
	}
}

// scrape is p's /metrics (scrapeMetrics); an error fails the test.
func scrape(t *testing.T, p *framework.Process) telemetrytest.Families {
	t.Helper()
	families, err := scrapeMetrics(t.Context(), p.Monitoring)
	if err != nil {
		t.Fatalf("%s: %v", p.Name, err)
	}
	return families
}
