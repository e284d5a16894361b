package xds

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"

	"sailplane.dev/services/xds-server/internal/model"
)

// fakeClock fires timers only when the test advances it.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	c     *fakeClock
	ch    chan time.Time
	at    time.Time
	armed bool
}

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeClock) NewTimer(d time.Duration) Timer {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := &fakeTimer{c: f, ch: make(chan time.Time, 1), at: f.now.Add(d), armed: true}
	f.timers = append(f.timers, t)
	return t
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Reset(d time.Duration) {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	t.at, t.armed = t.c.now.Add(d), true
}

func (t *fakeTimer) Stop() {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	t.armed = false
}

// Advance moves time and reports whether a timer fired.
func (f *fakeClock) Advance(d time.Duration) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	fired := false
	for _, t := range f.timers {
		if t.armed && !t.at.After(f.now) {
			t.armed, fired = false, true
			t.ch <- f.now
		}
	}
	return fired
}

func TestDebounce(t *testing.T) {
	for _, tc := range []struct {
		name string
		// steps: signal, then advance by the duration; fired is whether fn ran by the end.
		steps []time.Duration
		fired bool
	}{
		{"quiet period passes", []time.Duration{100 * time.Millisecond}, true},
		{"still within quiet", []time.Duration{99 * time.Millisecond}, false},
		{"burst keeps resetting", []time.Duration{60 * time.Millisecond, 60 * time.Millisecond, 60 * time.Millisecond}, false},
		{"max delay caps a trickle", []time.Duration{90 * time.Millisecond, 90 * time.Millisecond, 90 * time.Millisecond,
			90 * time.Millisecond, 90 * time.Millisecond, 90 * time.Millisecond}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := &fakeClock{now: time.Unix(0, 0)}
			ctx, cancel := context.WithCancel(context.Background())
			in := make(chan struct{})
			step := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				Debounce(ctx, clock, in, 100*time.Millisecond, 500*time.Millisecond, func() { step <- struct{}{} })
			}()
			got := false
			for _, d := range tc.steps {
				in <- struct{}{} // unbuffered: the debouncer took it,
				in <- struct{}{} // and is back in its select, so its timer is reset
				if clock.Advance(d) {
					<-step
					got = true
				}
			}
			cancel()
			<-done
			if got != tc.fired {
				t.Fatalf("fired = %v, want %v", got, tc.fired)
			}
		})
	}
}

