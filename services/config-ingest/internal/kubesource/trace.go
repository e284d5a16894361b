package kubesource

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// tracer is config-ingest's: a watch event's change starts a trace that the published
// resources carry on the bus (bus.Traced).
func tracer() trace.Tracer { return otel.Tracer("sailplane.dev/config-ingest") }

// endValidate ends a "config.validate" span with the validation's verdict.
func endValidate(span trace.Span, err error) {
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
