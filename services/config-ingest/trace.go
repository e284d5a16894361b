package configingest

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"sailplane.dev/services/config-ingest/internal/tree"
)

// tracer is config-ingest's: a change's trace starts here, at the file event, and continues on
// the bus with the resources it publishes (bus.Traced).
func tracer() trace.Tracer { return otel.Tracer("sailplane.dev/config-ingest") }

// Rescan triggers, in the "config.change" span.
const (
	triggerFileEvent = "file event"
	triggerOther     = "rescan"
)

// startRescan starts the "config.change" span of one rescan of the folders; since is when its
// first file event came (zero when it was not an event), the span's start.
func startRescan(since time.Time) (context.Context, trace.Span) {
	trigger := triggerFileEvent
	opts := []trace.SpanStartOption{trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindProducer)}
	if since.IsZero() {
		trigger = triggerOther
	} else {
		opts = append(opts, trace.WithTimestamp(since))
	}
	opts = append(opts, trace.WithAttributes(attribute.String("sailplane.trigger", trigger)))
	return tracer().Start(context.Background(), "config.change", opts...)
}

// scanTraced is f.scan in a "config.scan" span: reading, parsing and validating what changed.
func (f *folders) scanTraced(ctx context.Context) []tree.Change {
	_, span := tracer().Start(ctx, "config.scan")
	defer span.End()
	changes := f.scan()
	n := 0
	for _, c := range changes {
		n += len(c.Upsert) + len(c.Delete)
	}
	span.SetAttributes(attribute.Int("sailplane.changed", n), attribute.Int("sailplane.problems", len(f.tree.Problems())))
	return changes
}
