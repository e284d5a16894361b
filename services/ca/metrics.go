package ca

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc/codes"

	"sailplane.dev/shared/pki"
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
	meter    metric.Meter
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
		meter:         meter,
	}
}

// observeExpiry reports, at each collection until stop is called, istiod's expiry gauges of
// the authority in use: citadel_server_root_cert_expiry_timestamp (the first root, as istiod)
// and citadel_server_cert_chain_expiry_timestamp (the signing certificate), in Unix seconds,
// what an alert on a root about to expire watches.
func (m csrMetrics) observeExpiry(authority func() *pki.Authority) (stop func()) {
	root, err := m.meter.Float64ObservableGauge("citadel_server_root_cert_expiry_timestamp",
		metric.WithDescription("The unix timestamp, in seconds, when the root cert will expire."))
	telemetry.Handle(err)
	chain, err := m.meter.Float64ObservableGauge("citadel_server_cert_chain_expiry_timestamp",
		metric.WithDescription("The unix timestamp, in seconds, when Istio generated cert chain will expire."))
	telemetry.Handle(err)
	reg, err := m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		if auth := authority(); auth != nil {
			o.ObserveFloat64(root, float64(auth.Roots[0].NotAfter.Unix()))
			o.ObserveFloat64(chain, float64(auth.Cert.NotAfter.Unix()))
		}
		return nil
	}, root, chain)
	telemetry.Handle(err)
	return func() {
		if reg != nil {
			telemetry.Handle(reg.Unregister())
		}
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
