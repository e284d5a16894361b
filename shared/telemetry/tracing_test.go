package telemetry

import (
	"context"
	"errors"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

func TestTracingEnabled(t *testing.T) {
	for _, tc := range []struct {
		name     string
		endpoint string
		env      map[string]string
		want     bool
		err      error
	}{
		{name: "off by default"},
		{name: "flag", endpoint: "http://127.0.0.1:4317", want: true},
		{name: "exporter variable", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, want: true},
		{name: "endpoint variable", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, want: true},
		{name: "traces endpoint variable", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4317"}, want: true},
		{name: "none wins over an endpoint variable", env: map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}},
		{name: "flag wins over none", endpoint: "127.0.0.1:4317", env: map[string]string{"OTEL_TRACES_EXPORTER": "none"}, want: true},
		{name: "unsupported exporter", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, err: ErrTracing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range []string{"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
				t.Setenv(k, tc.env[k])
			}
			got, err := TracingFlags{Endpoint: tc.endpoint}.tracesEnabled()
			if got != tc.want || !errors.Is(err, tc.err) {
				t.Errorf("enabled %v, err %v; want %v, %v", got, err, tc.want, tc.err)
			}
		})
	}
}

// TestTracesOn: off with OpenTelemetry's default provider and a no-op one, on with an SDK's,
// and asking allocates nothing.
func TestTracesOn(t *testing.T) {
	if TracesOn() {
		t.Fatal("on with the default provider")
	}
	if n := testing.AllocsPerRun(100, func() { TracesOn() }); n != 0 {
		t.Errorf("%v allocations per call, want 0", n)
	}
	tp := sdktrace.NewTracerProvider()
	defer func() { _ = tp.Shutdown(context.Background()) }()
	otel.SetTracerProvider(tp)
	if !TracesOn() {
		t.Error("off with an SDK provider")
	}
	otel.SetTracerProvider(noop.NewTracerProvider())
	if TracesOn() {
		t.Error("on with a no-op provider")
	}
}
