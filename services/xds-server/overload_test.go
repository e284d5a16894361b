package xdsserver

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"sailplane.dev/services/xds-server/internal/fakebus"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/grpcserver"
	"sailplane.dev/shared/telemetry/telemetrytest"
	"sailplane.dev/shared/testwait"
)

// manyServices is n services of one endpoint each, besides the echo service: a CDS response
// of tens of kilobytes.
func manyServices(n int) string {
	var b strings.Builder
	b.WriteString(registry(10001, 10002))
	for i := range n {
		fmt.Fprintf(&b, `---
apiVersion: sailplane.dev/v1
kind: Service
spec:
  hostname: svc-%d.demo.svc.cluster.local
  namespace: demo
  ports: [{name: grpc, number: 7070, protocol: GRPC}]
---
apiVersion: sailplane.dev/v1
kind: Endpoints
spec:
  hostname: svc-%d.demo.svc.cluster.local
  namespace: demo
  endpoints: [{address: 127.0.0.1, ports: {grpc: 10003}}]
`, i, i)
	}
	return b.String()
}

// subsetChange is a DestinationRule on echo with subset name: every cluster response changes.
func subsetChange(t *testing.T, name string) bus.Change {
	t.Helper()
	return changes(t, fmt.Sprintf(`
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: echo, namespace: demo}
spec:
  host: echo
  subsets: [{name: %s, labels: {version: %s}}]
`, name, name))[0]
}

// A connect storm: 400 streams at once against a server taking 4 initial pushes at a time.
// Streams beyond what fits are refused with Unavailable and a retry delay (RetryInfo and
// gRPC's pushback trailer); retrying after it, every one is served, and never more than 4
// were in their initial push at once.
func TestAdmissionStorm(t *testing.T) {
	const streams, conns, places = 1000, 20, 10
	src := fakebus.New(changes(t, registry(10001, 10002))...)
	metrics := telemetrytest.New(t)
	r := startReplica(t, Config{Overload: Overload{MaxInitializing: places, AdmissionWait: 20 * time.Millisecond, AdmissionRate: -1}}, src, metrics)

	clients := make([]discoverygrpc.AggregatedDiscoveryServiceClient, conns)
	for i := range clients {
		cc, err := grpc.NewClient(r.srv.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cc.Close() })
		clients[i] = discoverygrpc.NewAggregatedDiscoveryServiceClient(cc)
	}
	ctx, cancel := context.WithCancel(streamContext(t))
	defer cancel()
	var refused, served atomic.Int64
	errc := make(chan error, streams)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	start := make(chan struct{})
	for i := range streams {
		wg.Go(func() {
			<-start
			b := grpcserver.Backoff{Initial: 10 * time.Millisecond, Max: time.Second}
			for {
				err := admittedSession(ctx, clients[i%conns], fmt.Sprintf("storm-%d", i), &served)
				if ctx.Err() != nil {
					return
				}
				hint, ok := grpcserver.RetryAfter(err)
				if !ok || hint <= 0 || !strings.Contains(status.Convert(err).Message(), "overloaded") {
					errc <- fmt.Errorf("stream %d: %v, want Unavailable with a retry delay", i, err)
					return
				}
				refused.Add(1)
				select {
				case <-time.After(b.Next(err)):
				case <-ctx.Done():
					return
				}
			}
		})
	}
	close(start)
	testwait.Until(t, waitFor, "every stream served", func() bool {
		select {
		case err := <-errc:
			t.Fatal(err)
		default:
		}
		return served.Load() == streams
	})
	if refused.Load() == 0 {
		t.Fatal("no stream was refused: the storm did not exceed the bound")
	}
	r.srv.admission.mu.Lock()
	peak := r.srv.admission.peak
	r.srv.admission.mu.Unlock()
	if peak > places {
		t.Fatalf("%d streams in their initial push at once, bound %d", peak, places)
	}
	t.Logf("%d streams served, %d refusals, at most %d in their initial push", served.Load(), refused.Load(), peak)
	scraped := metrics.Scrape()
	if got, _ := scraped.Value("sailplane_xds_refused"); got != float64(refused.Load()) {
		t.Errorf("sailplane_xds_refused sums to %v, the clients saw %d refusals", got, refused.Load())
	}
	// A place is given back when the server reads the client's ACK, which the client sends
	// after counting itself served.
	metrics.WaitValue(0, "sailplane_xds_initializing")
}

