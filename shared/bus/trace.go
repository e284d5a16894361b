package bus

import (
	"context"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/structpb"
)

// A change's trace crosses the bus with the resource versions it produced: a producer sets
// Resource.Trace, consumers continue it in a "bus.deliver" span whose context Change.Trace holds.
//
// Over gRPC the W3C trace context travels in the delta response's per-resource metadata
// (envoy.service.discovery.v3.Resource.metadata, which Envoy documents for "the trace data for
// debugging"), under the filter metadata key TraceMetadataKey. It is outside the MCP resource, so
// the body, its version and what consumers (Istio's included) see of the resource are unchanged,
// and it is encoded once per version with the rest of the resource. State-of-the-world responses
// have no per-resource metadata: they carry no trace.

// TraceMetadataKey is the filter metadata key holding a resource version's trace context
// ("traceparent", "tracestate") in delta responses.
const TraceMetadataKey = "sailplane.dev/trace"

var traceContext = propagation.TraceContext{}

func tracer() trace.Tracer { return otel.Tracer("sailplane.dev/bus") }

// traceMetadata is the delta metadata carrying sc, nil when sc is invalid.
func traceMetadata(sc trace.SpanContext) *corev3.Metadata {
	if !sc.IsValid() {
		return nil
	}
	carrier := propagation.MapCarrier{}
	traceContext.Inject(trace.ContextWithSpanContext(context.Background(), sc), carrier)
	fields := make(map[string]*structpb.Value, len(carrier))
	for k, v := range carrier {
		fields[k] = structpb.NewStringValue(v)
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{TraceMetadataKey: {Fields: fields}}}
}

// traceOf reads the trace context a delta resource carries; invalid when none.
func traceOf(r *discoveryv3.Resource) trace.SpanContext {
	st := r.GetMetadata().GetFilterMetadata()[TraceMetadataKey]
	if st == nil {
		return trace.SpanContext{}
	}
	carrier := propagation.MapCarrier{}
	for k, v := range st.GetFields() {
		carrier[k] = v.GetStringValue()
	}
	return trace.SpanContextFromContext(traceContext.Extract(context.Background(), carrier))
}

// maxDeliveryLinks bounds the links of one delivery span: a change of many resources from many
// traces links the first ones only.
const maxDeliveryLinks = 32

// startDelivery starts the "bus.deliver" span of c when one of its resources carries a trace:
// a child of the first such trace, linked to the others. It sets c.Trace to the span's context
// and returns the span; nil (and no allocation) when nothing in c is traced.
func startDelivery(c *Change, consumer string) trace.Span {
	var parent trace.SpanContext
	var links []trace.Link
	for _, r := range c.Updated {
		switch {
		case !r.Trace.IsValid() || r.Trace.Equal(parent):
		case !parent.IsValid():
			parent = r.Trace
		case len(links) < maxDeliveryLinks:
			links = append(links, trace.Link{SpanContext: r.Trace})
		}
	}
	if !parent.IsValid() {
		return nil
	}
	ctx := trace.ContextWithSpanContext(context.Background(), parent) // remote when it came over gRPC
	_, span := tracer().Start(ctx, "bus.deliver", trace.WithSpanKind(trace.SpanKindConsumer), trace.WithLinks(links...),
		trace.WithAttributes(attribute.String("sailplane.type", c.TypeURL), attribute.String("sailplane.consumer", consumer),
			attribute.Int("sailplane.updated", len(c.Updated)), attribute.Int("sailplane.removed", len(c.Removed))))
	c.Trace = span.SpanContext()
	return span
}

// endDelivery ends a span startDelivery returned, with the handler's verdict.
func endDelivery(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// Traced returns resources stamped with the span context of ctx, for a producer to publish as
// part of that trace: copies, so resources the producer keeps are not modified. Without a span
// in ctx it returns resources as they are.
func Traced(ctx context.Context, resources ...*Resource) []*Resource {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return resources
	}
	out := make([]*Resource, len(resources))
	for i, r := range resources {
		if r != nil {
			c := *r
			c.Trace = sc
			r = &c
		}
		out[i] = r
	}
	return out
}

// TracedPublisher is p publishing every resource stamped with the span context of ctx (see
// Traced): a consumer that republishes what it derives from a delivered change continues the
// change's trace with it. Without a span in ctx it returns p.
func TracedPublisher(ctx context.Context, p Publisher) Publisher {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return p
	}
	return tracedPublisher{ctx: ctx, Publisher: p}
}

type tracedPublisher struct {
	ctx context.Context
	Publisher
}

func (t tracedPublisher) Upsert(typeURL string, resources ...*Resource) error {
	return t.Publisher.Upsert(typeURL, Traced(t.ctx, resources...)...)
}

func (t tracedPublisher) Replace(typeURL string, resources []*Resource) error {
	return t.Publisher.Replace(typeURL, Traced(t.ctx, resources...))
}
