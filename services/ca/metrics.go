package ca

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc/codes"

	"sailplane.dev/shared/telemetry"
)

// csrMetrics are the ca's instruments: istiod's citadel_server_* counters, so Istio's
// dashboards read the ca as they read istiod, and Sailplane's own for what istiod lacks.
type csrMetrics struct {
	requests, authnFailures, parseErrors, signErrors, issued metric.Int64Counter
	// refused is sailplane_ca_csr_refused_total{code}: every refusal by gRPC code, the ones
	// istiod has no counter for (PermissionDenied: a CSR naming another identity) included.
	refused metric.Int64Counter
	// duration is sailplane_ca_csr_duration_seconds{code}.
	duration metric.Float64Histogram
}

func newCSRMetrics(provider metric.MeterProvider) csrMetrics {
	meter := telemetry.Meter(provider, "sailplane.dev/ca")
	counter := func(name, description string) metric.Int64Counter {
		c, err := meter.Int64Counter(name, metric.WithDescription(description))
		telemetry.Handle(err)
		return c
	}
	duration, err := meter.Float64Histogram("sailplane_ca_csr_duration_seconds",
		metric.WithDescription("Time to answer a CreateCertificate request, by gRPC code."), metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5))
	telemetry.Handle(err)
	return csrMetrics{
		requests:      counter("citadel_server_csr_count", "The number of CSRs received by Citadel server."),
		authnFailures: counter("citadel_server_authentication_failure_count", "The number of authentication failures."),
		parseErrors:   counter("citadel_server_csr_parsing_err_count", "The number of errors occurred when parsing the CSR."),
		signErrors:    counter("citadel_server_csr_sign_err_count", "The number of errors occurred when signing the CSR."),
		issued:        counter("citadel_server_success_cert_issuance_count", "The number of certificates issuances that have succeeded."),
		refused:       counter("sailplane_ca_csr_refused_total", "CreateCertificate requests refused, by gRPC code."),
		duration:      duration,
	}
}

// answered records one CreateCertificate request, answered with code after took.
func (m csrMetrics) answered(code codes.Code, took time.Duration) {
	ctx := context.Background()
	byCode := metric.WithAttributes(attribute.String("code", code.String()))
	m.requests.Add(ctx, 1)
	m.duration.Record(ctx, took.Seconds(), byCode)
	switch code {
	case codes.OK:
		m.issued.Add(ctx, 1)
		return
	case codes.Unauthenticated:
		m.authnFailures.Add(ctx, 1)
	case codes.InvalidArgument:
		m.parseErrors.Add(ctx, 1)
	case codes.Unavailable:
		// istiod's error types: the root not loaded yet is its CANotReady.
		m.signErrors.Add(ctx, 1, metric.WithAttributes(attribute.String("error", "CANotReady")))
	case codes.Internal:
		m.signErrors.Add(ctx, 1, metric.WithAttributes(attribute.String("error", "CertGenError")))
	}
	m.refused.Add(ctx, 1, byCode)
}
