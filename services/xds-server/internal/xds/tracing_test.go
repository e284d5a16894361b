package xds

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/telemetry/telemetrytest"
)

// tracedChange is c as delivered in the trace of a new root span named name.
func tracedChange(tr trace.Tracer, name string, c bus.Change) (bus.Change, trace.SpanContext) {
	_, span := tr.Start(context.Background(), name)
	span.End()
	c.Trace = span.SpanContext()
	return c, c.Trace
}

// waitSpan waits for an ended span named name and returns it.
func waitSpan(t *testing.T, exporter *tracetest.InMemoryExporter, name string) tracetest.SpanStub {
	t.Helper()
	var out tracetest.SpanStub
	waitUntil(t, func() bool {
		for _, s := range exporter.GetSpans() {
			if s.Name == name {
				out = s
				return true
			}
		}
		return false
	})
	return out
}

func spansNamed(exporter *tracetest.InMemoryExporter, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range exporter.GetSpans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func intAttr(s tracetest.SpanStub, key string) string {
	for _, a := range s.Attributes {
		if string(a.Key) == key {
			return a.Value.Emit()
		}
	}
	return ""
}

// TestPushTracingMergedChanges: two traced changes merged by one push give a push trace of its
// own linked to both changes' traces (and they to it), with xds.proxy spans for at most
// maxProxySpans proxies while every proxy is counted.
func TestPushTracingMergedChanges(t *testing.T) {
	exporter, tr := telemetrytest.RecordSpans(t)
	tracer := NewPushTracer()
	tracer.maxProxySpans = 2
	e := newEnv(t, Options{Observers: []Observer{tracer}}, services("demo", "a.demo"))
	var clients []*delta
	for i := range 3 {
		c := newDelta(t, e.addr, node("p"+strconv.Itoa(i), "demo", false))
		c.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType})
		c.recvType(resourcev3.ClusterType)
		clients = append(clients, c)
	}

	b, traceB := tracedChange(tr, "change b", services("demo", "b.demo"))
	c, traceC := tracedChange(tr, "change c", services("demo", "c.demo"))
	e.apply(b, c)
	snap, ch := e.store.Next()
	e.srv.Push(snap, ch, tracer.Start(ch, time.Now(), snap.Version))
	for _, client := range clients {
		client.recvType(resourcev3.ClusterType) // and ACK
	}

	push := waitSpan(t, exporter, "xds.push")
	if push.Parent.IsValid() {
		t.Errorf("a push of two changes is a child of %v; want a root linked to both", push.Parent.SpanID())
	}
	debounces := spansNamed(exporter, "xds.debounce")
	if len(debounces) != 2 || len(push.Links) != 2 {
		t.Fatalf("%d xds.debounce spans, push with %d links; want 2 and 2", len(debounces), len(push.Links))
	}
	for _, d := range debounces {
		if d.Parent.TraceID() != traceB.TraceID() && d.Parent.TraceID() != traceC.TraceID() {
			t.Errorf("xds.debounce in trace %v, neither change's", d.Parent.TraceID())
		}
		if len(d.Links) != 1 || d.Links[0].SpanContext.SpanID() != push.SpanContext.SpanID() {
			t.Errorf("xds.debounce of trace %v does not link to the push", d.Parent.TraceID())
		}
		linked := false
		for _, l := range push.Links {
			linked = linked || l.SpanContext.SpanID() == d.SpanContext.SpanID()
		}
		if !linked {
			t.Errorf("the push does not link to the xds.debounce of trace %v", d.Parent.TraceID())
		}
	}
	if got := len(spansNamed(exporter, "xds.proxy")); got != 2 {
		t.Errorf("%d xds.proxy spans, want 2 (the bound)", got)
	}
	for key, want := range map[string]string{"sailplane.proxies": "3", "sailplane.acked": "3", "sailplane.unanswered": "0", "sailplane.changes": "2"} {
		if got := intAttr(push, key); got != want {
			t.Errorf("xds.push %s = %s, want %s", key, got, want)
		}
	}
	for _, a := range spansNamed(exporter, "xds.ack") {
		if a.EndTime.After(push.EndTime) {
			t.Errorf("an ACK ends after the push span")
		}
	}
}

