package bustest

import (
	"crypto/x509"
	"net/url"
	"testing"
	"time"

	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/spiffe"
	"sailplane.dev/shared/workloadcert"
)

// StaticIdentity is a workload credential that never rotates, for a bus.Security in tests.
type StaticIdentity struct{ C *workloadcert.Credential }

func (s StaticIdentity) Current() *workloadcert.Credential { return s.C }

// SignIdentity issues a workload certificate for id from auth, valid for an hour.
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
