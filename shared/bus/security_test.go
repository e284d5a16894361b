package bus_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sailplane.dev/shared/testwait"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/bus/bustest"
	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/spiffe"
	"sailplane.dev/shared/testlog"
	"sailplane.dev/shared/workloadcert"
)

// identity is a workload credential signed directly by a test authority, replaceable to
// simulate a renewal.
type identity struct {
	mu  sync.Mutex
	cur *workloadcert.Credential
}

func (i *identity) Current() *workloadcert.Credential {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.cur
}

// renew replaces the credential with a new one (new key, new serial) for the same identity.
func (i *identity) renew(t *testing.T, auth *pki.Authority) {
	t.Helper()
	c := newIdentity(t, auth, i.Current().ID)
	i.mu.Lock()
	i.cur = c.cur
	i.mu.Unlock()
}

func newIdentity(t *testing.T, auth *pki.Authority, id spiffe.ID) *identity {
	t.Helper()
	key, err := pki.GenerateKey(pki.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := auth.Issue(key.Public(), pki.LeafOptions{URIs: []*url.URL{id.URL()}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return &identity{cur: &workloadcert.Credential{ID: id, Key: key, Chain: append([]*x509.Certificate{leaf}, auth.Chain()...), Roots: auth.Roots, Received: time.Now()}}
}

func newAuthority(t *testing.T) *pki.Authority {
	t.Helper()
	auth, err := pki.NewSelfSigned(pki.ECDSAP256, "test", 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return auth
}

var (
	ingestID  = spiffe.ID{TrustDomain: "cluster.local", Namespace: "istio-system", ServiceAccount: "config-ingest"}
	xdsID     = spiffe.ID{TrustDomain: "cluster.local", Namespace: "istio-system", ServiceAccount: "xds-server"}
	foreignID = spiffe.ID{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "web"}
	peers     = bus.SailplanePeers("cluster.local", "istio-system")
)

// serveSecure serves s over mTLS as ingestID, on 127.0.0.1, until the test ends.
func serveSecure(t *testing.T, s *bus.Store, auth *pki.Authority, log *slog.Logger) (addr string, id *identity) {
	t.Helper()
	id = newIdentity(t, auth, ingestID)
	addr = bustest.Serve(t, s, log, bus.Security{Identity: id, Peers: peers})
	return addr, id
}

// rawDelta opens one delta ADS stream with creds and returns the first response's error.
func rawDelta(t *testing.T, addr string, creds credentials.TransportCredentials) error {
	t.Helper()
	return bustest.SubscribeOnce(context.Background(), addr, creds, vsType)
}

// TestBusMTLS: a bus listener with an identity serves Sailplane's identities over mTLS and
// refuses others: a foreign SPIFFE ID with PermissionDenied (logged once), a certificate from
// another root or none at the handshake; a consumer refuses a producer that is not a peer.
func TestBusMTLS(t *testing.T) {
	auth := newAuthority(t)
	log, logged := testlog.NewRecording(t, slog.LevelDebug)
	s := bus.NewStore(bus.WithLogger(log))
	if err := s.Upsert(vsType, bustest.VirtualService("ns/vs", "", "a")); err != nil {
		t.Fatal(err)
	}
	addr, _ := serveSecure(t, s, auth, log)

	t.Run("AllowedIdentitySubscribes", func(t *testing.T) {
		r := bustest.NewRecorder()
		bustest.Subscribe(t, bus.Dial(addr, bus.WithSecurity(bus.Security{Identity: newIdentity(t, auth, xdsID), Peers: peers})), []string{vsType}, r)
		bustest.WaitConverged(t, s, r, vsType)
	})
	t.Run("ForeignIdentityPermissionDenied", func(t *testing.T) {
		web := newIdentity(t, auth, foreignID)
		for range 2 {
			err := rawDelta(t, addr, credentials.NewTLS(workloadcert.ClientTLS(web, func(spiffe.ID) error { return nil })))
			if status.Code(err) != codes.PermissionDenied {
				t.Fatalf("foreign identity: %v, want PermissionDenied", err)
			}
		}
		if n := logged.Count("bus peer refused"); n != 1 {
			t.Errorf("refusal logged %d times, want once per identity", n)
		}
	})
	t.Run("OtherRootRefused", func(t *testing.T) {
		impostor := newIdentity(t, newAuthority(t), xdsID)
		err := rawDelta(t, addr, credentials.NewTLS(workloadcert.ClientTLS(impostor, func(spiffe.ID) error { return nil })))
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("certificate from another root: %v, want a failed handshake (Unavailable)", err)
		}
		waitLogged(t, logged, "bus client refused: TLS handshake failed")
	})
	t.Run("NoClientCertificateRefused", func(t *testing.T) {
		// As istiod's xds:// config source dials with tlsSettings mode SIMPLE.
		for range 2 {
			err := rawDelta(t, addr, credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}))
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("no client certificate: %v, want a failed handshake (Unavailable)", err)
			}
		}
		waitLogged(t, logged, "bus client refused: no client certificate")
	})
	t.Run("PlaintextRefused", func(t *testing.T) {
		// As istiod's xds:// config source dials with any other mode, ISTIO_MUTUAL included.
		for range 2 {
			if err := rawDelta(t, addr, insecure.NewCredentials()); status.Code(err) != codes.Unavailable {
				t.Fatalf("plaintext: %v, want Unavailable", err)
			}
		}
		waitLogged(t, logged, "bus client refused: plaintext client")
	})
	t.Run("ConsumerRefusesForeignProducer", func(t *testing.T) {
		// The consumer accepts only the xds-server identity as producer: the server is config-ingest.
		me := newIdentity(t, auth, xdsID)
		err := rawDelta(t, addr, credentials.NewTLS(workloadcert.ClientTLS(me, func(id spiffe.ID) error {
			if id != xdsID {
				return errors.New("not the expected producer")
			}
			return nil
		})))
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("unexpected producer: %v, want Unavailable", err)
		}
	})
}

