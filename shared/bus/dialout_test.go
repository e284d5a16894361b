package bus_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/bus/bustest"
	"sailplane.dev/shared/spiffe"
	"sailplane.dev/shared/testlog"
	"sailplane.dev/shared/workloadcert"
)

var remoteID = spiffe.ID{TrustDomain: "cluster.local", Namespace: "istio-system", ServiceAccount: "remote-endpoint-watcher"}

// accepted records the producers an Acceptor was handed and subscribes each to vsType.
type accepted struct {
	mu    sync.Mutex
	peers []spiffe.ID
	recs  []*bustest.Recorder
	// endAfterSync makes the first stream end once synced, for the dialer to reconnect.
	endAfterSync bool
}

func (a *accepted) accept(ctx context.Context, peer spiffe.ID, src bus.Source) {
	r := bustest.NewRecorder()
	a.mu.Lock()
	a.peers = append(a.peers, peer)
	a.recs = append(a.recs, r)
	end := a.endAfterSync && len(a.recs) == 1
	a.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var h bus.Handler = r
	if end {
		h = cancelOnSync{r, cancel}
	}
	err := src.Subscribe(ctx, []string{vsType}, h)
	if err != nil && !errors.Is(err, bus.ErrStreamEnded) {
		panic(err)
	}
}

// cancelOnSync ends its subscription once synced.
type cancelOnSync struct {
	*bustest.Recorder
	cancel func()
}

func (c cancelOnSync) Synced() { c.Recorder.Synced(); c.cancel() }

func (a *accepted) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.recs)
}

func (a *accepted) rec(i int) *bustest.Recorder {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.recs[i]
}

// dialOut runs bus.DialOut until the test ends.
func dialOut(t *testing.T, addr string, s *bus.Store, opts ...bus.DialOption) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- bus.DialOut(ctx, addr, s, opts...) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("DialOut: %v", err)
		}
	})
}

// TestDialOut: a producer that dials the consumer's bus (reverse ADS, over mTLS both ways) has
// its Store's state and changes delivered to the consumer, which opened no connection; the
// dialer's identity may dial in but not consume the bus.
func TestDialOut(t *testing.T) {
	auth := newAuthority(t)
	log := testlog.New(t, slog.LevelDebug)
	central := bus.NewStore(bus.WithLogger(log))
	var acc accepted
	acceptor := bus.NewAcceptor([]spiffe.ID{remoteID}, acc.accept, bus.WithAcceptorLogger(log))
	addr := bustest.Serve(t, central, log, bus.Security{Identity: newIdentity(t, auth, ingestID), Peers: peers}, acceptor)

	remote := bus.NewStore(bus.WithLogger(log))
	if err := remote.Upsert(vsType, bustest.VirtualService("ns/a", "", "a")); err != nil {
		t.Fatal(err)
	}
	remoteIdentity := newIdentity(t, auth, remoteID)
	dialOut(t, addr, remote, bus.WithDialLogger(log), bus.WithBackoff(10*time.Millisecond, 50*time.Millisecond),
		bus.WithSecurity(bus.Security{Identity: remoteIdentity, Peers: []spiffe.ID{ingestID}}))

	bustest.WaitFor(t, "the producer dialing in", func() bool { return acc.count() == 1 })
	if acc.peers[0] != remoteID {
		t.Errorf("accepted peer %s, want %s", acc.peers[0], remoteID)
	}
	bustest.WaitConverged(t, remote, acc.rec(0), vsType)
	if err := remote.Upsert(vsType, bustest.VirtualService("ns/b", "", "b")); err != nil {
		t.Fatal(err)
	}
	remote.Delete(vsType, "ns/a")
	bustest.WaitConverged(t, remote, acc.rec(0), vsType)

	// Allowed to dial in is not allowed to read the bus.
	err := rawDelta(t, addr, credentials.NewTLS(workloadcert.ClientTLS(remoteIdentity, func(spiffe.ID) error { return nil })))
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("dial-in identity consuming the bus: %v, want PermissionDenied", err)
	}
}

// TestDialOutRefused: an identity not allowed to dial in is refused (logged), and a dialer
// refuses a consumer whose identity it does not expect: neither is handed to the Acceptor.
func TestDialOutRefused(t *testing.T) {
	auth := newAuthority(t)
	log, logged := testlog.NewRecording(t, slog.LevelDebug)
	central := bus.NewStore(bus.WithLogger(log))
	var acc accepted
	acceptor := bus.NewAcceptor([]spiffe.ID{remoteID}, acc.accept, bus.WithAcceptorLogger(log))
	addr := bustest.Serve(t, central, log, bus.Security{Identity: newIdentity(t, auth, ingestID), Peers: peers}, acceptor)
	remote := bus.NewStore(bus.WithLogger(log))

	t.Run("ForeignDialer", func(t *testing.T) {
		dialOut(t, addr, remote, bus.WithDialLogger(log),
			bus.WithSecurity(bus.Security{Identity: newIdentity(t, auth, foreignID), Peers: []spiffe.ID{ingestID}}))
		bustest.WaitFor(t, "the foreign dialer refused", func() bool { return logged.Count("bus peer refused") > 0 })
	})
	t.Run("UnexpectedConsumer", func(t *testing.T) {
		dialOut(t, addr, remote, bus.WithDialLogger(log),
			bus.WithSecurity(bus.Security{Identity: newIdentity(t, auth, remoteID), Peers: []spiffe.ID{xdsID}}))
		bustest.WaitFor(t, "the dialer refusing the consumer", func() bool { return logged.Count("bus client refused: TLS handshake failed") > 0 })
	})
	if n := acc.count(); n != 0 {
		t.Errorf("%d refused producers handed to the Acceptor", n)
	}
	if err := bus.DialOut(context.Background(), "192.0.2.1:15010", remote); !errors.Is(err, bus.ErrPlaintext) {
		t.Errorf("plaintext dial-out off loopback: %v, want ErrPlaintext", err)
	}
}

// TestDialOutReconnect: when the stream ends the dialer reconnects and delivers its full state
// on the new stream.
func TestDialOutReconnect(t *testing.T) {
	log := testlog.New(t, slog.LevelDebug)
	central := bus.NewStore(bus.WithLogger(log))
	acc := accepted{endAfterSync: true}
	acceptor := bus.NewAcceptor(nil, acc.accept, bus.WithAcceptorLogger(log), bus.WithAcceptorPlaintext())
	addr := bustest.Serve(t, central, log, bus.Security{}, acceptor)
	remote := bus.NewStore(bus.WithLogger(log))
	if err := remote.Upsert(vsType, bustest.VirtualService("ns/a", "", "a")); err != nil {
		t.Fatal(err)
	}
	dialOut(t, addr, remote, bus.WithDialLogger(log), bus.WithBackoff(10*time.Millisecond, 50*time.Millisecond))
	bustest.WaitFor(t, "the dialer reconnecting", func() bool { return acc.count() == 2 })
	bustest.WaitConverged(t, remote, acc.rec(1), vsType)
	if acc.rec(0).SyncedCount() != 1 {
		t.Errorf("first stream synced %d times, want 1", acc.rec(0).SyncedCount())
	}
}
