package e2e

import (
	"context"
	"fmt"
	"mime"
	"net/http"
	"testing"
	"time"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/shared/telemetry/telemetrytest"
)

// scrapeMetrics reads a process's /metrics, as Prometheus does: the text exposition format,
// parsed with prometheus/common/expfmt.
func scrapeMetrics(ctx context.Context, addr string) (telemetrytest.Families, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	if mt, params, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/plain" || params["version"] != "0.0.4" {
		return nil, fmt.Errorf("GET /metrics: Content-Type %q, want the Prometheus text format 0.0.4", resp.Header.Get("Content-Type"))
	}
	return telemetrytest.Parse(resp.Body)
}

// TestConvergenceMetric: a config file's change moves hyper's pilot_proxy_convergence_time, as
// Prometheus scrapes it from the monitoring port, once the connected gRPC client got it.
func TestConvergenceMetric(t *testing.T) {
	v1 := framework.StartEcho(t, "v1", "127.0.0.1:0")
	v2 := framework.StartEcho(t, "v2", "127.0.0.1:0")
	dir := t.TempDir()
	framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", meshYAML)
	framework.WriteFile(t, dir, "etc/sailplane/conf/echo/service.yaml", serviceYAML(v1, v2))
	framework.WriteFile(t, dir, "etc/sailplane/conf/echo/traffic.yaml", trafficYAML(100, 0))
	xdsAddr, hyper := topologies[0].start(t, dir)
	client := framework.XDSClient(t, xdsAddr, echoTarget)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	framework.WaitServing(ctx, t, client)

	scrape := func(name string, labels ...string) (float64, error) {
		fams, err := scrapeMetrics(ctx, hyper.Monitoring)
		if err != nil {
			return 0, err
		}
		v, _ := fams.Value(name, labels...)
		return v, nil
	}
	var converged float64
	framework.Eventually(t, time.Minute, func() error {
		// The client's xDS client connected and was pushed its config.
		if n, err := scrape("pilot_xds", "type", "proxyless"); err != nil || n != 1 {
			return fmt.Errorf("pilot_xds{type=proxyless} = %v (%v), want 1", n, err)
		}
		var err error
		converged, err = scrape("pilot_proxy_convergence_time")
		return err
	})

	framework.WriteFile(t, dir, "etc/sailplane/conf/echo/traffic.yaml", trafficYAML(0, 100))
	framework.Eventually(t, time.Minute, func() error {
		got, err := scrape("pilot_proxy_convergence_time")
		if err != nil || got <= converged {
			return fmt.Errorf("pilot_proxy_convergence_time has %v observations (%v), want more than %v", got, err, converged)
		}
		return nil
	})
	// And the change did reach the client.
	framework.Eventually(t, time.Minute, func() error {
		if got := countBackends(ctx, t, client, 10); got["v2"] != 10 {
			return fmt.Errorf("backends %v, want only v2", got)
		}
		return nil
	})
}
