package agent

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"

	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/telemetry/telemetrytest"
	"sailplane.dev/shared/testwait"
)

// scrapeStats GETs path on the agent's readiness port and parses it as Prometheus would.
func scrapeStats(t *testing.T, a *runningAgent, path string) telemetrytest.Families {
	t.Helper()
	resp, err := http.Get("http://" + a.ReadinessAddr().String() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", path, resp.Status)
	}
	f, err := telemetrytest.Parse(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return f
}

// waitStat waits until the scraped value of name (labels as telemetrytest's Value) passes ok.
func waitStat(t *testing.T, a *runningAgent, what string, ok func(float64) bool, name string, labels ...string) float64 {
	t.Helper()
	var v float64
	testwait.For(t, telemetrytest.Timeout, what, func() error {
		v, _ = scrapeStats(t, a, StatsPath).Value(name, labels...)
		if !ok(v) {
			return fmt.Errorf("%s%v = %v", name, labels, v)
		}
		return nil
	})
	return v
}

func atLeast(n float64) func(float64) bool { return func(v float64) bool { return v >= n } }

// TestMetrics: each of the agent's metrics, named as pilot-agent's, moves on a real event (a
// ca down then up, a certificate, an ADS stream through the proxy) as scraped from
// /stats/prometheus on the readiness port, where Envoy's stats are merged in while Envoy's admin
// port answers.
func TestMetrics(t *testing.T) {
	c, cfg := provisionedAgent(t)
	up := startXDSServer(t, nil, false)
	cfg.XDSAddress = up.addr
	envoyAdmin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != StatsPath {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte("# TYPE envoy_server_live gauge\nenvoy_server_live{} 1\n"))
	}))
	defer envoyAdmin.Close()
	cfg.EnvoyAdmin = envoyAdmin.Listener.Addr().String()
	c.stop()

	a := startAgent(t, cfg)
	eventually(t, "the readiness port", func() bool { return a.ReadinessAddr() != nil })
	csr := []string{"request_type", "csr"}
	failed := waitStat(t, a, "failed CSRs while the ca is down", atLeast(2), "istio_agent_num_failed_outgoing_requests", csr...)
	stats := scrapeStats(t, a, StatsPath)
	if v, _ := stats.Value("istio_agent_num_outgoing_retries", csr...); v < failed-1 {
		t.Errorf("istio_agent_num_outgoing_retries = %v after %v failed requests, want at least %v", v, failed, failed-1)
	}
	if _, ok := stats.Value("istio_agent_cert_expiry_seconds"); ok {
		t.Error("istio_agent_cert_expiry_seconds reported without a certificate")
	}
	if _, ok := stats.Value("istio_agent_startup_duration_seconds"); ok {
		t.Error("istio_agent_startup_duration_seconds reported before ready")
	}

	c.restart(t)
	cert := waitReady(t, a)
	stats = scrapeStats(t, a, StatsPath)
	requests, _ := stats.Value("istio_agent_num_outgoing_requests", csr...)
	failed, _ = stats.Value("istio_agent_num_failed_outgoing_requests", csr...)
	if requests != failed+1 {
		t.Errorf("%v CSRs sent, %v failed, want one more sent (the answered one)", requests, failed)
	}
	if v, _ := stats.Value("istio_agent_outgoing_latency", csr...); v <= 0 {
		t.Errorf("istio_agent_outgoing_latency = %v ms, want > 0", v)
	}
	left := time.Until(cert.Leaf().NotAfter).Seconds()
	if v, ok := stats.Value("istio_agent_cert_expiry_seconds", "resource_name", "default"); !ok || v <= 0 || v > left+1 {
		t.Errorf("istio_agent_cert_expiry_seconds{resource_name=default} = %v (reported: %v), want in (0, %.0f]", v, ok, left)
	}
	if v, ok := stats.Value("istio_agent_startup_duration_seconds"); !ok || v <= 0 {
		t.Errorf("istio_agent_startup_duration_seconds = %v (reported: %v), want > 0", v, ok)
	}
	if _, ok := stats.Value("istio_agent_go_goroutines"); !ok {
		t.Error("no istio_agent_go_goroutines: the Go runtime metrics are not prefixed as pilot-agent's")
	}

	// An ADS request and its response through the xDS proxy.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sotw, err := discoveryv3.NewAggregatedDiscoveryServiceClient(dialSDS(t, cfg.XDSProxySocket)).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := sotw.Send(&discoveryv3.DiscoveryRequest{Node: envoyNode, TypeUrl: schema.VirtualService.TypeURL}); err != nil {
		t.Fatal(err)
	}
	if _, err := sotw.Recv(); err != nil {
		t.Fatal(err)
	}
	waitStat(t, a, "the ADS request counted", atLeast(1), "istio_agent_xds_proxy_requests")
	waitStat(t, a, "the ADS response counted", atLeast(1), "istio_agent_xds_proxy_responses")
	waitStat(t, a, "the proxied stream in grpc-go's metrics", atLeast(1), "istio_agent_grpc_server_call_started",
		"grpc_method", "envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources")

	// Envoy's stats are merged in, /metrics serves the same, and an Envoy that does not answer
	// is counted and left out.
	for _, path := range []string{StatsPath, MetricsPath} {
		stats := scrapeStats(t, a, path)
		if v, ok := stats.Value("envoy_server_live"); !ok || v != 1 {
			t.Errorf("%s: envoy_server_live = %v (reported: %v), want Envoy's 1", path, v, ok)
		}
		if _, ok := stats.Value("istio_agent_cert_expiry_seconds"); !ok {
			t.Errorf("%s: no istio_agent_cert_expiry_seconds", path)
		}
	}
	envoyAdmin.Close()
	stats = scrapeStats(t, a, StatsPath)
	if _, ok := stats.Value("envoy_server_live"); ok {
		t.Error("envoy_server_live served with Envoy's admin port closed")
	}
	if v, _ := stats.Value("istio_agent_scrape_failures_total", "type", "envoy"); v != 1 {
		t.Errorf("istio_agent_scrape_failures_total{type=envoy} = %v, want 1", v)
	}
	if v, _ := stats.Value("istio_agent_scrapes_total"); v < 3 {
		t.Errorf("istio_agent_scrapes_total = %v, want every scrape counted", v)
	}
}