// admittedSession asks for clusters, ACKs the answer and holds the stream until ctx ends; it
// returns the error that ended the stream before it was answered.
func admittedSession(ctx context.Context, client discoverygrpc.AggregatedDiscoveryServiceClient, node string, served *atomic.Int64) error {
	stream, err := client.StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	if err := stream.Send(&discoverygrpc.DiscoveryRequest{Node: testNode(node), TypeUrl: resource.ClusterType}); err != nil {
		_, err = stream.Recv() // the status says why
		return err
	}
	resp, err := stream.Recv()
	if err != nil {
		return err
	}
	served.Add(1)
	if err := stream.Send(&discoverygrpc.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: resp.GetVersionInfo(),
		ResponseNonce: resp.GetNonce()}); err != nil {
		return nil
	}
	<-ctx.Done()
	return nil
}

// stuckClient opens a stream asking for every cluster and never reads: once the response
// fills its flow-control window, the server's next send blocks.
func stuckClient(t *testing.T, addr string) {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	stream, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(streamContext(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discoverygrpc.DiscoveryRequest{Node: testNode("stuck"), TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
}

// blockedSending counts the streams whose send has been in progress for longer than d.
func (a *admission) blockedSending(d time.Duration) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for s := range a.streams {
		if since := s.sendingSince.Load(); since != 0 && time.Since(time.Unix(0, since)) > d {
			n++
		}
	}
	return n
}

// blockSending connects a client that never reads and pushes changes until done: what its
// blocked send leads to.
func blockSending(t *testing.T, r *replica, src *fakebus.Source, what string, done func() bool) {
	t.Helper()
	stuckClient(t, r.srv.Addr().String())
	n, last := 0, time.Time{}
	testwait.Until(t, waitFor, what, func() bool {
		if done() {
			return true
		}
		if time.Since(last) > 50*time.Millisecond {
			n++
			src.Push(subsetChange(t, fmt.Sprintf("block%d", n)))
			last = time.Now()
		}
		return false
	})
}

// converge connects n clients, waits until they hold the same clusters, then makes the given
// number of changes and waits until every client holds each.
func converge(t *testing.T, r *replica, src *fakebus.Source, n, changes int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	clients := make([]*client, n)
	for i := range clients {
		clients[i] = &client{}
		wg.Go(func() { clients[i].run(ctx, 1000+i, []string{r.srv.Addr().String()}) })
	}
	convergedOn := func(before string) func() bool {
		return func() bool {
			first, _ := clients[0].state()
			for _, c := range clients {
				if v, _ := c.state(); v == "" || v == before || v != first {
					return false
				}
			}
			return true
		}
	}
	waitUntil(t, convergedOn(""))
	for i := range changes {
		before, _ := clients[0].state()
		src.Push(subsetChange(t, fmt.Sprintf("change%d", i)))
		waitUntil(t, convergedOn(before))
	}
}

// A client that stops reading blocks the server's sends to it, and only to it: the other
// proxies keep converging on every change.
func TestStuckClientDoesNotHoldOthers(t *testing.T) {
	src := fakebus.New(changes(t, manyServices(300))...)
	r := startReplica(t, Config{Overload: Overload{SendTimeout: -1}}, src)
	blockSending(t, r, src, "a send blocked", func() bool { return r.srv.admission.blockedSending(200*time.Millisecond) == 1 })
	converge(t, r, src, 10, 5)
	if r.srv.admission.blockedSending(0) != 1 {
		t.Fatal("the stuck client's send is no longer blocked")
	}
}

// Past the send timeout, the connection of a client that stopped reading is closed: its
// stream ends, and the push worker it held is free.
func TestSendTimeoutClosesStuckConnection(t *testing.T) {
	src := fakebus.New(changes(t, manyServices(300))...)
	metrics := telemetrytest.New(t)
	r := startReplica(t, Config{Overload: Overload{SendTimeout: 300 * time.Millisecond}}, src, metrics)
	blockSending(t, r, src, "the stuck connection closed", func() bool {
		return metrics.Value("sailplane_xds_closed_connections", "reason", "send_timeout") == 1
	})
	testwait.Until(t, waitFor, "the stuck stream gone", func() bool {
		return r.srv.admission.Streams() == 0 && r.srv.xds.Connections() == 0
	})
	converge(t, r, src, 3, 1)
}

// manySubsets is a DestinationRule on echo with n subsets named after version: each version
// is a new set of clusters.
func manySubsets(t *testing.T, version, n int) bus.Change {
	t.Helper()
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "  - {name: v%d-%s-%d, labels: {version: v%d}}\n", version, strings.Repeat("x", 100), i, i)
	}
	return changes(t, `
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: echo, namespace: demo}
spec:
  host: echo
  subsets:
`+b.String())[0]
}

