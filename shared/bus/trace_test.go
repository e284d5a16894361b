package bus_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	networking "istio.io/api/networking/v1alpha3"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/telemetry/telemetrytest"
	"sailplane.dev/shared/testwait"
)

// changes is a Handler handing every change to a channel.
type changes chan bus.Change

func (c changes) Apply(ch bus.Change) error { c <- ch; return nil }
func (c changes) Synced()                   {}

// TestTraceCrossesBus: a resource published in a trace reaches the consumer in a bus.deliver
// span of that trace, whose context the Change carries, in-process and over delta gRPC (W3C
// trace context in the resource's metadata). State of the world has no place for it. The trace
// is not content: the resource's version is the same with and without it.
func TestTraceCrossesBus(t *testing.T) {
	exporter, tracer := telemetrytest.RecordSpans(t)
	for _, tc := range []struct {
		name   string
		source func(t *testing.T, s *bus.Store) bus.Source
		traced bool
	}{
		{"local", func(_ *testing.T, s *bus.Store) bus.Source { return bus.Local(s) }, true},
		{"delta", func(t *testing.T, s *bus.Store) bus.Source { return bus.Dial(startPeer(t, s).addr) }, true},
		{"sotw", func(t *testing.T, s *bus.Store) bus.Source { return bus.DialSotW(startPeer(t, s).addr) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			exporter.Reset()
			store := bus.NewStore()
			got := make(changes, 10)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				_ = tc.source(t, store).Subscribe(ctx, []string{schema.VirtualService.TypeURL}, got)
			}()
			t.Cleanup(func() { cancel(); <-done })
			if first := <-got; len(first.Updated) != 0 {
				t.Fatalf("first state %+v, want empty", first)
			}

			pubCtx, publish := tracer.Start(context.Background(), "publish")
			vs := &bus.Resource{Name: "demo/echo", Body: &networking.VirtualService{Hosts: []string{"echo"}}}
			traced := bus.Traced(pubCtx, vs)
			if traced[0] == vs || vs.Trace.IsValid() {
				t.Fatal("Traced modified the producer's resource instead of copying it")
			}
			if err := store.Upsert(schema.VirtualService.TypeURL, traced...); err != nil {
				t.Fatal(err)
			}
			publish.End()
			if stored, _ := store.Get(schema.VirtualService.TypeURL, "demo/echo"); stored.Version != bus.ContentVersion(vs) {
				t.Errorf("version %s with a trace, %s without", stored.Version, bus.ContentVersion(vs))
			}

			var c bus.Change
			select {
			case c = <-got:
			case <-time.After(time.Minute):
				t.Fatal("no change delivered")
			}
			if !tc.traced {
				if c.Trace.IsValid() || c.Updated[0].Trace.IsValid() {
					t.Errorf("a state-of-the-world delivery carries a trace: %v", c.Trace)
				}
				return
			}
			if c.Trace.TraceID() != publish.SpanContext().TraceID() {
				t.Fatalf("delivered in trace %v, published in %v", c.Trace.TraceID(), publish.SpanContext().TraceID())
			}
			var deliver tracetest.SpanStub
			testwait.Until(t, time.Minute, "the bus.deliver span to end", func() bool {
				for _, s := range exporter.GetSpans() {
					if s.Name == "bus.deliver" {
						deliver = s
						return true
					}
				}
				return false
			})
			if deliver.SpanContext.SpanID() != c.Trace.SpanID() || deliver.Parent.SpanID() != publish.SpanContext().SpanID() {
				t.Errorf("bus.deliver %v (parent %v); want the change's %v, child of the publish %v",
					deliver.SpanContext.SpanID(), deliver.Parent.SpanID(), c.Trace.SpanID(), publish.SpanContext().SpanID())
			}
			if deliver.SpanKind != trace.SpanKindConsumer {
				t.Errorf("bus.deliver is a %v span, want consumer", deliver.SpanKind)
			}
		})
	}
}
