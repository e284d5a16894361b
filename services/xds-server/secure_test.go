package xdsserver

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/url"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"

	securityv1 "sailplane.dev/proto/security/v1"
	"sailplane.dev/services/xds-server/internal/fakebus"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/spiffe"
)

// TestSecureListenerAndTrustBundle: with only SecureListen set the plaintext port is off, the
// TLS port serves the configured certificate, and the ca's trust bundle published on the bus
// is held (also when it changes), without holding readiness back.
func TestSecureListenerAndTrustBundle(t *testing.T) {
	auth, serving := servingCert(t)

	store := bus.NewStore()
	hold := make(chan struct{}) // the ca has not published yet
	store.SyncAfter(hold, schema.TrustBundle.TypeURL)
	srv, err := New(Config{SecureListen: "127.0.0.1:0"}, Deps{
		Logger: testLogger(t), Config: fakebus.New(), Registry: fakebus.New(), Bundle: bus.Local(store),
		TLS: &tls.Config{Certificates: []tls.Certificate{serving}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- srv.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	select {
	case <-srv.Ready():
	case err := <-errc:
		t.Fatalf("Run: %v", err)
	case <-time.After(waitFor):
		t.Fatal("not ready while the trust bundle is not published")
	}
	if srv.Addr() != nil {
		t.Errorf("plaintext listener %v, want none", srv.Addr())
	}
	conn, err := tls.Dial("tcp", srv.SecureAddr().String(), &tls.Config{RootCAs: auth.RootPool(), ServerName: "istiod.istio-system.svc"})
	if err != nil {
		t.Fatalf("TLS handshake with the root: %v", err)
	}
	conn.Close()
	var unknown x509.UnknownAuthorityError
	if _, err := tls.Dial("tcp", srv.SecureAddr().String(), &tls.Config{ServerName: "istiod.istio-system.svc"}); !errors.As(err, &unknown) {
		t.Errorf("handshake without the root: %v, want unknown authority", err)
	}

	for _, roots := range [][]string{{"root-1"}, {"root-2", "root-1"}} {
		want := &securityv1.TrustBundle{TrustDomain: "cluster.local", RootCertificates: roots}
		if err := store.Replace(schema.TrustBundle.TypeURL, []*bus.Resource{{Name: "cluster.local", Body: want}}); err != nil {
			t.Fatal(err)
		}
		if hold != nil {
			close(hold)
			hold = nil
		}
		waitUntil(t, func() bool { return proto.Equal(srv.TrustBundle("cluster.local"), want) })
	}
}

// servingCert is a new root and a serving certificate it issued for istiod's name.
func servingCert(t testing.TB) (*pki.Authority, tls.Certificate) {
	t.Helper()
	auth, err := pki.NewSelfSigned(pki.ECDSAP256, "cluster.local", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.GenerateKey(pki.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := auth.Issue(key.Public(), pki.LeafOptions{DNSNames: []string{"istiod.istio-system.svc"}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return auth, tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key}
}

// issueFor is a client certificate of the service account ns/sa, from auth.
func issueFor(t testing.TB, auth *pki.Authority, ns, sa string) tls.Certificate {
	t.Helper()
	key, err := pki.GenerateKey(pki.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	id := spiffe.ID{TrustDomain: "cluster.local", Namespace: ns, ServiceAccount: sa}
	leaf, err := auth.Issue(key.Public(), pki.LeafOptions{URIs: []*url.URL{id.URL()}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}
}

// tlsPeer is the context of a stream whose client presented certs over TLS.
func tlsPeer(certs ...tls.Certificate) context.Context {
	var chain []*x509.Certificate
	for _, c := range certs {
		chain = append(chain, c.Leaf)
	}
	return peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: chain}}})
}

func TestSecureListenerNeedsTLS(t *testing.T) {
	_, err := New(Config{SecureListen: "127.0.0.1:0"}, Deps{Config: fakebus.New(), Registry: fakebus.New()})
	if !errors.Is(err, ErrMissingDependency) {
		t.Fatalf("New: %v, want ErrMissingDependency", err)
	}
}

// TestPeerIdentity: a stream's client is named by the SPIFFE ID of a certificate the held trust
// bundle verifies, and by nothing otherwise.
func TestPeerIdentity(t *testing.T) {
	id := spiffe.ID{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "web"}
	trusted, err := pki.NewSelfSigned(pki.ECDSAP256, "cluster.local", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := pki.NewSelfSigned(pki.ECDSAP256, "elsewhere", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{}, Deps{Logger: testLogger(t), Config: fakebus.New(), Registry: fakebus.New()})
	if err != nil {
		t.Fatal(err)
	}
	srv.bundles.bundles["cluster.local"] = &securityv1.TrustBundle{
		TrustDomain: "cluster.local", RootCertificates: []string{string(pki.EncodeCerts(trusted.Cert))},
	}
	for _, tc := range []struct {
		name string
		ctx  context.Context
		want string
	}{
		{"certificate of the trusted root", tlsPeer(issueFor(t, trusted, "demo", "web")), id.String()},
		{"certificate of another root", tlsPeer(issueFor(t, foreign, "demo", "web")), ""},
		{"TLS without a certificate", tlsPeer(), ""},
		{"plaintext", peer.NewContext(context.Background(), &peer.Peer{}), ""},
		{"no peer", context.Background(), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := srv.peerIdentity(tc.ctx); got != tc.want {
				t.Errorf("peerIdentity = %q, want %q", got, tc.want)
			}
		})
	}
}