// How an unansweringClient answers.
const (
	answersNever     = iota
	answersNACK      // NACKs every response at once
	answersNACKLater // NACKs every response once the next one came
)

// unansweringClient reads every cluster response and never ACKs; last is the latest response
// it got.
func unansweringClient(t *testing.T, addr net.Addr, name string, answers int, last *atomic.Pointer[discoverygrpc.DiscoveryResponse]) {
	t.Helper()
	// For the whole test, however long a loaded machine makes it (streamContext's deadline ended
	// the streams in the middle of a slow run). Fixed HTTP/2 windows keep what a client starved
	// of CPU holds unread small: it is in this process's heap, not the server's memory.
	stream, err := adsClient(t, addr, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10)).
		StreamAggregatedResources(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discoverygrpc.DiscoveryRequest{Node: testNode(name), TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	nack := func(nonce string) {
		_ = stream.Send(&discoverygrpc.DiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: nonce,
			ErrorDetail: &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: "rejected by the test"}})
	}
	go func() {
		previous := ""
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			switch answers {
			case answersNACK:
				nack(resp.GetNonce())
			case answersNACKLater:
				if previous != "" {
					nack(previous)
				}
				previous = resp.GetNonce()
			}
			last.Store(resp)
		}
	}()
}

func heapInUse() uint64 {
	// Twice: pooled buffers survive one collection.
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// A proxy that never answers, and one that rejects everything, cost bounded memory however
// many pushes they get: what the server keeps per response sent is bounded, and rejected
// names that no longer exist are forgotten.
func TestUnansweringClientsBoundedMemory(t *testing.T) {
	const subsets = 40
	src := fakebus.New(changes(t, registry(10001, 10002))...)
	// Not startReplica: the cache's assert mode remembers every value it checked.
	// The NACK backoff kept short: the nacker must get each version soon, held or not.
	srv, err := New(Config{Debounce: 5 * time.Millisecond, NackBackoff: time.Millisecond, MaxNackBackoff: 10 * time.Millisecond},
		Deps{Logger: testLogger(t), Config: src, Registry: src})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, srv)
	<-srv.Ready()
	r := &replica{srv: srv}
	// The late nacker is a loaded proxy (or server): each NACK arrives after the next response
	// went out, which once brought back the names of the response before with every NACK.
	var silentOne, nacker, lateNacker atomic.Pointer[discoverygrpc.DiscoveryResponse]
	unansweringClient(t, r.srv.Addr(), "silent", answersNever, &silentOne)
	unansweringClient(t, r.srv.Addr(), "nacker", answersNACK, &nacker)
	unansweringClient(t, r.srv.Addr(), "late-nacker", answersNACKLater, &lateNacker)
	push := func(version int) int {
		src.Push(manySubsets(t, version, subsets))
		want := fmt.Sprintf("v%d-", version)
		size := 0
		testwait.Until(t, waitFor, fmt.Sprintf("version %d at every client", version), func() bool {
			for _, last := range []*atomic.Pointer[discoverygrpc.DiscoveryResponse]{&silentOne, &nacker, &lateNacker} {
				resp := last.Load()
				if resp == nil || len(resp.GetResources()) != subsets+1 || !strings.Contains(string(resp.GetResources()[1].GetValue()), want) {
					return false
				}
				size = proto.Size(resp)
			}
			return true
		})
		return size
	}
	var size int
	for v := range 10 {
		size = push(v)
	}
	// Keeping something of every push would grow the heap by about pushes × size in each of
	// two windows of pushes in a row; the process's other memory (what a loaded machine's
	// clients have not read yet) can grow it in one window, not in both.
	const pushes = 400
	limit := int64(pushes * size / 4)
	var grown [2]int64
	for i := range grown {
		before := heapInUse()
		for v := 10 + i*pushes; v < 10+(i+1)*pushes; v++ {
			push(v)
		}
		grown[i] = int64(heapInUse()) - int64(before)
		t.Logf("heap grew by %d KiB over %d pushes of %d KiB", grown[i]>>10, pushes, size>>10)
		if grown[i] <= limit {
			return
		}
	}
	t.Fatalf("heap grew by %d and %d KiB over two windows of %d pushes of %d KiB each, more than %d KiB: per-push state is kept",
		grown[0]>>10, grown[1]>>10, pushes, size>>10, limit>>10)
}

