package xds

import (
	"context"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"sailplane.dev/services/xds-server/internal/model"
)

// Tracing a push (see docs/operations.md, "Traces"):
//
//	bus.deliver (one per change)
//	└─ xds.debounce        the change waiting for the debouncer
//	   └─ xds.push         from the debouncer firing to the last proxy's answer
//	      ├─ xds.snapshot  building the snapshot
//	      └─ xds.proxy     one per proxy, from queued to its last answer
//	         ├─ xds.queue  waiting for a push worker
//	         ├─ xds.generate  per response: generating it (or taking it from the cache)
//	         ├─ xds.send   per response: sending it
//	         └─ xds.ack    per response: until the proxy's ACK or NACK
//
// A push merging several changes' traces is a trace of its own, linked to each change's
// xds.debounce span, each of which links back to it: no change's trace swallows the others.
// Deliveries of one change's trace (one rescan publishing several types) stay in it.
//
// What is recorded is bounded. Only sampled pushes do any per-proxy work; an unsampled push, and
// tracing off, cost one nil check per response. A sampled push records xds.proxy spans for its
// first MaxProxySpans proxies to finish, and counts every proxy on the xds.push span (acked,
// nacked, disconnected, the slowest proxy and its time); each proxy's in-flight state is a few
// events, at most maxPushesPerStream sampled pushes per stream; a push whose proxies do not all
// answer within MaxPushTraceAge ends then, counting them unanswered.

const (
	// MaxProxySpans is how many proxies of one push get their own spans.
	MaxProxySpans = 100
	// MaxPushTraceAge is how long a push's span waits for its last proxy's answer.
	MaxPushTraceAge = time.Minute
	// maxPushesPerStream bounds the sampled pushes followed on one stream at once (a proxy that
	// never answers): the oldest is given up.
	maxPushesPerStream = 4
	// maxResponsesPerPush bounds the responses recorded for one proxy's push.
	maxResponsesPerPush = 32
	// maxMergedTraces bounds the pushes one merged request belongs to.
	maxMergedTraces = 8
)

func tracer() trace.Tracer { return otel.Tracer("sailplane.dev/xds-server") }

// PushTracer is the Observer that traces pushes: Start begins a push's trace, and the observer
// calls follow it to every proxy's answer.
type PushTracer struct {
	NopObserver
	// now is the clock of spans ending without an event to date them.
	now func() time.Time
	// maxProxySpans and maxAge are MaxProxySpans and MaxPushTraceAge; tests lower them.
	maxProxySpans int
	maxAge        time.Duration

	mu      sync.Mutex
	streams map[int64][]*proxyPush // pushes of sampled traces in flight, by stream
	traces  map[*PushTrace]struct{}
}

var _ Observer = (*PushTracer)(nil)

// NewPushTracer returns a PushTracer using the global tracer provider.
func NewPushTracer() *PushTracer {
	return &PushTracer{now: time.Now, maxProxySpans: MaxProxySpans, maxAge: MaxPushTraceAge, streams: map[int64][]*proxyPush{}, traces: map[*PushTrace]struct{}{}}
}

// PushTrace is one sampled push being followed to its proxies' answers.
type PushTrace struct {
	t    *PushTracer
	ctx  context.Context // holds the xds.push span
	span trace.Span

	// Guarded by t.mu.
	waiting                                  map[int64]struct{} // streams queued, not yet done
	sealed, ended                            bool
	proxies, acked, nacked, gone, proxySpans int
	slowestNode                              string
	slowest                                  time.Duration
	last                                     time.Time // latest answer
	timer                                    *time.Timer
}

