package agent

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/protobuf/proto"

	"sailplane.dev/shared/telemetry"
)

// Istio's agent paths for Prometheus on the readiness port (15020): pilot-agent's
// prometheus.io annotations point scrapers at StatsPath.
const (
	StatsPath   = "/stats/prometheus"
	MetricsPath = "/metrics"
)

// metricPrefix is what pilot-agent puts before every metric of its own registry, Go runtime
// and process ones included (istio_agent_go_goroutines), so Istio's dashboards find them.
const metricPrefix = "istio_agent_"

// processStart is when the process started, for startup_duration_seconds (as pilot-agent).
var processStart = time.Now()

// agentMetrics are pilot-agent's metrics (pkg/istio-agent/metrics, security/pkg/nodeagent),
// named without the prefix the handler adds.
type agentMetrics struct {
	startup          metric.Float64Gauge
	csrRequests      metric.Int64Counter
	csrFailures      metric.Int64Counter
	csrRetries       metric.Int64Counter
	csrLatency       metric.Float64Counter
	xdsRequests      metric.Int64Counter
	xdsResponses     metric.Int64Counter
	dnsRequests      metric.Int64Counter
	dnsUpstream      metric.Int64Counter
	dnsFailures      metric.Int64Counter
	dnsDuration      metric.Float64Histogram
	scrapes          metric.Int64Counter
	scrapeFailures   metric.Int64Counter
	csrType          metric.MeasurementOption
	envoyScrape      metric.MeasurementOption
	workloadResource attribute.Set
}

func newAgentMetrics(a *Agent, provider metric.MeterProvider) *agentMetrics {
	meter := telemetry.Meter(provider, "sailplane.dev/agent")
	m := &agentMetrics{
		csrType:          metric.WithAttributes(attribute.String("request_type", "csr")),
		envoyScrape:      metric.WithAttributes(attribute.String("type", "envoy")),
		workloadResource: attribute.NewSet(attribute.String("resource_name", WorkloadSecret)),
	}
	counter := func(name, description string) metric.Int64Counter {
		c, err := meter.Int64Counter(name, metric.WithDescription(description))
		telemetry.Handle(err)
		return c
	}
	m.csrRequests = counter("num_outgoing_requests", "Number of total outgoing requests (e.g. to a token exchange server, CA, etc.)")
	m.csrFailures = counter("num_failed_outgoing_requests", "Number of failed outgoing requests (e.g. to a token exchange server, CA, etc.)")
	m.csrRetries = counter("num_outgoing_retries", "Number of outgoing retry requests (e.g. to a token exchange server, CA, etc.)")
	m.xdsRequests = counter("xds_proxy_requests", "The total number of Xds Proxy Requests")
	m.xdsResponses = counter("xds_proxy_responses", "The total number of Xds Proxy Responses")
	m.scrapes = counter("scrapes_total", "The total number of scrapes.")
	m.dnsRequests = counter("dns_requests_total", "Total number of DNS requests.")
	m.dnsUpstream = counter("dns_upstream_requests_total", "Total number of DNS requests forwarded to upstream.")
	m.dnsFailures = counter("dns_upstream_failures_total", "Total number of DNS failures.")
	m.scrapeFailures = counter("scrape_failures_total", "The total number of failed scrapes.")
	var err error
	m.dnsDuration, err = meter.Float64Histogram("dns_upstream_request_duration_seconds",
		metric.WithDescription("Total time in seconds Istio takes to get DNS response from upstream."), metric.WithUnit("s"))
	telemetry.Handle(err)
	m.startup, err = meter.Float64Gauge("startup_duration_seconds",
		metric.WithDescription("The time from the process starting to being marked ready."))
	telemetry.Handle(err)
	// A sum of milliseconds, as pilot-agent's: divided by num_outgoing_requests it is the mean.
	m.csrLatency, err = meter.Float64Counter("outgoing_latency",
		metric.WithDescription("The latency of outgoing requests (e.g. to a token exchange server, CA, etc.) in milliseconds."))
	telemetry.Handle(err)
	_, err = meter.Float64ObservableGauge("cert_expiry_seconds",
		metric.WithDescription("The time remaining, in seconds, before the certificate chain will expire. A negative value indicates the cert is expired."),
		metric.WithFloat64Callback(func(_ context.Context, o metric.Float64Observer) error {
			if c := a.Current(); c != nil {
				o.Observe(time.Until(c.Leaf().NotAfter).Seconds(), metric.WithAttributeSet(m.workloadResource))
			}
			return nil
		}))
	telemetry.Handle(err)
	return m
}