func TestPushQueueMerges(t *testing.T) {
	q := newPushQueue[string]()
	q.Enqueue("a", &PushRequest{Endpoints: map[string]struct{}{"x": {}}})
	q.Enqueue("b", &PushRequest{})
	q.Enqueue("a", &PushRequest{Full: true, Configs: map[model.ConfigKey]model.Visibility{{Kind: "VirtualService"}: {All: true}}})
	if q.Len() != 2 {
		t.Fatalf("len = %d, want 2 (one per proxy)", q.Len())
	}
	ctx := context.Background()
	k, req, _, _ := q.Dequeue(ctx)
	if k != "a" || !req.Full || len(req.Endpoints) != 1 || len(req.Configs) != 1 {
		t.Fatalf("first = %s %+v, want merged a", k, req)
	}
	k, _, _, _ = q.Dequeue(ctx)
	if k != "b" {
		t.Fatalf("second = %s", k)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, _, ok := q.Dequeue(cctx); ok {
		t.Fatal("Dequeue on an empty queue with a done context returned ok")
	}
}

// A request for a connection being pushed waits until its push is done (MarkDone), merged
// with any later one, while other connections are dequeued.
func TestPushQueueMarkDone(t *testing.T) {
	q := newPushQueue[string]()
	ctx := context.Background()
	q.Enqueue("a", &PushRequest{})
	if k, _, _, _ := q.Dequeue(ctx); k != "a" {
		t.Fatalf("first = %s", k)
	}
	q.Enqueue("a", &PushRequest{Endpoints: map[string]struct{}{"x": {}}})
	q.Enqueue("b", &PushRequest{})
	q.Enqueue("a", &PushRequest{Full: true})
	if k, _, _, _ := q.Dequeue(ctx); k != "b" {
		t.Fatalf("second = %s, want b: a is being pushed", k)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if k, _, _, ok := q.Dequeue(done); ok {
		t.Fatalf("dequeued %s while a is in progress", k)
	}
	q.MarkDone("a")
	k, req, _, ok := q.Dequeue(done)
	if !ok || k != "a" || !req.Full || len(req.Endpoints) != 1 {
		t.Fatalf("after MarkDone = %s %+v, want a with both requests merged", k, req)
	}
	// Removed while in progress: nothing more comes of it.
	q.Remove("a")
	q.MarkDone("a")
	q.MarkDone("b")
	if q.Len() != 0 {
		t.Fatalf("len = %d after removal", q.Len())
	}
}

// A proxy that stops reading holds one push worker at most: with two workers, the others keep
// being pushed change after change.
func TestSlowProxyHoldsOneWorker(t *testing.T) {
	// Enough clusters that one response outgrows what gRPC buffers for a client not reading
	// (its 64 KiB flow-control window and write quota).
	var hosts []string
	for i := range 600 {
		hosts = append(hosts, fmt.Sprintf("%s-%03d.demo", strings.Repeat("h", 200), i))
	}
	e := newEnv(t, Options{PushConcurrency: 2}, services("demo", hosts...))
	stuck := newSotW(t, e.addr, node("stuck", "demo", false))
	stuck.subscribe(cds) // and never reads
	waitUntil(t, func() bool { return e.srv.Connections() == 1 })
	var healthy []*sotw
	for _, name := range []string{"a", "b", "c"} {
		c := newSotW(t, e.addr, node(name, "demo", false))
		c.subscribe(cds)
		c.recvType(cds)
		healthy = append(healthy, c)
	}
	for i := range 4 {
		e.update(destinationRule("demo", fmt.Sprint("dr", i), hosts[i]))
		for _, c := range healthy {
			c.recvType(cds)
		}
	}
	busy := func() (inProgress, waiting bool) {
		e.srv.mu.Lock()
		defer e.srv.mu.Unlock()
		for c := range e.srv.conns {
			if c.proxy.ID == "stuck.demo" {
				e.srv.queue.mu.Lock()
				defer e.srv.queue.mu.Unlock()
				_, inProgress = e.srv.queue.inProgress[c]
				_, waiting = e.srv.queue.pending[c]
			}
		}
		return inProgress, waiting
	}
	if inProgress, waiting := busy(); !inProgress || !waiting {
		t.Fatalf("stuck proxy: push in progress %t, another waiting %t; want both", inProgress, waiting)
	}
}

func TestPushConcurrencyLimit(t *testing.T) {
	const limit, clients = 2, 6
	e := newEnv(t, Options{PushConcurrency: limit}, baseMesh()...)
	var inFlight, peak atomic.Int32
	release := make(chan struct{})
	e.srv.pushHook = func() {
		n := inFlight.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		<-release
		inFlight.Add(-1)
	}
	var cs []*sotw
	for i := range clients {
		c := newSotW(t, e.addr, node("p"+string(rune('a'+i)), "demo", false))
		c.subscribe(cds)
		c.recvType(cds)
		cs = append(cs, c)
	}
	e.update(destinationRule("demo", "a", "a.demo"))
	waitUntil(t, func() bool { return inFlight.Load() == limit })
	close(release)
	for _, c := range cs {
		c.recvType(cds)
	}
	if p := peak.Load(); p != limit {
		t.Fatalf("peak concurrent pushes = %d, want %d", p, limit)
	}
}

// Changes reach only the proxies and types they can affect.
func TestAffectedProxies(t *testing.T) {
	e := newEnv(t, Options{}, baseMesh()...)
	inA := newSotW(t, e.addr, node("a", "a", true))
	inB := newSotW(t, e.addr, node("b", "b", true))
	router := newSotW(t, e.addr, routerNode("gw", "b"))
	for _, c := range []*sotw{inA, inB, router} {
		c.subscribe(cds)
		c.recvType(cds)
		c.subscribe(lds)
		c.recvType(lds)
	}
	// A service only namespace a sees: b is not pushed.
	e.updatePushed(exportedService("a", "private.a", "."))
	if got := inA.drain(); len(got) == 0 {
		t.Fatal("namespace a not pushed")
	}
	if got := inB.drain(); len(got) != 0 {
		t.Fatalf("namespace b pushed %v for a service it cannot see", types_(got))
	}
	// A VirtualService exported to a only: a's routes only (it watches none, so nothing).
	e.update(virtualService("a", "vs", []string{"."}, "a.demo"))
	if got := inB.drain(); len(got) != 0 {
		t.Fatalf("namespace b pushed %v", types_(got))
	}
	// A Gateway concerns routers only.
	pushes := e.srv.pushes.Load()
	e.update(gateway("b", "gw"))
	waitUntil(t, func() bool { return e.srv.pushes.Load() > pushes })
	if got := e.srv.pushes.Load() - pushes; got != 1 {
		t.Fatalf("%d proxies pushed for a Gateway, want the router only", got)
	}
	if got := inA.drain(); len(got) != 0 {
		t.Fatalf("proxyless client pushed %v for a Gateway", types_(got))
	}
	// A proxyless client asking for an Envoy-only type gets an empty answer.
	inA.subscribe("type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret")
	if resp := inA.recvRaw(); len(resp.GetResources()) != 0 {
		t.Fatalf("secret response = %v", resp.GetResources())
	}
}

func routerNode(name, ns string) *corev3.Node {
	n := node(name, ns, false)
	n.Id = "router~10.0.0.2~" + name + "." + ns + "~" + ns + ".svc.cluster.local"
	return n
}

// An endpoint change pushes endpoints only, and only to who watches them.
func TestEndpointOnlyPush(t *testing.T) {
	e := newEnv(t, Options{}, baseMesh()...)
	watching := newDelta(t, e.addr, node("w", "demo", false))
	other := newDelta(t, e.addr, node("o", "demo", false))
	for _, c := range []*delta{watching, other} {
		for _, typ := range []string{cds, lds} {
			c.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: typ})
			c.recvType(typ)
		}
	}
	watching.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: eds, ResourceNamesSubscribe: []string{cluster("a.demo")}})
	watching.recvType(eds)
	other.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: eds, ResourceNamesSubscribe: []string{cluster("b.demo")}})
	other.recvType(eds)
	calls := e.gen.calls.Load()
	e.updatePushed(endpoints("demo", "a.demo", "10.9.9.9"))
	if got := deltaTypes(watching.drain()); len(got) != 1 || got[0] != "ClusterLoadAssignment" {
		t.Fatalf("watching proxy got %v, want one endpoints response", got)
	}
	if got := other.drain(); len(got) != 0 {
		t.Fatalf("other proxy got %v", deltaTypes(got))
	}
	// One generation of the changed endpoints, shared: not one per proxy or per type.
	if got := e.gen.calls.Load() - calls; got != 1 {
		t.Fatalf("%d generator calls, want 1", got)
	}
}