// TestPushTracingDisconnect: a proxy that goes away before answering ends its part of the push,
// counted as disconnected, instead of holding the push span open.
func TestPushTracingDisconnect(t *testing.T) {
	exporter, tr := telemetrytest.RecordSpans(t)
	tracer := NewPushTracer()
	e := newEnv(t, Options{Observers: []Observer{tracer}}, services("demo", "a.demo"))
	ctx, cancel := context.WithCancel(context.Background())
	s, err := dial(t, e.addr).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := &delta{t: t, s: s, node: node("gone", "demo", false), have: map[string]map[string]string{}}
	c.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType})
	c.recvType(resourcev3.ClusterType)

	b, _ := tracedChange(tr, "change b", services("demo", "b.demo"))
	e.apply(b)
	snap, ch := e.store.Next()
	e.srv.Push(snap, ch, tracer.Start(ch, time.Now(), snap.Version))
	if resp := c.recvRaw(); resp.GetTypeUrl() != resourcev3.ClusterType {
		t.Fatalf("got %s", resp.GetTypeUrl())
	}
	cancel() // without an ACK

	push := waitSpan(t, exporter, "xds.push")
	if got := fmt.Sprint(intAttr(push, "sailplane.disconnected"), "/", intAttr(push, "sailplane.acked")); got != "1/0" {
		t.Errorf("xds.push disconnected/acked = %s, want 1/0", got)
	}
	proxies := spansNamed(exporter, "xds.proxy")
	if len(proxies) != 1 || intAttr(proxies[0], "sailplane.unanswered") != "disconnected" {
		t.Errorf("xds.proxy spans %+v, want one marked disconnected", proxies)
	}
}

// TestPushTracingOneChangeManyDeliveries: one change delivered in parts (a rescan publishing
// several types) stays one trace: its push is a child of the first delivery's wait.
func TestPushTracingOneChangeManyDeliveries(t *testing.T) {
	exporter, tr := telemetrytest.RecordSpans(t)
	tracer := NewPushTracer()
	e := newEnv(t, Options{Observers: []Observer{tracer}}, services("demo", "a.demo"))
	client := newDelta(t, e.addr, node("p", "demo", false))
	client.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType})
	client.recvType(resourcev3.ClusterType)

	ctx, change := tr.Start(context.Background(), "change")
	_, part1 := tr.Start(ctx, "deliver services")
	_, part2 := tr.Start(ctx, "deliver rules")
	part1.End()
	part2.End()
	change.End()
	b, c := services("demo", "b.demo"), destinationRule("demo", "b", "b.demo")
	b.Trace, c.Trace = part1.SpanContext(), part2.SpanContext()
	e.apply(b, c)
	snap, ch := e.store.Next()
	e.srv.Push(snap, ch, tracer.Start(ch, time.Now(), snap.Version))
	client.recvType(resourcev3.ClusterType)

	push := waitSpan(t, exporter, "xds.push")
	if push.SpanContext.TraceID() != change.SpanContext().TraceID() {
		t.Fatalf("the push left the change's trace")
	}
	var first tracetest.SpanStub
	for _, d := range spansNamed(exporter, "xds.debounce") {
		if d.Parent.SpanID() == part1.SpanContext().SpanID() {
			first = d
		}
	}
	if push.Parent.SpanID() != first.SpanContext.SpanID() || len(push.Links) != 1 {
		t.Errorf("xds.push parent %v with %d links; want the first delivery's xds.debounce %v, linked to the other",
			push.Parent.SpanID(), len(push.Links), first.SpanContext.SpanID())
	}
}

// proxyEvents is what the observer chain reports of one push to one proxy: two responses, their
// ACKs, the push's end.
func proxyEvents(o Observer, s StreamInfo, req *PushRequest) {
	now := time.Now()
	for _, typ := range []string{resourcev3.ClusterType, resourcev3.ListenerType} {
		r := Response{Stream: s, TypeURL: typ, Nonce: typ, Resources: 1, Bytes: 100, Push: req, Began: now, Built: now, Sent: now}
		o.Responded(r)
		o.Answered(Answer{Stream: s, Response: r, At: now})
	}
	o.Pushed(Push{Stream: s, Request: req, Queued: now, Started: now, Done: now})
}

