package xdsserver

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resource "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/otlptranslator"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"sailplane.dev/services/xds-server/internal/fakebus"
)

// promMetrics is a metrics pipeline exposed as istiod's /metrics is (no unit or _total
// suffixes, no scope labels), and a scrape of it.
func promMetrics(t *testing.T) (*sdkmetric.MeterProvider, func() map[string]*dto.MetricFamily) {
	t.Helper()
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo(),
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithoutSuffixes))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	handler := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	return mp, func() map[string]*dto.MetricFamily {
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := p.TextToMetricFamilies(rec.Body)
		if err != nil {
			t.Fatal(err)
		}
		return fams
	}
}

// sampleCount is the count of a histogram family's only series, 0 when absent.
func sampleCount(fams map[string]*dto.MetricFamily, name string) uint64 {
	if f := fams[name]; f != nil && len(f.GetMetric()) == 1 {
		return f.GetMetric()[0].GetHistogram().GetSampleCount()
	}
	return 0
}

// A config change moves pilot_proxy_convergence_time and pilot_debounce_time, as Prometheus
// scrapes them, and pilot_xds counts the proxy connected.
func TestConvergenceMetric(t *testing.T) {
	mp, scrape := promMetrics(t)
	src := fakebus.New(changes(t, registry(10001, 10002))...)
	srv, err := New(Config{CacheAssert: true}, Deps{Logger: testLogger(t), Config: src, Registry: src, MeterProvider: mp})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, srv)
	waitUntil(t, func() bool {
		select {
		case <-srv.Ready():
			return true
		default:
			return false
		}
	})
	stream, err := adsClient(t, srv.Addr()).DeltaAggregatedResources(streamContext(t))
	if err != nil {
		t.Fatal(err)
	}
	recvCDS := func() {
		t.Helper()
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetTypeUrl() != resource.ClusterType {
			t.Fatalf("got %s, want clusters", resp.GetTypeUrl())
		}
		if err := stream.Send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: resp.GetNonce()}); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Send(&discoverygrpc.DeltaDiscoveryRequest{Node: testNode("metrics"), TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	recvCDS()
	before := scrape()
	if f := before["pilot_xds"]; f == nil || len(f.GetMetric()) != 1 || f.GetMetric()[0].GetGauge().GetValue() != 1 {
		t.Fatalf("pilot_xds = %v, want one proxy", f)
	}
	converged, debounced := sampleCount(before, "pilot_proxy_convergence_time"), sampleCount(before, "pilot_debounce_time")

	for _, c := range changes(t, `
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: echo, namespace: demo}
spec:
  host: echo
  subsets:
  - {name: v1, labels: {version: v1}}
`) {
		src.Push(c)
	}
	recvCDS()
	waitUntil(t, func() bool {
		after := scrape()
		return sampleCount(after, "pilot_proxy_convergence_time") > converged &&
			sampleCount(after, "pilot_debounce_time") > debounced
	})
}