// Proxies of one scope share one generation per type.
func TestCacheShared(t *testing.T) {
	e := newEnv(t, Options{}, baseMesh()...)
	for i := range 5 {
		c := newSotW(t, e.addr, node("p"+string(rune('a'+i)), "demo", false))
		c.subscribe(cds)
		c.recvType(cds)
	}
	if got := e.gen.calls.Load(); got != 1 {
		t.Fatalf("%d generator calls for 5 proxies of one scope, want 1", got)
	}
}

func TestCacheAssertion(t *testing.T) {
	violations := make(chan error, 16)
	e := newEnv(t, Options{CacheAssert: true, OnCacheViolation: func(err error) { violations <- err }}, baseMesh()...)
	e.gen.leakNode = true // output depends on the node, the scope says it does not
	for _, name := range []string{"p1", "p2"} {
		c := newSotW(t, e.addr, node(name, "demo", false))
		c.subscribe(cds)
		c.recvType(cds)
	}
	select {
	case err := <-violations:
		if !errors.Is(err, ErrCacheInconsistent) {
			t.Fatalf("violation = %v", err)
		}
	default:
		t.Fatal("inconsistent generator not detected")
	}

	// A consistent generator passes.
	ok := newEnv(t, Options{CacheAssert: true, OnCacheViolation: func(err error) { t.Errorf("violation: %v", err) }}, baseMesh()...)
	for _, name := range []string{"p1", "p2"} {
		c := newSotW(t, ok.addr, node(name, "demo", false))
		c.subscribe(cds)
		c.recvType(cds)
	}
}

