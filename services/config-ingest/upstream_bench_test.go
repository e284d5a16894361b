package configingest_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
	networking "istio.io/api/networking/v1alpha3"

	"sailplane.dev/services/config-ingest/internal/upstream"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/testwait"
)

// Issue 19: an upstream config-ingest (files mode) holding 1,000 resources, read as xds:// by a
// downstream config-ingest whose bus has a consumer, as xds-server is one. Both run with their
// production defaults (100 ms debounce of the upstream's files, 100 ms–2 s reconnect backoff).
//
//	go test -run '^$' -bench 'Upstream' -benchtime 50x ./services/config-ingest/
const (
	benchVS = 500
	benchDR = 500
)

// BenchmarkUpstreamEdit: one upstream VirtualService file edited (write and rename) per
// iteration, timed until the downstream bus's consumer receives the new route.
func BenchmarkUpstreamEdit(b *testing.B) {
	f := newUpstreamFixture(b)
	var lat []time.Duration
	for i := 0; b.Loop(); i++ {
		host := fmt.Sprintf("edit-%d", i)
		start := time.Now()
		write(b, filepath.Join(f.up.conf(), "vs-0007.yaml"), benchVirtualService(7, host))
		lat = append(lat, f.consumer.wait(b, "default/vs-0007", host).Sub(start))
	}
	b.StopTimer()
	reportPercentiles(b, lat, "edit")
}

// BenchmarkUpstreamRestart: the upstream stopped and started again over the same folder; timed
// until the downstream has applied the full state of every type again (restart: from the
// upstream's start; upstream-ready: its own first state from its 1,000 files; resync: from that
// ready, reconnect backoff included), with what the resync costs:
// bytes and messages received, resources republished on its bus (0: nothing changed), and the
// process's CPU from the upstream's ready to the resync (both ends: they share the process).
func BenchmarkUpstreamRestart(b *testing.B) {
	f := newUpstreamFixture(b)
	var total, ready, afterReady []time.Duration
	var cpu time.Duration
	var bytes, msgs, republished int64
	for b.Loop() {
		f.up.stop()
		testwait.Until(b, 10*time.Second, "the downstream's connection to its upstream closed", func() bool { return f.wire.ended() > 0 })
		f.wire.reset()
		f.pub.reset()
		start := time.Now()
		f.up.start(true)
		readyAt, cpu0 := time.Now(), cpuTime()
		var done time.Time
		testwait.Until(b, 30*time.Second, "the downstream resynced", func() bool {
			var ok bool
			done, ok = f.wire.syncedAt(len(upstream.Types()))
			return ok
		})
		cpu += cpuTime() - cpu0
		total = append(total, done.Sub(start))
		ready = append(ready, readyAt.Sub(start))
		afterReady = append(afterReady, done.Sub(readyAt))
		bytes += f.wire.bytesIn()
		msgs += f.wire.msgsIn()
		// Nothing changed upstream: the downstream diffs the full states against what it holds.
		if n := f.pub.count(); n != 0 {
			b.Errorf("an unchanged upstream's resync republished %d resources on the downstream's bus", n)
			republished += n
		}
		if vs, dr := len(f.down.store.List(schema.VirtualService.TypeURL)), len(f.down.store.List(schema.DestinationRule.TypeURL)); vs != benchVS || dr != benchDR {
			b.Fatalf("after the resync the downstream holds %d VirtualServices and %d DestinationRules", vs, dr)
		}
	}
	b.StopTimer()
	n := float64(len(total))
	reportPercentiles(b, total, "restart")
	reportPercentiles(b, ready, "upstream-ready")
	reportPercentiles(b, afterReady, "resync")
	b.ReportMetric(float64(cpu.Milliseconds())/n, "resync-cpu-ms")
	b.ReportMetric(float64(bytes)/n/1024, "resync-KiB")
	b.ReportMetric(float64(msgs)/n, "resync-msgs")
	b.ReportMetric(float64(republished)/n, "republished")
}

