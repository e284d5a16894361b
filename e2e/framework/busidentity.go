package framework

import (
	"context"
	"crypto/x509"
	"log/slog"
	"net/url"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"

	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/spiffe"
	"sailplane.dev/shared/workloadcert"
)

// StaticIdentity is a fixed workload credential, for a test to present on an mTLS bus.
type StaticIdentity struct{ C *workloadcert.Credential }

// Current is the credential.
func (s StaticIdentity) Current() *workloadcert.Credential { return s.C }

// IdentityFromDir loads a credential folder (cert-chain.pem, key.pem, root-cert.pem), as the
// ca's --service-cert-dir keeps one per service.
func IdentityFromDir(t testing.TB, dir string) StaticIdentity {
	t.Helper()
	c, err := workloadcert.ReadFolder(dir)
	if err != nil {
		t.Fatal(err)
	}
	return StaticIdentity{c}
}

// SignIdentity signs a credential for id with auth (testenv.CAFromFolder reads the ca's): an
// identity the ca never issued to anyone, for tests of refusals.
func SignIdentity(t testing.TB, auth *pki.Authority, id spiffe.ID) StaticIdentity {
	t.Helper()
	key, err := pki.GenerateKey(pki.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := auth.Issue(key.Public(), pki.LeafOptions{URIs: []*url.URL{id.URL()}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return StaticIdentity{&workloadcert.Credential{ID: id, Key: key, Chain: append([]*x509.Certificate{leaf}, auth.Chain()...), Roots: auth.Roots, Received: time.Now()}}
}

// AnyServer is a consumer's check of a bus producer's identity that accepts any (the chain to
// the roots is still checked): for tests probing a bus.
func AnyServer(src workloadcert.Source) credentials.TransportCredentials {
	return credentials.NewTLS(workloadcert.ClientTLS(src, func(spiffe.ID) error { return nil }))
}

// WorkloadCert runs a certificate client (as a Sailplane service does) until the test ends and
// returns it once it holds a certificate.
func WorkloadCert(t testing.TB, cfg workloadcert.Config) *workloadcert.Client {
	t.Helper()
	c, err := workloadcert.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	select {
	case <-c.Ready():
	case <-time.After(2 * time.Minute):
		t.Fatalf("no certificate from the ca at %s after 2 minutes", cfg.CAAddress)
	}
	return c
}