// Start begins the trace of a push of the changes merged by the debouncer: their xds.debounce
// spans end at since (when the debouncer fired), the xds.push span starts then, and
// xds.snapshot spans since to now. It returns nil when nothing is traced or the push is not
// sampled: the push then costs no tracing work per proxy.
func (t *PushTracer) Start(ch model.Change, since time.Time, version uint64) *PushTrace {
	if len(ch.Traces) == 0 {
		return nil
	}
	tr := tracer()
	links := make([]trace.Link, 0, len(ch.Traces))
	waits := make([]trace.Span, 0, len(ch.Traces))
	for _, c := range ch.Traces {
		_, wait := tr.Start(trace.ContextWithSpanContext(context.Background(), c.Span), "xds.debounce",
			trace.WithTimestamp(c.At), trace.WithAttributes(attribute.Int("sailplane.merged", len(ch.Traces)+ch.Untraced)))
		links = append(links, trace.Link{SpanContext: wait.SpanContext()})
		waits = append(waits, wait)
	}
	parent := context.Background()
	opts := []trace.SpanStartOption{trace.WithTimestamp(since), trace.WithAttributes(
		attribute.Int64("sailplane.snapshot_version", int64(version)), attribute.Bool("sailplane.full", ch.Full),
		attribute.Int("sailplane.changes", len(ch.Traces)+ch.Untraced))}
	// One change's trace (one delivery, or one change of several types delivered type by
	// type) continues into the push; several changes' push is a trace of its own.
	oneTrace := true
	for _, c := range ch.Traces[1:] {
		oneTrace = oneTrace && c.Span.TraceID() == ch.Traces[0].Span.TraceID()
	}
	if oneTrace {
		parent = trace.ContextWithSpan(parent, waits[0])
		opts = append(opts, trace.WithLinks(links[1:]...))
	} else {
		opts = append(opts, trace.WithNewRoot(), trace.WithLinks(links...))
	}
	ctx, push := tr.Start(parent, "xds.push", opts...)
	for _, w := range waits {
		if !oneTrace {
			w.AddLink(trace.Link{SpanContext: push.SpanContext()})
		}
		w.End(trace.WithTimestamp(since))
	}
	_, build := tr.Start(ctx, "xds.snapshot", trace.WithTimestamp(since))
	build.End()
	if !push.IsRecording() {
		push.End()
		return nil
	}
	pt := &PushTrace{t: t, ctx: ctx, span: push, waiting: map[int64]struct{}{}}
	t.mu.Lock()
	defer t.mu.Unlock()
	pt.timer = time.AfterFunc(t.maxAge, func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		pt.endLocked(t.now())
	})
	t.traces[pt] = struct{}{}
	return pt
}

// await notes that stream id was queued for the push.
func (pt *PushTrace) await(id int64) {
	if pt == nil {
		return
	}
	pt.t.mu.Lock()
	pt.waiting[id] = struct{}{}
	pt.proxies++
	pt.t.mu.Unlock()
}

// queued notes that every stream was queued: the push ends with the last one's answer.
func (pt *PushTrace) queued() {
	pt.t.mu.Lock()
	defer pt.t.mu.Unlock()
	pt.sealed = true
	if len(pt.waiting) == 0 {
		pt.endLocked(pt.t.now())
	}
}

// endLocked ends the push's span at the given time with its proxies' tally.
func (pt *PushTrace) endLocked(at time.Time) {
	if pt.ended {
		return
	}
	pt.ended = true
	pt.timer.Stop()
	delete(pt.t.traces, pt)
	if !pt.last.IsZero() {
		at = pt.last
	}
	attrs := []attribute.KeyValue{attribute.Int("sailplane.proxies", pt.proxies), attribute.Int("sailplane.acked", pt.acked),
		attribute.Int("sailplane.nacked", pt.nacked), attribute.Int("sailplane.disconnected", pt.gone),
		attribute.Int("sailplane.unanswered", len(pt.waiting))}
	if pt.slowestNode != "" {
		attrs = append(attrs, attribute.String("sailplane.slowest_proxy", pt.slowestNode),
			attribute.Float64("sailplane.slowest_seconds", pt.slowest.Seconds()))
	}
	pt.span.SetAttributes(attrs...)
	if len(pt.waiting) > 0 {
		pt.span.SetStatus(codes.Error, "proxies did not answer in time")
	}
	clear(pt.waiting)
	pt.span.End(trace.WithTimestamp(at))
}

