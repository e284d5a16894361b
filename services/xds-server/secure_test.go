package xdsserver

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	securityv1 "sailplane.dev/proto/security/v1"
	"sailplane.dev/services/xds-server/internal/fakebus"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/schema"
)

// TestSecureListenerAndTrustBundle: with only SecureListen set the plaintext port is off, the
// TLS port serves the configured certificate, and the ca's trust bundle published on the bus
// is held (also when it changes), without holding readiness back.
func TestSecureListenerAndTrustBundle(t *testing.T) {
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
	serving := tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key}

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

func TestSecureListenerNeedsTLS(t *testing.T) {
	_, err := New(Config{SecureListen: "127.0.0.1:0"}, Deps{Config: fakebus.New(), Registry: fakebus.New()})
	if !errors.Is(err, ErrMissingDependency) {
		t.Fatalf("New: %v, want ErrMissingDependency", err)
	}
}