// TestEndpointPushWhenClusterNamesEqual: a proxyless gRPC client subscribes to CDS and EDS by
// the same names; its EDS watch still gets endpoint-only pushes (subscriptions of different
// types are not shared even with equal names).
func TestEndpointPushWhenClusterNamesEqual(t *testing.T) {
	e := newEnv(t, Options{}, baseMesh()...)
	c := newSotW(t, e.addr, node("g", "demo", false))
	c.subscribe(cds, cluster("a.demo"))
	c.recvType(cds)
	c.subscribe(eds, cluster("a.demo"))
	c.recvType(eds)
	e.updatePushed(endpoints("demo", "a.demo", "10.9.9.9"))
	if got := types_(c.drain()); !slices.Equal(got, []string{"ClusterLoadAssignment"}) {
		t.Fatalf("responses after an endpoint change = %v, want one endpoints response", got)
	}
}

// TestDebounceFunc: the quiet period is asked at each signal, so endpoint-only bursts can
// settle faster than config changes, and a config change joining the burst lengthens it.
func TestDebounceFunc(t *testing.T) {
	for _, tc := range []struct {
		name  string
		quiet []time.Duration // returned at successive signals
		steps []time.Duration // per signal: advance after it
		fired bool
	}{
		{"short quiet fires early", []time.Duration{10 * time.Millisecond}, []time.Duration{10 * time.Millisecond}, true},
		{"long quiet does not", []time.Duration{100 * time.Millisecond}, []time.Duration{10 * time.Millisecond}, false},
		{"config joins the burst", []time.Duration{10 * time.Millisecond, 100 * time.Millisecond},
			[]time.Duration{5 * time.Millisecond, 50 * time.Millisecond}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := &fakeClock{now: time.Unix(0, 0)}
			ctx, cancel := context.WithCancel(context.Background())
			in := make(chan struct{})
			step := make(chan struct{})
			done := make(chan struct{})
			var mu sync.Mutex
			next := 0
			quiet := func() time.Duration {
				mu.Lock()
				defer mu.Unlock()
				return tc.quiet[min(next, len(tc.quiet)-1)]
			}
			go func() {
				defer close(done)
				DebounceFunc(ctx, clock, in, quiet, time.Second, func() { step <- struct{}{} })
			}()
			got := false
			for i, d := range tc.steps {
				mu.Lock()
				next = i
				mu.Unlock()
				in <- struct{}{} // taken,
				in <- struct{}{} // and the timer reset with this step's quiet period
				if clock.Advance(d) {
					<-step
					got = true
				}
			}
			cancel()
			<-done
			if got != tc.fired {
				t.Fatalf("fired = %v, want %v", got, tc.fired)
			}
		})
	}
}
