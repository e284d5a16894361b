// Package changetrace starts the traces of the registry changes endpoint-watcher observes
// itself: a Kubernetes watch event (Service, EndpointSlice, Pod, Node) or a Consul query result.
//
// Each event's trace is
//
//	endpoints.change      from the event's arrival to the end of its handling
//	├─ endpoints.update   recomputing what it affects, until the first publish
//	└─ bus.publish        one per publish (type, resources), whose resources carry the trace
//
// and continues across the bus as a config change's does (bus.deliver, then xds-server's
// xds.debounce and xds.push to the last proxy's ACK). The trace starts at the event's first
// publish, dated back to its arrival, so an event that changes nothing (most Pod status updates,
// a Consul answer equal to the last) records nothing. With tracing off, an event costs nothing:
// no allocation (TestUntracedEventAllocatesNothing); an event whose trace is not sampled
// publishes its resources untraced, so nothing downstream records or carries anything for it.
package changetrace

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/telemetry"
)

func tracer() trace.Tracer { return otel.Tracer("sailplane.dev/endpoint-watcher") }

// maxNames bounds the resource names a bus.publish span lists.
const maxNames = 8

// Event is one change a registry observed.
type Event struct {
	// At is when it arrived.
	At time.Time
	// Registry is "kubernetes" or "consul".
	Registry string
	// Kind is what changed: the Kubernetes kind, or Consul's "service" (one service's
	// instances) or "service list".
	Kind string
	// Op is the watch event ("add", "update", "delete"); empty for Consul.
	Op string
	// Namespace (Kubernetes) and Name of what changed.
	Namespace, Name string
	// Cluster is the cluster ID the registry stamps on what it publishes.
	Cluster string
}

type eventKey struct{}

// change is an Event being handled: its trace, once started. One goroutine handles an event.
type change struct {
	Event
	ctx  context.Context // holds root once started
	root trace.Span      // nil until the first publish
}

// Start returns the context in which to handle e, and the function that ends its handling.
// Publishers that Publisher builds from that context start e's trace at their first publish.
// With tracing off it returns ctx itself and a no-op end, allocating nothing.
func Start(ctx context.Context, e Event) (context.Context, func()) {
	if !telemetry.TracesOn() {
		return ctx, noEnd
	}
	c := &change{Event: e}
	return context.WithValue(ctx, eventKey{}, c), c.end
}

func noEnd() {}

func (c *change) end() {
	if c.root != nil {
		c.root.End()
	}
}

// begin starts the trace, dated back to the event's arrival, at the first publish; it returns
// the context of the root span, which holds no span when the trace is not sampled.
func (c *change) begin() context.Context {
	if c.root != nil {
		return c.ctx
	}
	attrs := []attribute.KeyValue{attribute.String("sailplane.registry", c.Registry),
		attribute.String("sailplane.kind", c.Kind), attribute.String("sailplane.cluster", c.Cluster)}
	if c.Name != "" {
		attrs = append(attrs, attribute.String("sailplane.name", schema.Name(c.Namespace, c.Name)))
	}
	if c.Op != "" {
		attrs = append(attrs, attribute.String("sailplane.event", c.Op))
	}
	ctx, root := tracer().Start(context.Background(), "endpoints.change", trace.WithNewRoot(),
		trace.WithSpanKind(trace.SpanKindProducer), trace.WithTimestamp(c.At), trace.WithAttributes(attrs...))
	c.root = root
	if !root.IsRecording() {
		// Not sampled: nothing below it either, and the resources carry no trace.
		c.ctx = context.Background()
		return c.ctx
	}
	c.ctx = ctx
	_, update := tracer().Start(ctx, "endpoints.update", trace.WithTimestamp(c.At))
	update.End()
	return ctx
}

// Publisher is p publishing in ctx's trace: the trace of the Event ctx is handling (see Start),
// or else the trace of ctx's span (a delivered change whose consequences the registry
// publishes, see bus.TracedPublisher). Without either it is p itself.
func Publisher(ctx context.Context, p bus.Publisher) bus.Publisher {
	if c, ok := ctx.Value(eventKey{}).(*change); ok {
		return publisher{c: c, p: p}
	}
	return bus.TracedPublisher(ctx, p)
}

// publisher publishes each call in a bus.publish span of its change's trace.
type publisher struct {
	c *change
	p bus.Publisher
}

var _ bus.Publisher = publisher{}

func (p publisher) Upsert(typeURL string, resources ...*bus.Resource) error {
	ctx, span := p.start(typeURL, resources, nil)
	defer span.End()
	return p.p.Upsert(typeURL, bus.Traced(ctx, resources...)...)
}

func (p publisher) Replace(typeURL string, resources []*bus.Resource) error {
	ctx, span := p.start(typeURL, resources, nil)
	defer span.End()
	return p.p.Replace(typeURL, bus.Traced(ctx, resources...))
}

// Delete is traced too, though a deletion carries no trace across the bus: the trace shows
// when it was published.
func (p publisher) Delete(typeURL string, names ...string) {
	_, span := p.start(typeURL, nil, names)
	defer span.End()
	p.p.Delete(typeURL, names...)
}

// start starts a bus.publish span in the change's trace, naming the first maxNames resources;
// a no-op span when the trace is not sampled.
func (p publisher) start(typeURL string, updated []*bus.Resource, removed []string) (context.Context, trace.Span) {
	ctx := p.c.begin()
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, trace.SpanFromContext(ctx)
	}
	names := make([]string, 0, maxNames)
	for _, r := range updated[:min(len(updated), maxNames)] {
		names = append(names, r.Name)
	}
	names = append(names, removed[:min(len(removed), maxNames-len(names))]...)
	return tracer().Start(ctx, "bus.publish", trace.WithAttributes(attribute.String("sailplane.type", typeURL),
		attribute.Int("sailplane.updated", len(updated)), attribute.Int("sailplane.removed", len(removed)),
		attribute.StringSlice("sailplane.names", names)))
}
