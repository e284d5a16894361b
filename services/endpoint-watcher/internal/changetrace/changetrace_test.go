package changetrace

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"go.uber.org/goleak"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/endpoint-watcher/internal/bustest"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/telemetry/telemetrytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var slice = Event{Registry: "kubernetes", Kind: "EndpointSlice", Op: "update", Namespace: "demo", Name: "echo-x1", Cluster: "c1"}

func resource(name string) *bus.Resource {
	return &bus.Resource{Name: name, Body: &discoveryv1.Endpoints{Hostname: name}}
}

// TestUntracedEventAllocatesNothing: with tracing off (OpenTelemetry's default provider, or a
// no-op one), handling an event costs no allocation and publishes through the publisher itself.
func TestUntracedEventAllocatesNothing(t *testing.T) {
	rec := bustest.NewRecorder()
	check := func(provider string) {
		t.Helper()
		e := slice
		e.At = time.Now()
		if n := testing.AllocsPerRun(100, func() {
			ctx, end := Start(context.Background(), e)
			_ = Publisher(ctx, rec)
			end()
		}); n != 0 {
			t.Errorf("%s: %v allocations per event, want 0", provider, n)
		}
		ctx, end := Start(context.Background(), e)
		defer end()
		if p := Publisher(ctx, rec); p != bus.Publisher(rec) {
			t.Errorf("%s: publishing through %T, want the publisher itself", provider, p)
		}
	}
	check("default provider")
	otel.SetTracerProvider(noop.NewTracerProvider())
	check("no-op provider")
}

// TestEventTrace: an event's trace starts at its first publish, dated back to the event, with
// one bus.publish per call whose span the upserted resources carry; an event that publishes
// nothing records nothing.
func TestEventTrace(t *testing.T) {
	exporter, _ := telemetrytest.RecordSpans(t)
	rec := bustest.NewRecorder()

	_, end := Start(context.Background(), slice)
	end()
	if spans := exporter.GetSpans(); len(spans) != 0 {
		t.Fatalf("an event that published nothing recorded %d spans", len(spans))
	}

	e := slice
	e.At = time.Now().Add(-time.Second)
	ctx, end := Start(context.Background(), e)
	pub := Publisher(ctx, rec)
	if err := pub.Upsert(schema.Service.TypeURL, resource("demo/echo.demo.svc.cluster.local")); err != nil {
		t.Fatal(err)
	}
	if err := pub.Upsert(schema.Endpoints.TypeURL, resource("demo/echo.demo.svc.cluster.local")); err != nil {
		t.Fatal(err)
	}
	pub.Delete(schema.Endpoints.TypeURL, "demo/gone.demo.svc.cluster.local")
	end()

	spans := exporter.GetSpans()
	byName := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range spans.Snapshots() {
		byName[s.Name()] = append(byName[s.Name()], s)
	}
	if len(byName["endpoints.change"]) != 1 || len(byName["endpoints.update"]) != 1 || len(byName["bus.publish"]) != 3 {
		t.Fatalf("spans %v, want one endpoints.change, one endpoints.update, three bus.publish", byName)
	}
	root := byName["endpoints.change"][0]
	if root.Parent().IsValid() {
		t.Errorf("endpoints.change has a parent: %v", root.Parent())
	}
	if !root.StartTime().Equal(e.At) {
		t.Errorf("endpoints.change starts at %v, want the event's arrival %v", root.StartTime(), e.At)
	}
	want := map[string]string{"sailplane.registry": "kubernetes", "sailplane.kind": "EndpointSlice",
		"sailplane.event": "update", "sailplane.name": "demo/echo-x1", "sailplane.cluster": "c1"}
	for _, a := range root.Attributes() {
		if w, ok := want[string(a.Key)]; ok && a.Value.Emit() != w {
			t.Errorf("endpoints.change %s = %q, want %q", a.Key, a.Value.Emit(), w)
		}
		delete(want, string(a.Key))
	}
	if len(want) != 0 {
		t.Errorf("endpoints.change lacks attributes %v", want)
	}
	for _, s := range append(byName["endpoints.update"], byName["bus.publish"]...) {
		if s.Parent().SpanID() != root.SpanContext().SpanID() {
			t.Errorf("%s is not a child of endpoints.change", s.Name())
		}
	}
	if u := byName["endpoints.update"][0]; !u.StartTime().Equal(e.At) || u.EndTime().After(byName["bus.publish"][0].StartTime()) {
		t.Errorf("endpoints.update runs %v to %v, want from the event to the first publish", u.StartTime(), u.EndTime())
	}
	publishes := map[trace.SpanID]bool{}
	for _, s := range byName["bus.publish"] {
		publishes[s.SpanContext().SpanID()] = true
	}
	for _, typ := range []string{schema.Service.TypeURL, schema.Endpoints.TypeURL} {
		r := rec.State(typ)["demo/echo.demo.svc.cluster.local"]
		if r == nil || !publishes[r.Trace.SpanID()] || r.Trace.TraceID() != root.SpanContext().TraceID() {
			t.Errorf("%s published without the trace of its bus.publish span: %+v", typ, r)
		}
	}
}