// mergeTraces is the traces of two merged requests.
func mergeTraces(a, b []*PushTrace) []*PushTrace {
	if len(b) == 0 {
		return a
	}
	if len(a) == 0 {
		return b
	}
	out := slices.Clone(a)
	for _, t := range b {
		if len(out) < maxMergedTraces && !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

// proxyPush is one traced request's push to one stream, until the proxy answered it all.
type proxyPush struct {
	stream                StreamInfo
	req                   *PushRequest
	responses             []sentResponseTrace
	outstanding           int
	pushed                bool
	queued, started, done time.Time
	err                   error
}

type sentResponseTrace struct {
	typeURL, nonce               string
	resources, removed, bytes    int
	began, built, sent, answered time.Time
	nack                         string
}

// proxyLocked returns the stream's push of req, starting to follow it when create.
func (t *PushTracer) proxyLocked(s StreamInfo, req *PushRequest, create bool) *proxyPush {
	pushes := t.streams[s.ID]
	for _, p := range pushes {
		if p.req == req {
			return p
		}
	}
	if !create {
		return nil
	}
	if len(pushes) >= maxPushesPerStream {
		t.finishLocked(pushes[0], "superseded")
		pushes = t.streams[s.ID]
	}
	p := &proxyPush{stream: s, req: req}
	t.streams[s.ID] = append(pushes, p)
	return p
}

// Responded records a response of a traced push.
func (t *PushTracer) Responded(r Response) {
	if r.Push == nil || len(r.Push.Traces) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.proxyLocked(r.Stream, r.Push, true)
	p.outstanding++
	if len(p.responses) < maxResponsesPerPush {
		p.responses = append(p.responses, sentResponseTrace{typeURL: r.TypeURL, nonce: r.Nonce,
			resources: r.Resources, removed: r.Removed, bytes: r.Bytes, began: r.Began, built: r.Built, sent: r.Sent})
	}
}

// Answered records the proxy's answer to a response of a traced push.
func (t *PushTracer) Answered(a Answer) {
	if a.Response.Push == nil || len(a.Response.Push.Traces) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.proxyLocked(a.Stream, a.Response.Push, false)
	if p == nil {
		return
	}
	p.outstanding--
	for i := range p.responses {
		if r := &p.responses[i]; r.nonce == a.Response.Nonce {
			r.answered = a.At
			if a.Err != nil {
				r.nack = a.Err.Message()
			}
		}
	}
	if p.pushed && p.outstanding <= 0 {
		t.finishLocked(p, "")
	}
}

// Pushed records the end of a traced push's sending to one proxy.
func (t *PushTracer) Pushed(e Push) {
	if e.Request == nil || len(e.Request.Traces) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.proxyLocked(e.Stream, e.Request, true)
	p.pushed, p.queued, p.started, p.done, p.err = true, e.Queued, e.Started, e.Done, e.Err
	switch {
	case e.Err != nil:
		t.finishLocked(p, "push failed")
	case p.outstanding <= 0:
		t.finishLocked(p, "")
	}
}

// Disconnected gives up the stream's pushes: its proxy will not answer.
func (t *PushTracer) Disconnected(s StreamInfo) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range t.streams[s.ID] {
		t.finishLocked(p, "disconnected")
	}
	for pt := range t.traces {
		if _, ok := pt.waiting[s.ID]; ok {
			pt.gone++
			t.doneLocked(pt, s.ID)
		}
	}
}

// doneLocked notes that stream id is done with pt, ending pt after the last one.
func (t *PushTracer) doneLocked(pt *PushTrace, id int64) {
	delete(pt.waiting, id)
	if pt.sealed && len(pt.waiting) == 0 {
		pt.endLocked(t.now())
	}
}

// finishLocked stops following p: it records its spans and tallies it in its pushes.
func (t *PushTracer) finishLocked(p *proxyPush, gone string) {
	pushes := t.streams[p.stream.ID]
	if i := slices.Index(pushes, p); i >= 0 {
		pushes = slices.Delete(pushes, i, i+1)
	}
	if len(pushes) == 0 {
		delete(t.streams, p.stream.ID)
	} else {
		t.streams[p.stream.ID] = pushes
	}
	start, end := p.queued, p.done
	nack := ""
	for _, r := range p.responses {
		for _, at := range []time.Time{r.began, r.sent} {
			if !at.IsZero() && (start.IsZero() || at.Before(start)) {
				start = at
			}
		}
		end = later(end, r.sent, r.answered)
		if r.nack != "" {
			nack = r.nack
		}
	}
	if end.IsZero() {
		end = t.now()
	}
	spansDone := false
	for _, pt := range p.req.Traces {
		if pt.ended {
			continue
		}
		if _, ok := pt.waiting[p.stream.ID]; !ok {
			continue
		}
		switch {
		case gone != "":
			pt.gone++
		case nack != "":
			pt.nacked++
		default:
			pt.acked++
		}
		if !start.IsZero() {
			if took := end.Sub(start); took > pt.slowest {
				pt.slowest, pt.slowestNode = took, p.stream.Proxy.NodeID
			}
		}
		if gone == "" {
			pt.last = later(pt.last, end)
		}
		if !spansDone && pt.proxySpans < t.maxProxySpans {
			pt.proxySpans++
			spansDone = true
			p.record(pt.ctx, start, end, gone)
		}
		t.doneLocked(pt, p.stream.ID)
	}
}

// record writes the proxy's spans, children of ctx's xds.push span, after the fact.
func (p *proxyPush) record(ctx context.Context, start, end time.Time, gone string) {
	tr := tracer()
	attrs := []attribute.KeyValue{attribute.String("sailplane.node", p.stream.Proxy.NodeID),
		attribute.String("sailplane.proxy_type", string(p.stream.Proxy.Type)), attribute.Int64("sailplane.stream", p.stream.ID),
		attribute.Bool("sailplane.delta", p.stream.Delta)}
	if p.stream.Peer != "" {
		attrs = append(attrs, attribute.String("sailplane.peer", p.stream.Peer))
	}
	if gone != "" {
		attrs = append(attrs, attribute.String("sailplane.unanswered", gone))
	}
	ctx, span := tr.Start(ctx, "xds.proxy", trace.WithTimestamp(start), trace.WithAttributes(attrs...))
	prev := p.started
	if !p.queued.IsZero() && !p.started.IsZero() {
		_, q := tr.Start(ctx, "xds.queue", trace.WithTimestamp(p.queued))
		q.End(trace.WithTimestamp(p.started))
	}
	for _, r := range p.responses {
		typ := attribute.String("sailplane.type", r.typeURL)
		from := r.built
		if !r.began.IsZero() && !r.built.IsZero() {
			_, gen := tr.Start(ctx, "xds.generate", trace.WithTimestamp(r.began), trace.WithAttributes(typ))
			gen.End(trace.WithTimestamp(r.built))
		} else if from = prev; from.IsZero() || from.After(r.sent) {
			from = r.sent
		}
		_, send := tr.Start(ctx, "xds.send", trace.WithTimestamp(from), trace.WithAttributes(
			typ, attribute.String("sailplane.nonce", r.nonce),
			attribute.Int("sailplane.resources", r.resources), attribute.Int("sailplane.removed", r.removed),
			attribute.Int("sailplane.bytes", r.bytes)))
		send.End(trace.WithTimestamp(r.sent))
		prev = r.sent
		if r.answered.IsZero() {
			continue
		}
		_, ack := tr.Start(ctx, "xds.ack", trace.WithTimestamp(r.sent), trace.WithAttributes(
			typ, attribute.String("sailplane.nonce", r.nonce)))
		if r.nack != "" {
			ack.SetStatus(codes.Error, r.nack)
		}
		ack.End(trace.WithTimestamp(r.answered))
	}
	if p.err != nil {
		span.SetStatus(codes.Error, p.err.Error())
	}
	span.End(trace.WithTimestamp(end))
}

// later is the latest of ts, ignoring zero times.
func later(ts ...time.Time) time.Time {
	var out time.Time
	for _, t := range ts {
		if t.After(out) {
			out = t
		}
	}
	return out
}
