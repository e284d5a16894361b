package xdsserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/xds"

	"sailplane.dev/services/xds-server/internal/fakebus"
	"sailplane.dev/services/xds-server/internal/testinput"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/grpctest"
	"sailplane.dev/shared/testlog"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testLogger(t testing.TB) *slog.Logger {
	return testlog.New(t, slog.LevelInfo)
}

const (
	echoHost   = "echo.demo.svc.cluster.local"
	echoTarget = "xds:///echo.demo.svc.cluster.local:7070"
	waitFor    = 20 * time.Second
)

// changes parses YAML test input into bus changes.
func changes(t *testing.T, yaml string) []bus.Change {
	t.Helper()
	items, err := testinput.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return testinput.Changes(items)
}

// registry is the echo service with endpoint v1 on port1 and v2 on port2, both on loopback.
func registry(port1, port2 int) string {
	return fmt.Sprintf(`
apiVersion: sailplane.dev/v1
kind: Service
spec:
  hostname: echo.demo.svc.cluster.local
  namespace: demo
  ports: [{name: grpc, number: 7070, protocol: GRPC}]
---
apiVersion: sailplane.dev/v1
kind: Endpoints
spec:
  hostname: echo.demo.svc.cluster.local
  namespace: demo
  endpoints:
  - {address: 127.0.0.1, ports: {grpc: %d}, labels: {version: v1}}
  - {address: 127.0.0.1, ports: {grpc: %d}, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: echo, namespace: demo}
spec:
  host: echo
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
`, port1, port2)
}

// virtualService sends x-version: v2 to subset v2 and splits the rest w1/w2 across v1/v2.
func virtualService(w1, w2 int) string {
	return fmt.Sprintf(`
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: echo, namespace: demo}
spec:
  hosts: [echo]
  http:
  - match:
    - headers:
        x-version: {exact: v2}
    route:
    - destination: {host: echo, subset: v2}
  - route:
    - destination: {host: echo, subset: v1}
      weight: %d
    - destination: {host: echo, subset: v2}
      weight: %d
`, w1, w2)
}

// startServer serves src on a loopback port and waits until it is ready.
func startServer(t *testing.T, src bus.Source) *Server {
	t.Helper()
	srv, err := New(Config{Debounce: 10 * time.Millisecond, CacheAssert: true}, Deps{Logger: testLogger(t), Config: src, Registry: src})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, srv)
	select {
	case <-srv.Ready():
	case <-time.After(waitFor):
		t.Fatal("server not ready")
	}
	return srv
}

// dialXDS returns a client whose xDS client (and pool) belongs to this test only.
func dialXDS(t *testing.T, server net.Addr, target string) *grpc.ClientConn {
	t.Helper()
	bootstrap := fmt.Sprintf(`{
  "xds_servers": [{"server_uri": %q, "channel_creds": [{"type": "insecure"}], "server_features": ["xds_v3"]}],
  "node": {"id": "sidecar~127.0.0.1~client.demo~demo.svc.cluster.local", "metadata": {"GENERATOR": "grpc", "NAMESPACE": "demo"}, "locality": {}}
}`, server.String())
	builder, err := xds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(builder))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// call makes one RPC and returns the backend port that served it.
func call(t *testing.T, conn *grpc.ClientConn, md ...string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if len(md) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, md...)
	}
	var p peer.Peer
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p), grpc.WaitForReady(true)); err != nil {
		t.Fatalf("RPC: %v", err)
	}
	return p.Addr.(*net.TCPAddr).Port
}

func TestProxylessGRPCClient(t *testing.T) {
	a, b := grpctest.HealthBackend(t), grpctest.HealthBackend(t)
	src := fakebus.New(append(changes(t, registry(a.Port, b.Port)), changes(t, virtualService(80, 20))...)...)
	srv := startServer(t, src)
	conn := dialXDS(t, srv.Addr(), echoTarget)

	t.Run("weighted 80/20", func(t *testing.T) {
		const n = 1000
		counts := map[int]int{}
		for range n {
			counts[call(t, conn)]++
		}
		t.Logf("v1 (port %d): %d, v2 (port %d): %d", a.Port, counts[a.Port], b.Port, counts[b.Port])
		if counts[a.Port]+counts[b.Port] != n {
			t.Fatalf("RPCs reached unknown backends: %v", counts)
		}
		// ±5% of the RPCs; the binomial standard deviation is about 1.3%.
		if got := counts[a.Port]; got < 750 || got > 850 {
			t.Errorf("v1 got %d of %d RPCs, want 800±50", got, n)
		}
	})

	t.Run("header match goes to v2", func(t *testing.T) {
		for range 50 {
			if got := call(t, conn, "x-version", "v2"); got != b.Port {
				t.Fatalf("header-matched RPC reached port %d, want v2 on %d", got, b.Port)
			}
		}
	})

	t.Run("change to 0/100", func(t *testing.T) {
		src.Push(changes(t, virtualService(0, 100))[0])
		// Wait for the new config: 20 v2 answers in a row would happen by chance with 80/20
		// with probability 1e-14.
		deadline := time.Now().Add(waitFor)
		for streak := 0; streak < 20; {
			if time.Now().After(deadline) {
				t.Fatal("RPCs did not move to v2")
			}
			if call(t, conn) == b.Port {
				streak++
			} else {
				streak = 0
			}
		}
		for range 200 {
			if got := call(t, conn); got != b.Port {
				t.Fatalf("RPC reached port %d after 0/100, want v2 on %d", got, b.Port)
			}
		}
	})
}

func TestNewRequiresSources(t *testing.T) {
	src := fakebus.New()
	for _, tc := range []struct {
		name string
		deps Deps
	}{
		{"no config", Deps{Registry: src}},
		{"no registry", Deps{Config: src}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(Config{}, tc.deps); !errors.Is(err, ErrMissingDependency) {
				t.Fatalf("New: %v, want ErrMissingDependency", err)
			}
		})
	}
}

func TestRunListensAndStops(t *testing.T) {
	srv, err := New(Config{Listen: "127.0.0.1:0"}, Deps{Logger: testLogger(t), Config: fakebus.New(), Registry: fakebus.New()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- srv.Run(ctx) }()
	select {
	case <-srv.Ready():
	case err := <-errc:
		t.Fatalf("Run: %v", err)
	case <-time.After(waitFor):
		t.Fatal("not ready")
	}
	if a, ok := srv.Addr().(*net.TCPAddr); !ok || a.Port == 0 {
		t.Fatalf("Addr() = %v", srv.Addr())
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := srv.Run(context.Background()); !errors.Is(err, ErrAlreadyStarted) {
		t.Fatalf("second Run: %v, want ErrAlreadyStarted", err)
	}
}

type failingSource struct{ err error }

func (f failingSource) Subscribe(context.Context, []string, bus.Handler) error { return f.err }

func TestSubscriptionFailureEndsServe(t *testing.T) {
	boom := errors.New("boom")
	srv, err := New(Config{}, Deps{Logger: testLogger(t), Config: fakebus.New(), Registry: failingSource{boom}})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	err = srv.Serve(context.Background(), lis)
	if !errors.Is(err, ErrSubscription) || !errors.Is(err, boom) {
		t.Fatalf("Serve: %v, want ErrSubscription wrapping boom", err)
	}
}