// TestUnsampledEvent: an event whose trace is not sampled publishes its resources untraced, so
// nothing downstream records or carries anything for it.
func TestUnsampledEvent(t *testing.T) {
	exporter, _ := telemetrytest.RecordSpans(t)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()), sdktrace.WithSyncer(exporter))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	otel.SetTracerProvider(tp)
	rec := bustest.NewRecorder()
	ctx, end := Start(context.Background(), slice)
	if err := Publisher(ctx, rec).Upsert(schema.Endpoints.TypeURL, resource("demo/a")); err != nil {
		t.Fatal(err)
	}
	end()
	if r := rec.State(schema.Endpoints.TypeURL)["demo/a"]; r == nil || r.Trace.IsValid() {
		t.Errorf("unsampled event published %+v, want no trace", r)
	}
	if n := len(exporter.GetSpans()); n != 0 {
		t.Errorf("unsampled event recorded %d spans", n)
	}
}

// TestPublisherContinuesDeliveredChange: without an event, what a delivered change brings about
// is published in the trace of its span.
func TestPublisherContinuesDeliveredChange(t *testing.T) {
	_, tr := telemetrytest.RecordSpans(t)
	ctx, span := tr.Start(context.Background(), "bus.deliver")
	defer span.End()
	rec := bustest.NewRecorder()
	if err := Publisher(ctx, rec).Upsert(schema.Endpoints.TypeURL, resource("demo/a")); err != nil {
		t.Fatal(err)
	}
	if r := rec.State(schema.Endpoints.TypeURL)["demo/a"]; r == nil || !r.Trace.Equal(span.SpanContext()) {
		t.Errorf("published %+v, want the delivery's trace %v", r, span.SpanContext())
	}
}

// discard is a Publisher that keeps nothing.
type discard struct{}

func (discard) Upsert(string, ...*bus.Resource) error { return nil }
func (discard) Delete(string, ...string)              {}
func (discard) Replace(string, []*bus.Resource) error { return nil }

// BenchmarkEvent is the tracing cost of one event that publishes one resource of each registry
// type: tracing off, and sampled (spans recorded into a discarding exporter).
func BenchmarkEvent(b *testing.B) {
	svcs := []*bus.Resource{resource("demo/echo.demo.svc.cluster.local")}
	eps := []*bus.Resource{resource("demo/echo.demo.svc.cluster.local")}
	event := func() {
		ctx, end := Start(context.Background(), slice)
		pub := Publisher(ctx, discard{})
		_ = pub.Upsert(schema.Service.TypeURL, svcs...)
		_ = pub.Upsert(schema.Endpoints.TypeURL, eps...)
		end()
	}
	b.Run("off", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			event()
		}
	})
	b.Run("sampled", func(b *testing.B) {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tracetest.NewNoopExporter()))
		otel.SetTracerProvider(tp)
		b.Cleanup(func() {
			otel.SetTracerProvider(noop.NewTracerProvider())
			_ = tp.Shutdown(context.Background())
		})
		b.ReportAllocs()
		for b.Loop() {
			event()
		}
	})
}