// TestBusPlaintextOnlyOnLoopback: without an identity a listener is refused on an address other
// than loopback unless plaintext is asked for.
func TestBusPlaintextOnlyOnLoopback(t *testing.T) {
	for _, tc := range []struct {
		addr  string
		allow bool
		ok    bool
	}{
		{"127.0.0.1:15051", false, true},
		{"[::1]:15051", false, true},
		{"localhost:15051", false, true},
		{"0.0.0.0:15051", false, false},
		{":15051", false, false},
		{"10.0.0.5:15051", false, false},
		{"0.0.0.0:15051", true, true},
	} {
		_, err := bus.ServeGRPC(bus.NewStore(), tc.addr, testLogger(t), bus.Security{AllowPlaintext: tc.allow})
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, bus.ErrPlaintext)) {
			t.Errorf("%s (plaintext allowed: %v): error %v, want ok=%v", tc.addr, tc.allow, err, tc.ok)
		}
	}
}

// TestBusMTLSRotation: both ends renew their certificates while a stream is open; the stream
// carries on (no new connection) and new connections use the new certificates.
func TestBusMTLSRotation(t *testing.T) {
	auth := newAuthority(t)
	s := bus.NewStore(bus.WithLogger(testLogger(t)))
	if err := s.Upsert(vsType, bustest.VirtualService("ns/a", "", "a")); err != nil {
		t.Fatal(err)
	}
	addr, serverID := serveSecure(t, s, auth, testLogger(t))
	clientID := newIdentity(t, auth, xdsID)
	var dials atomic.Int32
	countDials := grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
		dials.Add(1)
		return (&net.Dialer{}).DialContext(ctx, "tcp", a)
	})
	r := bustest.NewRecorder()
	bustest.Subscribe(t, bus.Dial(addr, bus.WithSecurity(bus.Security{Identity: clientID, Peers: peers}), bus.WithGRPCDialOptions(countDials)), []string{vsType}, r)
	bustest.WaitConverged(t, s, r, vsType)

	oldServer, oldClient := serverID.Current().Leaf().SerialNumber, clientID.Current().Leaf().SerialNumber
	serverID.renew(t, auth)
	clientID.renew(t, auth)
	if err := s.Upsert(vsType, bustest.VirtualService("ns/b", "", "b")); err != nil {
		t.Fatal(err)
	}
	bustest.WaitConverged(t, s, r, vsType)
	if n := dials.Load(); n != 1 {
		t.Errorf("%d connections, want the first one kept across the renewal", n)
	}

	// A new connection handshakes with the renewed certificates.
	conn, err := tls.Dial("tcp", addr, func() *tls.Config {
		c := workloadcert.ClientTLS(clientID, func(spiffe.ID) error { return nil })
		c.NextProtos = []string{"h2"}
		return c
	}())
	if err != nil {
		t.Fatal(err)
	}
	seen := conn.ConnectionState()
	conn.Close()
	if got := seen.PeerCertificates[0].SerialNumber; got.Cmp(oldServer) == 0 {
		t.Error("a new connection still got the server's old certificate")
	}
	if clientID.Current().Leaf().SerialNumber.Cmp(oldClient) == 0 {
		t.Error("the client certificate was not renewed")
	}
}

// waitLogged waits until msg was logged once (the server logs a refused handshake after the
// client saw it fail), then checks it was not logged again for the same client and reason.
func waitLogged(t *testing.T, logged *testlog.Messages, msg string) {
	t.Helper()
	testwait.Until(t, 10*time.Second, fmt.Sprintf("%q logged", msg), func() bool { return logged.Count(msg) > 0 })
	if n := logged.Count(msg); n != 1 {
		t.Errorf("%q logged %d times, want once per client host and reason", msg, n)
	}
}
