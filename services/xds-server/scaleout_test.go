package xdsserver

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"sailplane.dev/services/xds-server/internal/fakebus"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/telemetry/telemetrytest"
)

// replica is one xds-server over a shared bus; stop ends it.
type replica struct {
	srv  *Server
	stop func()
}

// startReplica serves src with cfg; metrics, when given, records the server's metrics.
func startReplica(t *testing.T, cfg Config, src bus.Source, metrics ...*telemetrytest.Metrics) *replica {
	t.Helper()
	cfg.Debounce = 5 * time.Millisecond
	cfg.CacheAssert = true
	deps := Deps{Logger: testLogger(t), Config: src, Registry: src}
	if len(metrics) > 0 {
		deps.MeterProvider = metrics[0].Provider()
	}
	srv, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ctx, lis) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-errc; err != nil {
				t.Errorf("Serve: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	select {
	case <-srv.Ready():
	case <-time.After(waitFor):
		t.Fatal("replica not ready")
	}
	return &replica{srv: srv, stop: stop}
}

// client is a raw SotW ADS client that moves to the next address whenever its stream ends.
type client struct {
	mu      sync.Mutex
	version string
	addr    string
}

func (c *client) state() (string, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.version, c.addr
}

func (c *client) run(ctx context.Context, id int, addrs []string) {
	for i := id; ctx.Err() == nil; i++ {
		addr := addrs[i%len(addrs)]
		c.session(ctx, id, addr)
		// Back off a little before the next address, as real clients do.
		t := time.NewTimer(5 * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

func (c *client) session(ctx context.Context, id int, addr string) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return
	}
	defer conn.Close()
	stream, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return
	}
	if err := stream.Send(&discoverygrpc.DiscoveryRequest{Node: testNode(fmt.Sprintf("client-%d", id)), TypeUrl: resource.ClusterType}); err != nil {
		return
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return
		}
		c.mu.Lock()
		c.version, c.addr = resp.GetVersionInfo(), addr
		c.mu.Unlock()
		if err := stream.Send(&discoverygrpc.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: resp.GetVersionInfo(),
			ResponseNonce: resp.GetNonce()}); err != nil {
			return
		}
	}
}

// Two replicas, 50 clients over both; one replica dies; every client reconnects to the other
// and converges on the same configuration, which keeps following changes.
func TestScaleOut(t *testing.T) {
	const n = 50
	src := fakebus.New(changes(t, registry(10001, 10002))...)
	a, b := startReplica(t, Config{}, src), startReplica(t, Config{}, src)
	addrs := []string{a.srv.Addr().String(), b.srv.Addr().String()}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	clients := make([]*client, n)
	for i := range clients {
		clients[i] = &client{}
		wg.Go(func() { clients[i].run(ctx, i, addrs) })
	}
	defer func() {
		cancel()
		wg.Wait()
	}()
	converged := func(onlyOn string) func() bool {
		return func() bool {
			first, _ := clients[0].state()
			for _, c := range clients {
				v, addr := c.state()
				if v == "" || v != first || (onlyOn != "" && addr != onlyOn) {
					return false
				}
			}
			return true
		}
	}
	waitUntil(t, converged(""))
	before, _ := clients[0].state()
	a.stop()
	src.Push(changes(t, `
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: echo, namespace: demo}
spec:
  host: echo
  subsets:
  - {name: v3, labels: {version: v3}}
`)[0])
	// Converged on the survivor alone is not enough: clients may settle there on the old
	// version before the change is pushed; they must all hold the new one.
	onSurvivorWithChange := converged(addrs[1])
	waitUntil(t, func() bool {
		v, _ := clients[0].state()
		return v != before && onSurvivorWithChange()
	})
	if got := b.srv.xds.Connections(); got != n {
		t.Fatalf("surviving replica has %d connections, want %d", got, n)
	}
}

// Past MaxConnectionAge the server closes the connection; the client reconnects and is
// served again.
func TestMaxConnectionAge(t *testing.T) {
	src := fakebus.New(changes(t, registry(10001, 10002))...)
	r := startReplica(t, Config{MaxConnectionAge: 100 * time.Millisecond, MaxConnectionAgeGrace: 50 * time.Millisecond}, src)
	conn, err := grpc.NewClient(r.srv.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ads := discoverygrpc.NewAggregatedDiscoveryServiceClient(conn)
	for round := range 2 {
		stream, err := ads.StreamAggregatedResources(streamContext(t), grpc.WaitForReady(true))
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&discoverygrpc.DiscoveryRequest{Node: testNode("aged"), TypeUrl: resource.ClusterType}); err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		// Nothing else is pushed: the next thing the stream sees is its connection closing.
		_, err = stream.Recv()
		if code := status.Code(err); code != codes.Unavailable {
			t.Fatalf("round %d: stream ended with %v, want Unavailable", round, err)
		}
	}
}
