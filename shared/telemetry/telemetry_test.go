package telemetry_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.uber.org/goleak"

	"sailplane.dev/shared/telemetry"
	"sailplane.dev/shared/telemetry/telemetrytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestExpositionIsIstiods: names come out as istiod's do (no unit suffix, no _total added, none
// dropped), with no otel_scope labels and no target_info, beside Go runtime and process metrics.
func TestExpositionIsIstiods(t *testing.T) {
	m := telemetrytest.New(t)
	meter := m.Provider().Meter("sailplane.dev/test")
	pushes, _ := meter.Int64Counter("pilot_xds_pushes", metric.WithUnit("1"))
	pushes.Add(t.Context(), 2, metric.WithAttributes(attribute.String("type", "cds")))
	injected, _ := meter.Int64Counter("sidecar_injection_requests_total")
	injected.Add(t.Context(), 1)
	convergence, _ := meter.Float64Histogram("pilot_proxy_convergence_time", metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0.01, 0.1, 1, 30))
	convergence.Record(t.Context(), 0.05)
	size, _ := meter.Int64Gauge("pilot_xds_config_size_bytes", metric.WithUnit("By"))
	size.Record(t.Context(), 1234, metric.WithAttributes(attribute.String("type", "lds")))

	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	text := rec.Body.String()
	for _, want := range []string{
		"# TYPE pilot_xds_pushes counter\n",
		"pilot_xds_pushes{type=\"cds\"} 2\n",
		"sidecar_injection_requests_total 1\n",
		"# TYPE pilot_proxy_convergence_time histogram\n",
		"pilot_proxy_convergence_time_bucket{le=\"0.1\"} 1\n",
		"pilot_proxy_convergence_time_count 1\n",
		"pilot_xds_config_size_bytes{type=\"lds\"} 1234\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("exposition lacks %q:\n%s", want, text)
		}
	}
	for _, unwanted := range []string{"otel_scope", "target_info", "sidecar_injection_requests_total_total", "pilot_xds_pushes_total", "convergence_time_seconds", "pushes_ratio"} {
		if strings.Contains(text, unwanted) {
			t.Errorf("exposition has %q:\n%s", unwanted, text)
		}
	}

	families := m.Scrape()
	for _, name := range []string{"go_goroutines", "go_memstats_alloc_bytes", "process_resident_memory_bytes"} {
		if _, ok := families.Value(name); !ok {
			t.Errorf("no %s", name)
		}
	}
	if v, _ := families.Value("pilot_xds_pushes", "type", "cds"); v != 2 {
		t.Errorf("pilot_xds_pushes{type=cds} = %v, want 2", v)
	}
	if v, ok := families.Value("pilot_xds_pushes", "type", "eds"); ok || v != 0 {
		t.Errorf("pilot_xds_pushes{type=eds} = %v, %v; want none", v, ok)
	}
	n, _ := families.Value("pilot_proxy_convergence_time")
	if sum := families.Sum("pilot_proxy_convergence_time"); n != 1 || sum != 0.05 {
		t.Errorf("convergence: count %v sum %v, want 1 and 0.05", n, sum)
	}
}

// TestGlobalOncePerProcess: Global installs one pipeline as the otel global, however often it
// is asked for (hyper links several services).
func TestGlobalOncePerProcess(t *testing.T) {
	first, err := telemetry.Global()
	if err != nil {
		t.Fatal(err)
	}
	second, _ := telemetry.Global()
	if first != second {
		t.Fatal("Global built two pipelines")
	}
	if otel.GetMeterProvider() != first.MeterProvider() {
		t.Fatal("Global did not install its provider as the otel global")
	}
	counter, _ := telemetry.Meter(nil, "sailplane.dev/test").Int64Counter("sailplane_test_events")
	counter.Add(t.Context(), 1)
	rec := httptest.NewRecorder()
	first.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if !strings.Contains(rec.Body.String(), "sailplane_test_events 1\n") {
		t.Errorf("the global meter does not report to Global's handler:\n%s", rec.Body)
	}
}