// TestUntracedPushAllocatesNothing: with tracing off, or a push not sampled, the tracer costs a
// proxy's push no allocation.
func TestUntracedPushAllocatesNothing(t *testing.T) {
	tracer := NewPushTracer()
	s := StreamInfo{ID: 1, Proxy: &model.Proxy{NodeID: "p"}}
	req := &PushRequest{Full: true}
	if tr := tracer.Start(model.Change{Full: true}, time.Now(), 1); tr != nil {
		t.Fatal("a change without traces started a push trace")
	}
	if n := testing.AllocsPerRun(100, func() { proxyEvents(tracer, s, req) }); n != 0 {
		t.Errorf("%v allocations per untraced proxy push, want 0", n)
	}
}

// BenchmarkPushTracer is the tracer's cost per proxy of a push: untraced (tracing off, or not
// sampled) and sampled (spans recorded into a discarding exporter).
func BenchmarkPushTracer(b *testing.B) {
	s := StreamInfo{ID: 1, Proxy: &model.Proxy{NodeID: "p"}}
	b.Run("no observer", func(b *testing.B) {
		req := &PushRequest{Full: true}
		b.ReportAllocs()
		for b.Loop() {
			proxyEvents(NopObserver{}, s, req)
		}
	})
	b.Run("untraced", func(b *testing.B) {
		tracer, req := NewPushTracer(), &PushRequest{Full: true}
		b.ReportAllocs()
		for b.Loop() {
			proxyEvents(tracer, s, req)
		}
	})
	for _, bc := range []struct {
		name      string
		proxySpan bool
	}{{"sampled", true}, {"sampled past MaxProxySpans", false}} {
		b.Run(bc.name, func(b *testing.B) {
			tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tracetest.NewNoopExporter()))
			otel.SetTracerProvider(tp)
			b.Cleanup(func() { otel.SetTracerProvider(noop.NewTracerProvider()) })
			_, change := tp.Tracer("bench").Start(context.Background(), "change")
			tracer := NewPushTracer()
			if bc.proxySpan {
				tracer.maxProxySpans = 1 << 30
			} else {
				tracer.maxProxySpans = 0
			}
			pt := tracer.Start(model.Change{Full: true, Traces: []model.TracedChange{{Span: change.SpanContext(), At: time.Now()}}}, time.Now(), 1)
			b.ReportAllocs()
			for b.Loop() {
				pt.await(s.ID)
				proxyEvents(tracer, s, &PushRequest{Full: true, Traces: []*PushTrace{pt}})
			}
		})
	}
}

// TestPushTracingUnanswered: a proxy that never answers does not hold the push span open: it
// ends after the tracer's age limit, counting the proxy unanswered.
func TestPushTracingUnanswered(t *testing.T) {
	exporter, tr := telemetrytest.RecordSpans(t)
	tracer := NewPushTracer()
	tracer.maxAge = 100 * time.Millisecond
	e := newEnv(t, Options{Observers: []Observer{tracer}}, services("demo", "a.demo"))
	c := newDelta(t, e.addr, node("silent", "demo", false))
	c.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType})
	c.recvType(resourcev3.ClusterType)

	b, _ := tracedChange(tr, "change b", services("demo", "b.demo"))
	e.apply(b)
	snap, ch := e.store.Next()
	e.srv.Push(snap, ch, tracer.Start(ch, time.Now(), snap.Version))
	if resp := c.recvRaw(); resp.GetTypeUrl() != resourcev3.ClusterType { // and no ACK
		t.Fatalf("got %s", resp.GetTypeUrl())
	}

	push := waitSpan(t, exporter, "xds.push")
	if got := intAttr(push, "sailplane.unanswered"); got != "1" {
		t.Errorf("xds.push unanswered = %s, want 1", got)
	}
	if push.Status.Code != codes.Error {
		t.Errorf("xds.push status %v, want an error", push.Status)
	}
}
