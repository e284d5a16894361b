package bus_test

import (
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/bus/bustest"
	"sailplane.dev/shared/testlog"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func testLogger(t testing.TB) *slog.Logger {
	return testlog.New(t, slog.LevelDebug)
}

func TestConformanceLocal(t *testing.T) {
	bustest.Run(t, func(t *testing.T, s *bus.Store) bus.Source { return bus.Local(s) })
}

func TestConformanceDelta(t *testing.T) {
	bustest.Run(t, func(t *testing.T, s *bus.Store) bus.Source {
		p := startPeer(t, s)
		p.Source = bus.Dial(p.addr, bus.WithDialLogger(testLogger(t)), bus.WithNodeID("delta-consumer"),
			bus.WithBackoff(5*time.Millisecond, 100*time.Millisecond))
		return p
	})
}

func TestConformanceSotW(t *testing.T) {
	bustest.Run(t, func(t *testing.T, s *bus.Store) bus.Source {
		p := startPeer(t, s)
		p.Source = bus.DialSotW(p.addr, bus.WithDialLogger(testLogger(t)), bus.WithNodeID("sotw-consumer"),
			bus.WithBackoff(5*time.Millisecond, 100*time.Millisecond))
		return p
	})
}

// peer is a gRPC bus server on 127.0.0.1 that can be stopped and restarted on the same address
// and Store, with the consumer Source under test.
type peer struct {
	bus.Source
	t     *testing.T
	store *bus.Store
	addr  string
	mu    sync.Mutex
	gs    *grpc.Server
}

var _ bustest.Reconnector = (*peer)(nil)

func startPeer(t *testing.T, s *bus.Store) *peer {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &peer{t: t, store: s, addr: lis.Addr().String()}
	p.serve(lis)
	t.Cleanup(func() { p.Disconnect(t) })
	return p
}

func (p *peer) serve(lis net.Listener) {
	gs := grpc.NewServer()
	bus.NewServer(p.store, bus.WithServerLogger(testLogger(p.t))).Register(gs)
	p.mu.Lock()
	p.gs = gs
	p.mu.Unlock()
	go func() { _ = gs.Serve(lis) }()
}

func (p *peer) Disconnect(t *testing.T) {
	p.mu.Lock()
	gs := p.gs
	p.gs = nil
	p.mu.Unlock()
	if gs != nil {
		gs.Stop()
	}
}

func (p *peer) Reconnect(t *testing.T) {
	lis, err := net.Listen("tcp", p.addr)
	if err != nil {
		t.Fatalf("listening again on %s: %v", p.addr, err)
	}
	p.serve(lis)
}