func reportPercentiles(b *testing.B, d []time.Duration, name string) {
	slices.Sort(d)
	at := func(p float64) float64 {
		return float64(d[min(len(d)-1, int(p*float64(len(d))))].Microseconds()) / 1000
	}
	b.ReportMetric(at(0.50), name+"-p50-ms")
	b.ReportMetric(at(0.99), name+"-p99-ms")
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

type upstreamFixture struct {
	up, down *ingest
	wire     *wireStats
	pub      *countingPublisher
	consumer *vsWatch
}

// newUpstreamFixture starts the upstream over 1,000 generated resources, the downstream reading
// it, and a consumer of the downstream's bus, and waits until that consumer has them all.
func newUpstreamFixture(b *testing.B) *upstreamFixture {
	f := &upstreamFixture{wire: &wireStats{}}
	f.up, _ = newBenchIngest(b, "rootNamespace: istio-system\n")
	for i := range benchVS {
		write(b, filepath.Join(f.up.conf(), fmt.Sprintf("vs-%04d.yaml", i)), benchVirtualService(i, fmt.Sprintf("svc-%d", i)))
	}
	for i := range benchDR {
		write(b, filepath.Join(f.up.conf(), fmt.Sprintf("dr-%04d.yaml", i)), fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: dr-%04d, namespace: default}
spec:
  host: svc-%d
  trafficPolicy: {connectionPool: {tcp: {maxConnections: 100}}}
  subsets:
  - {name: v1, labels: {version: v1}}
`, i, i))
	}
	f.up.start(true)

	f.down, f.pub = newBenchIngest(b, "configSources:\n- address: xds://"+f.up.addr+"\n  tlsSettings: {mode: DISABLE}\n")
	f.down.dial = []bus.DialOption{bus.WithGRPCDialOptions(grpc.WithStatsHandler(f.wire))}
	f.down.start(true) // ready once the upstream's first full state is applied

	f.consumer = &vsWatch{seen: map[string]vsSeen{}, changed: make(chan struct{}), synced: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- bus.Dial(f.down.addr).Subscribe(ctx, []string{schema.VirtualService.TypeURL}, f.consumer)
	}()
	b.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("consumer: %v", err)
		}
	})
	select {
	case <-f.consumer.synced:
	case <-time.After(30 * time.Second):
		b.Fatal("the downstream's consumer did not sync")
	}
	if n := f.consumer.count(); n != benchVS {
		b.Fatalf("the downstream's consumer has %d VirtualServices, want %d", n, benchVS)
	}
	return f
}

func benchVirtualService(i int, host string) string {
	return fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: vs-%04d, namespace: default}
spec:
  hosts: [svc-%d]
  http:
  - match: [{uri: {prefix: /api}}]
    route:
    - destination: {host: %s, subset: v1}
      weight: 100
    timeout: 5s
`, i, i, host)
}

// newBenchIngest is an ingest with config-ingest's production defaults (debounce, reconnect
// backoff), a quiet log, and a bus Publisher that counts what it is given.
func newBenchIngest(tb testing.TB, mesh string) (*ingest, *countingPublisher) {
	in := newIngest(tb, mesh)
	in.debounce, in.dial, in.logLevel = 0, nil, slog.LevelWarn
	counter := &countingPublisher{}
	in.publish = func(p bus.Publisher) bus.Publisher { counter.Publisher = p; return counter }
	return in, counter
}

// countingPublisher counts the resources published (upserted, replaced or deleted).
type countingPublisher struct {
	bus.Publisher
	mu sync.Mutex
	n  int64
}

func (p *countingPublisher) add(n int) {
	p.mu.Lock()
	p.n += int64(n)
	p.mu.Unlock()
}

func (p *countingPublisher) Upsert(typeURL string, rs ...*bus.Resource) error {
	p.add(len(rs))
	return p.Publisher.Upsert(typeURL, rs...)
}

func (p *countingPublisher) Delete(typeURL string, names ...string) {
	p.add(len(names))
	p.Publisher.Delete(typeURL, names...)
}

func (p *countingPublisher) Replace(typeURL string, rs []*bus.Resource) error {
	p.add(len(rs))
	return p.Publisher.Replace(typeURL, rs)
}

func (p *countingPublisher) count() int64 { p.mu.Lock(); defer p.mu.Unlock(); return p.n }
func (p *countingPublisher) reset()       { p.mu.Lock(); p.n = 0; p.mu.Unlock() }

// wireStats is a gRPC stats handler on the downstream's upstream connections: what it received,
// and when it had ACKed (so applied) a full state of every type since its connection began.
type wireStats struct {
	mu     sync.Mutex
	ends   int
	bytes  int64
	msgs   int64
	acks   int
	acksAt time.Time
}

func (w *wireStats) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context   { return ctx }
func (w *wireStats) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

func (w *wireStats) HandleConn(_ context.Context, s stats.ConnStats) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch s.(type) {
	case *stats.ConnEnd:
		w.ends++
	}
}

func (w *wireStats) HandleRPC(_ context.Context, s stats.RPCStats) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch p := s.(type) {
	case *stats.InPayload:
		w.bytes += int64(p.WireLength)
		w.msgs++
	case *stats.OutPayload:
		// The consumer ACKs (or NACKs) a response once it has applied it.
		if req, ok := p.Payload.(*discoveryv3.DiscoveryRequest); ok && req.GetResponseNonce() != "" {
			w.acks++
			w.acksAt = time.Now()
		}
	}
}

func (w *wireStats) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ends, w.bytes, w.msgs, w.acks = 0, 0, 0, 0
}

// syncedAt returns when the want-th ACK since the reset was sent.
func (w *wireStats) syncedAt(want int) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.acksAt, w.acks >= want
}

func (w *wireStats) ended() int     { w.mu.Lock(); defer w.mu.Unlock(); return w.ends }
func (w *wireStats) bytesIn() int64 { w.mu.Lock(); defer w.mu.Unlock(); return w.bytes }
func (w *wireStats) msgsIn() int64  { w.mu.Lock(); defer w.mu.Unlock(); return w.msgs }

// vsWatch is a consumer of the downstream's bus: when each VirtualService's route host arrived.
type vsWatch struct {
	mu      sync.Mutex
	seen    map[string]vsSeen
	changed chan struct{} // closed and replaced on every change
	synced  chan struct{}
}

type vsSeen struct {
	host string
	at   time.Time
}

func (w *vsWatch) Apply(c bus.Change) error {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range c.Updated {
		vs := r.Body.(*networking.VirtualService)
		w.seen[r.Name] = vsSeen{host: vs.GetHttp()[0].GetRoute()[0].GetDestination().GetHost(), at: now}
	}
	for _, n := range c.Removed {
		delete(w.seen, n)
	}
	close(w.changed)
	w.changed = make(chan struct{})
	return nil
}

func (w *vsWatch) Synced() { close(w.synced) }

func (w *vsWatch) count() int { w.mu.Lock(); defer w.mu.Unlock(); return len(w.seen) }

// wait returns when name's route host became host.
func (w *vsWatch) wait(tb testing.TB, name, host string) time.Time {
	deadline := time.After(10 * time.Second)
	for {
		w.mu.Lock()
		s, ch := w.seen[name], w.changed
		w.mu.Unlock()
		if s.host == host {
			return s.at
		}
		select {
		case <-ch:
		case <-deadline:
			tb.Fatalf("%s: route host %q not received within 10s (has %q)", name, host, s.host)
		}
	}
}
