package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net"
	"net/url"
	"testing"

	"sailplane.dev/shared/spiffe"
)

// FuzzParseCSRFor: whatever a caller sends as its CSR, the ca's check never panics and accepts
// it only if it is a well-signed request naming no workload but the caller's; a refusal says
// which (ErrCSR or ErrForeignIdentity).
func FuzzParseCSRFor(f *testing.F) {
	caller := spiffe.ID{TrustDomain: "cluster.local", Namespace: "app", ServiceAccount: "web"}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	uris := func(ss ...string) []*url.URL {
		var us []*url.URL
		for _, s := range ss {
			u, err := url.Parse(s)
			if err != nil {
				f.Fatal(err)
			}
			us = append(us, u)
		}
		return us
	}
	for _, tmpl := range []*x509.CertificateRequest{
		{URIs: uris("spiffe://cluster.local/ns/app/sa/web")},
		{URIs: uris("spiffe://stale.domain/ns/app/sa/web")},
		{URIs: uris("spiffe://cluster.local/ns/app/sa/db")},
		{URIs: uris("spiffe://cluster.local/ns/app/sa/web", "spiffe://cluster.local/ns/other/sa/web")},
		{URIs: uris("https://cluster.local/ns/app/sa/web")},
		{DNSNames: []string{"web.app.svc"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}},
		{},
	} {
		der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
	}
	f.Add([]byte(""))
	f.Add([]byte("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"))

	f.Fuzz(func(t *testing.T, data []byte) {
		csr, err := ParseCSRFor(data, caller)
		if err != nil {
			if csr != nil || !errors.Is(err, ErrCSR) && !errors.Is(err, ErrForeignIdentity) {
				t.Fatalf("refusal %v (with a CSR: %v)", err, csr != nil)
			}
			return
		}
		if err := csr.CheckSignature(); err != nil {
			t.Fatalf("accepted a CSR with a bad signature: %v", err)
		}
		for _, u := range csr.URIs {
			if id, err := spiffe.FromURL(u); err != nil || !id.SameWorkload(caller) {
				t.Fatalf("accepted a CSR for %q from %s", u, caller)
			}
		}
	})
}
