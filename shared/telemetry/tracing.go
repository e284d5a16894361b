package telemetry

// Tracing: code creates spans with the global API (otel.Tracer), so it never waits for this
// wiring; without it (tracing off), spans are no-ops.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace/noop"

	"sailplane.dev/shared/component"
	"sailplane.dev/shared/version"
)

// offProvider is the global tracer provider before any is installed: tracing off.
var offProvider = otel.GetTracerProvider()

// TracesOn reports whether spans can be recorded: a tracer provider other than OpenTelemetry's
// default or a no-op one is installed (by Add, or by a test). Code that starts a trace of its
// own on a hot path checks it first: starting even a no-op span allocates.
func TracesOn() bool {
	tp := otel.GetTracerProvider()
	if _, isNoop := tp.(noop.TracerProvider); isNoop {
		return false
	}
	return tp != offProvider
}

// ErrTracing reports a tracing setting that cannot be used.
var ErrTracing = errors.New("telemetry: tracing")

// TracingFlags is every binary's --tracing-endpoint.
type TracingFlags struct {
	Endpoint string
}

// AddFlags registers --tracing-endpoint.
func (f *TracingFlags) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.Endpoint, "tracing-endpoint", "",
		"OTLP/gRPC collector (host:port, or http://host:port for plaintext) receiving traces of config changes; empty: off unless the standard OTEL_* variables turn it on (OTEL_TRACES_EXPORTER=otlp, OTEL_EXPORTER_OTLP_ENDPOINT)")
}

// tracesEnabled says whether tracing is on: the flag, else OTEL_TRACES_EXPORTER=otlp or an OTLP
// endpoint variable; OTEL_TRACES_EXPORTER=none turns the variables off (not the flag).
func (f TracingFlags) tracesEnabled() (bool, error) {
	if f.Endpoint != "" {
		return true, nil
	}
	switch exp := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")); exp {
	case "none":
		return false, nil
	case "otlp":
		return true, nil
	case "":
		return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "", nil
	default:
		return false, fmt.Errorf("%w: OTEL_TRACES_EXPORTER=%q: only otlp and none are supported", ErrTracing, exp)
	}
}

// Add installs the global tracer provider, exporting to the OTLP collector, when tracing is on,
// and adds to m a component that flushes and shuts it down when the process stops. service is
// the binary's name (service.name, unless OTEL_SERVICE_NAME sets one). The sampler is the SDK's
// default, parent-based always-on, or what OTEL_TRACES_SAMPLER says; the context of a change
// crosses processes as W3C trace context.
func (f TracingFlags) Add(m *component.Manager, log *slog.Logger, service string) error {
	on, err := f.tracesEnabled()
	if err != nil || !on {
		return err
	}
	tp, err := f.provider(context.Background(), service)
	if err != nil {
		return err
	}
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("tracing: export failed", "err", err)
	}))
	log.Info("tracing on", "endpoint", cmpOr(f.Endpoint, "from OTEL_* variables"))
	m.Add("tracing", component.Func(func(ctx context.Context) error {
		<-ctx.Done()
		// What was recorded last (the pushes of the shutdown) is worth a short wait.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := tp.Shutdown(sctx); err != nil {
			log.Warn("tracing: flushing spans at shutdown", "err", err)
		}
		return nil
	}))
	return nil
}

// provider builds the SDK provider: a batching OTLP/gRPC exporter (whose queue bounds what waits
// to be exported; beyond it spans are dropped, never held) and the process's resource.
func (f TracingFlags) provider(ctx context.Context, service string) (*sdktrace.TracerProvider, error) {
	var opts []otlptracegrpc.Option
	if f.Endpoint != "" {
		endpoint := f.Endpoint
		if rest, ok := strings.CutPrefix(endpoint, "http://"); ok {
			endpoint = rest
			opts = append(opts, otlptracegrpc.WithInsecure())
		} else if rest, ok := strings.CutPrefix(endpoint, "https://"); ok {
			endpoint = rest
		}
		opts = append(opts, otlptracegrpc.WithEndpoint(endpoint))
	}
	exp, err := otlptracegrpc.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: OTLP exporter: %w", ErrTracing, err)
	}
	res, err := Resource(service)
	if err != nil {
		return nil, err
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}

// Resource describes the process: service.name (the binary's, unless OTEL_SERVICE_NAME), its
// version, and OTEL_RESOURCE_ATTRIBUTES.
func Resource(service string) (*resource.Resource, error) {
	res, err := resource.New(context.Background(),
		resource.WithAttributes(semconv.ServiceName(service), semconv.ServiceVersion(version.Get().Version)),
		resource.WithFromEnv(), resource.WithHost(), resource.WithProcessPID())
	if err != nil && res == nil {
		return nil, fmt.Errorf("%w: resource: %w", ErrTracing, err)
	}
	return res, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