// certRequested records one certificate request to the ca (pilot-agent's CSR metrics); retry is
// a request made because the one before failed.
func (m *agentMetrics) certRequested(took time.Duration, retry bool, err error) {
	ctx := context.Background()
	m.csrRequests.Add(ctx, 1, m.csrType)
	m.csrLatency.Add(ctx, float64(took)/float64(time.Millisecond), m.csrType)
	if retry {
		m.csrRetries.Add(ctx, 1, m.csrType)
	}
	if err != nil {
		m.csrFailures.Add(ctx, 1, m.csrType)
	}
}

// statsHandler serves the agent's metrics, prefixed as pilot-agent's, in the Prometheus text
// format, followed by Envoy's own (from envoyStats, when set) as pilot-agent merges them; an
// Envoy that does not answer is counted and left out.
func (a *Agent) statsHandler(gatherer prometheus.Gatherer, envoyStats string) http.Handler {
	client := &http.Client{Timeout: 5 * time.Second}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.metrics.scrapes.Add(r.Context(), 1)
		var envoy []byte
		if envoyStats != "" {
			var err error
			if envoy, err = scrape(r.Context(), client, envoyStats); err != nil {
				a.metrics.scrapeFailures.Add(r.Context(), 1, a.metrics.envoyScrape)
				a.log.Debug("Envoy's stats left out", "url", envoyStats, "error", err)
			}
		}
		families, err := gatherer.Gather()
		if err != nil {
			http.Error(w, fmt.Sprintf("agent metrics: %v", err), http.StatusInternalServerError)
			return
		}
		format := expfmt.NewFormat(expfmt.TypeTextPlain)
		w.Header().Set("Content-Type", string(format))
		enc := expfmt.NewEncoder(w, format)
		for _, f := range families { // Gather builds them afresh: renaming in place is safe
			f.Name = proto.String(metricPrefix + f.GetName())
			if err := enc.Encode(f); err != nil {
				return // the scraper went away
			}
		}
		_, _ = w.Write(envoy)
	})
}

// scrape GETs Envoy's stats in the Prometheus text format.
func scrape(ctx context.Context, client *http.Client, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %s", resp.Status)
	}
	var buf bytes.Buffer
	// 10 MiB, pilot-agent's cap on a scraped body, keeps a runaway Envoy from growing the agent.
	n, err := io.Copy(&buf, io.LimitReader(resp.Body, 10<<20+1))
	if err != nil {
		return nil, err
	}
	if n > 10<<20 {
		return nil, fmt.Errorf("more than 10 MiB")
	}
	if buf.Len() > 0 && buf.Bytes()[buf.Len()-1] != '\n' {
		buf.WriteByte('\n')
	}
	return buf.Bytes(), nil
}

// Query and Forwarded make the metrics the DNS proxy's observer (pilot-agent's DNS metrics).
func (m *agentMetrics) Query() { m.dnsRequests.Add(context.Background(), 1) }

func (m *agentMetrics) Forwarded(d time.Duration, failed bool) {
	m.dnsUpstream.Add(context.Background(), 1)
	m.dnsDuration.Record(context.Background(), d.Seconds())
	if failed {
		m.dnsFailures.Add(context.Background(), 1)
	}
}