// serviceClient is a proxy behind a Kubernetes Service: each connection lands on a random
// replica of those listed.
func serviceClient(ctx context.Context, id int, replicas *atomic.Pointer[[]string]) {
	c := &client{}
	for ctx.Err() == nil {
		addrs := *replicas.Load()
		c.session(ctx, id, addrs[rand.N(len(addrs))])
		t := time.NewTimer(5 * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// Two replicas that know each other (each lists both addresses, as a headless Service's name
// would) and share a pod name (two processes on one host named after it): all 40 proxies start
// on the first; once the second is up, the first closes its newest connections round by round
// until both hold about half.
func TestRebalanceAcrossReplicas(t *testing.T) {
	const proxies = 40
	src := fakebus.New(changes(t, registry(10001, 10002))...)
	var lis [2]net.Listener
	var addrs []string
	for i := range lis {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lis[i] = l
		addrs = append(addrs, l.Addr().String())
	}
	metrics := [2]*telemetrytest.Metrics{telemetrytest.New(t), telemetrytest.New(t)}
	start := func(i int) *Server {
		srv, err := New(Config{Debounce: 5 * time.Millisecond, PodName: "sailplane-0",
			Overload: Overload{Peers: addrs, RebalanceInterval: 100 * time.Millisecond}},
			Deps{Logger: testLogger(t).With("replica", i), Config: src, Registry: src, MeterProvider: metrics[i].Provider()})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- srv.Serve(ctx, lis[i]) }()
		t.Cleanup(func() {
			cancel()
			if err := <-errc; err != nil {
				t.Errorf("Serve: %v", err)
			}
		})
		<-srv.Ready()
		return srv
	}
	a := start(0)
	var replicas atomic.Pointer[[]string]
	replicas.Store(&[]string{addrs[0]})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for i := range proxies {
		wg.Go(func() { serviceClient(ctx, i, &replicas) })
	}
	waitUntil(t, func() bool { return a.admission.Streams() == proxies })

	b := start(1)
	replicas.Store(&addrs)
	testwait.Until(t, waitFor, "connections spread over both replicas", func() bool {
		na, nb := a.admission.Streams(), b.admission.Streams()
		return na+nb == proxies && na >= proxies/2-4 && nb >= proxies/2-4
	})
	t.Logf("replicas hold %d and %d connections", a.admission.Streams(), b.admission.Streams())
	if got := metrics[0].Value("sailplane_xds_closed_connections", "reason", "rebalance"); got < proxies/2-4 {
		t.Errorf("the first replica closed %v connections to rebalance, want at least %d", got, proxies/2-4)
	}
}

// Clients that never answer their initial push hold their place only until
// InitialPushTimeout: with both places taken by such clients, a third proxy is still served.
func TestSilentClientsGiveBackTheirPlace(t *testing.T) {
	src := fakebus.New(changes(t, registry(10001, 10002))...)
	r := startReplica(t, Config{Overload: Overload{MaxInitializing: 2, InitialPushTimeout: 200 * time.Millisecond,
		AdmissionWait: 10 * time.Second, AdmissionRate: -1}}, src)
	var silent [2]atomic.Pointer[discoverygrpc.DiscoveryResponse]
	for i := range silent {
		unansweringClient(t, r.srv.Addr(), fmt.Sprintf("silent-%d", i), answersNever, &silent[i])
	}
	testwait.Until(t, waitFor, "both places taken", func() bool { return silent[0].Load() != nil && silent[1].Load() != nil })
	var served atomic.Int64
	ctx, cancel := context.WithCancel(streamContext(t))
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- admittedSession(ctx, adsClient(t, r.srv.Addr()), "third", &served) }()
	testwait.Until(t, waitFor, "the third proxy served", func() bool { return served.Load() == 1 })
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}
