// Package telemetry builds the OpenTelemetry metrics pipeline every Sailplane binary serves on
// /metrics: an SDK MeterProvider whose Prometheus exporter writes to a registry of its own, beside
// the Go runtime and process collectors.
//
// Exposition is istiod's (istio.io/istio pkg/monitoring), so Istio's dashboards and alerts keep
// working: instrument names are exported as given, with no unit suffix and no _total added to
// counters (pilot_xds_pushes stays pilot_xds_pushes; istiod's sidecar_injection_requests_total
// carries its _total in the instrument name), and no otel_scope_* labels or target_info series.
//
// Code instruments through the OpenTelemetry API: a component takes a metric.MeterProvider in
// its Deps (tests pass their own, from telemetrytest) and falls back to the global one, which
// Global installs once per process when the monitoring port is on.
package telemetry

import (
	"context"
	"fmt"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	"go.opentelemetry.io/otel"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// Metrics is a MeterProvider exporting to its own Prometheus registry, and the handler serving
// that registry.
type Metrics struct {
	provider *sdkmetric.MeterProvider
	registry *prometheus.Registry
	handler  http.Handler
}

// NewMetrics returns a pipeline that is not installed anywhere: pass MeterProvider to what
// should report into it.
func NewMetrics() (*Metrics, error) {
	registry := prometheus.NewRegistry()
	// istiod serves the default registry, which holds these two.
	if err := registry.Register(collectors.NewGoCollector()); err != nil {
		return nil, fmt.Errorf("telemetry: register Go collector: %w", err)
	}
	if err := registry.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, fmt.Errorf("telemetry: register process collector: %w", err)
	}
	exporter, err := otelprom.New(
		otelprom.WithRegisterer(registry),
		// istiod's WithoutUnits + WithoutCounterSuffixes; underscores keep dotted names (grpc-go's
		// grpc.server.call.duration) valid for every Prometheus version.
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithoutSuffixes),
		otelprom.WithoutScopeInfo(),
		otelprom.WithoutTargetInfo(),
	)
	if err != nil {
		return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	return &Metrics{
		provider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter)),
		registry: registry,
		handler:  promhttp.HandlerFor(registry, promhttp.HandlerOpts{}),
	}, nil
}

// MeterProvider is the provider instruments report to.
func (m *Metrics) MeterProvider() metric.MeterProvider { return m.provider }

// Handler serves the registry in the Prometheus exposition format (GET /metrics).
func (m *Metrics) Handler() http.Handler { return m.handler }

// Gatherer is the registry, for reading metrics without HTTP.
func (m *Metrics) Gatherer() prometheus.Gatherer { return m.registry }

// Shutdown stops the provider; instruments then record nothing.
func (m *Metrics) Shutdown(ctx context.Context) error { return m.provider.Shutdown(ctx) }

// Global returns the process's pipeline, installed as the OpenTelemetry global MeterProvider on
// the first call: hyper links several services but serves one /metrics.
var Global = sync.OnceValues(func() (*Metrics, error) {
	m, err := NewMetrics()
	if err != nil {
		return nil, err
	}
	otel.SetMeterProvider(m.provider)
	return m, nil
})

// Meter returns provider's meter for scope (sailplane.dev/<service>), or the global provider's
// when provider is nil: a component's Deps leave it unset outside tests.
func Meter(provider metric.MeterProvider, scope string) metric.Meter {
	if provider == nil {
		provider = otel.GetMeterProvider()
	}
	return provider.Meter(scope)
}

// Handle reports an error creating an instrument (an invalid name, a clash of kinds) to
// OpenTelemetry's error handler; the instrument returned with it records nothing, and the
// component goes on.
func Handle(err error) {
	if err != nil {
		otel.Handle(err)
	}
}
