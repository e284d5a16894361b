package webhook

import (
	"context"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	admissionv1 "k8s.io/api/admission/v1"

	"sailplane.dev/shared/telemetry"
)

// webhookMetrics are the webhook's instruments under istiod's names, so Istio's dashboards
// read Sailplane's injector and validator as they read istiod's.
type webhookMetrics struct {
	// Injection: every /inject request; those answered with the pod allowed (a patch or none);
	// those refused or unreadable; those that needed no sidecar; how long each took.
	injections, injected, injectFailed, injectSkipped metric.Int64Counter
	injectionTime                                     metric.Float64Histogram
	// Validation: resources judged valid, invalid (by reason), and bodies that are no
	// admission review (by HTTP status).
	validationPassed, validationFailed, validationHTTPError metric.Int64Counter
}

func newWebhookMetrics(provider metric.MeterProvider) webhookMetrics {
	meter := telemetry.Meter(provider, "sailplane.dev/webhook")
	counter := func(name, description string) metric.Int64Counter {
		c, err := meter.Int64Counter(name, metric.WithDescription(description))
		telemetry.Handle(err)
		return c
	}
	injectionTime, err := meter.Float64Histogram("sidecar_injection_time_seconds",
		metric.WithDescription("Total time taken for injection in seconds."), metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(.001, .01, .1, 1, 3, 5, 10, 20, 30, 60))
	telemetry.Handle(err)
	return webhookMetrics{
		injections:          counter("sidecar_injection_requests_total", "Total number of sidecar injection requests."),
		injected:            counter("sidecar_injection_success_total", "Total number of successful sidecar injection requests."),
		injectFailed:        counter("sidecar_injection_failure_total", "Total number of failed sidecar injection requests."),
		injectSkipped:       counter("sidecar_injection_skip_total", "Total number of skipped sidecar injection requests."),
		injectionTime:       injectionTime,
		validationPassed:    counter("galley_validation_passed", "Resource is valid"),
		validationFailed:    counter("galley_validation_failed", "Resource validation failed"),
		validationHTTPError: counter("galley_validation_http_error", "Resource validation http serve errors"),
	}
}

// injectionAnswered counts an /inject request: resp nil for a body that is no admission review.
func (m webhookMetrics) injectionAnswered(resp *admissionv1.AdmissionResponse, took time.Duration) {
	ctx := context.Background()
	m.injections.Add(ctx, 1)
	m.injectionTime.Record(ctx, took.Seconds())
	switch {
	case resp == nil || !resp.Allowed:
		m.injectFailed.Add(ctx, 1)
	case len(resp.Patch) == 0:
		// Allowed unchanged: policy, annotations or an existing sidecar say no injection.
		// istiod counts these as skipped and, their answer being sent, as successful too.
		m.injectSkipped.Add(ctx, 1)
		m.injected.Add(ctx, 1)
	default:
		m.injected.Add(ctx, 1)
	}
}

// Validation failure reasons, istiod's.
const (
	reasonUnsupportedOperation = "unsupported_operation"
	reasonYAMLDecodeError      = "yaml_decode_error"
	reasonUnknownType          = "unknown_type"
	reasonInvalidConfig        = "invalid_resource"
)

// validated counts a judged resource, as istiod does: group, version and resource of the
// request, and for a failure its reason; dry runs (the configuration patcher's readiness check)
// are not failures anyone should see.
func (m webhookMetrics) validated(req *admissionv1.AdmissionRequest, failure string) {
	attrs := []attribute.KeyValue{
		attribute.String("group", req.Resource.Group), attribute.String("version", req.Resource.Version),
		attribute.String("resource", req.Resource.Resource),
	}
	switch {
	case failure == "":
		m.validationPassed.Add(context.Background(), 1, metric.WithAttributes(attrs...))
	case req.DryRun == nil || !*req.DryRun:
		m.validationFailed.Add(context.Background(), 1, metric.WithAttributes(append(attrs, attribute.String("reason", failure))...))
	}
}

// validationHTTPErrorAnswered counts a /validate body that is no admission review.
func (m webhookMetrics) validationHTTPErrorAnswered(status int) {
	m.validationHTTPError.Add(context.Background(), 1, metric.WithAttributes(attribute.String("status", strconv.Itoa(status))))
}
