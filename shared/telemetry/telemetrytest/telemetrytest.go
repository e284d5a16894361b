// Package telemetrytest gives a test its own metrics pipeline (never the global one) and reads
// what it exports, as Prometheus would: through the /metrics handler, parsed from the text
// exposition format.
package telemetrytest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.opentelemetry.io/otel/metric"

	"sailplane.dev/shared/telemetry"
	"sailplane.dev/shared/testwait"
)

// Metrics is one test's pipeline, shut down when the test ends.
type Metrics struct {
	*telemetry.Metrics
	t testing.TB
}

// New returns a pipeline for t: pass Provider() to the component under test.
func New(t testing.TB) *Metrics {
	t.Helper()
	m, err := telemetry.NewMetrics()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Shutdown(context.WithoutCancel(t.Context())) })
	return &Metrics{Metrics: m, t: t}
}

// Provider is the pipeline's MeterProvider (for a component's Deps).
func (m *Metrics) Provider() metric.MeterProvider { return m.MeterProvider() }

// Scrape serves GET /metrics and parses the answer; a bad exposition fails the test.
func (m *Metrics) Scrape() Families {
	m.t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		m.t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body)
	}
	f, err := Parse(rec.Body)
	if err != nil {
		m.t.Fatal(err)
	}
	return f
}

// Value is Scrape().Value(name, labels...), 0 when no series matches.
func (m *Metrics) Value(name string, labels ...string) float64 {
	m.t.Helper()
	v, _ := m.Scrape().Value(name, labels...)
	return v
}

// Timeout bounds WaitValue: generous, as a loaded CI machine is slow and a wait on a condition
// costs nothing when it holds.
const Timeout = 30 * time.Second

// WaitValue waits until Value(name, labels...) is want, failing the test after Timeout.
func (m *Metrics) WaitValue(want float64, name string, labels ...string) {
	m.t.Helper()
	testwait.For(m.t, Timeout, fmt.Sprintf("%s%v = %v", name, labels, want), func() error {
		if got := m.Value(name, labels...); got != want {
			return fmt.Errorf("%v", got)
		}
		return nil
	})
}

// Families are the metric families of one scrape, by name.
type Families map[string]*dto.MetricFamily

// Parse reads the Prometheus text exposition format.
func Parse(r io.Reader) (Families, error) {
	parser := expfmt.NewTextParser(model.LegacyValidation)
	f, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse Prometheus text format: %w", err)
	}
	return f, nil
}

// Value sums the series of family name whose labels include every pair of labels (name,
// value, name, value, …): counters' and gauges' values, histograms' sample counts. ok is false
// when no series matches.
func (f Families) Value(name string, labels ...string) (v float64, ok bool) {
	family := f[name]
	if family == nil {
		return 0, false
	}
	for _, series := range family.GetMetric() {
		if !hasLabels(series, labels) {
			continue
		}
		ok = true
		switch {
		case series.Counter != nil:
			v += series.GetCounter().GetValue()
		case series.Gauge != nil:
			v += series.GetGauge().GetValue()
		case series.Histogram != nil:
			v += float64(series.GetHistogram().GetSampleCount())
		case series.Untyped != nil:
			v += series.GetUntyped().GetValue()
		}
	}
	return v, ok
}

// Sum is the sum of the observations of histogram name's series matching labels (as Value).
func (f Families) Sum(name string, labels ...string) float64 {
	var sum float64
	for _, series := range f[name].GetMetric() {
		if hasLabels(series, labels) {
			sum += series.GetHistogram().GetSampleSum()
		}
	}
	return sum
}

func hasLabels(series *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, l := range series.GetLabel() {
			if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}
