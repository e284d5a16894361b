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

// csrCaller is the caller whose CSRs csrCases holds.
var csrCaller = spiffe.ID{TrustDomain: "cluster.local", Namespace: "app", ServiceAccount: "web"}

// csrCase is a CSR from csrCaller and the error ParseCSRFor gives it (nil: accepted).
type csrCase struct {
	name string
	csr  []byte
	want error
}

func csrCases(t testing.TB) []csrCase {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	csr := func(tmpl *x509.CertificateRequest, uris ...string) []byte {
		for _, s := range uris {
			u, err := url.Parse(s)
			if err != nil {
				t.Fatal(err)
			}
			tmpl.URIs = append(tmpl.URIs, u)
		}
		der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
	}
	return []csrCase{
		{"caller", csr(&x509.CertificateRequest{}, "spiffe://cluster.local/ns/app/sa/web"), nil},
		{"stale trust domain", csr(&x509.CertificateRequest{}, "spiffe://stale.domain/ns/app/sa/web"), nil},
		{"no identity", csr(&x509.CertificateRequest{DNSNames: []string{"web.app.svc"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}), nil},
		{"other service account", csr(&x509.CertificateRequest{}, "spiffe://cluster.local/ns/app/sa/db"), ErrForeignIdentity},
		{"caller and another", csr(&x509.CertificateRequest{}, "spiffe://cluster.local/ns/app/sa/web", "spiffe://cluster.local/ns/other/sa/web"), ErrForeignIdentity},
		{"not SPIFFE", csr(&x509.CertificateRequest{}, "https://cluster.local/ns/app/sa/web"), ErrForeignIdentity},
		{"empty", nil, ErrCSR},
		{"garbage", []byte("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"), ErrCSR},
	}
}

func TestParseCSRFor(t *testing.T) {
	for _, tc := range csrCases(t) {
		_, err := ParseCSRFor(tc.csr, csrCaller)
		if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
	}
}

// FuzzParseCSRFor: whatever a caller sends as its CSR, the ca's check never panics and accepts
// it only if it is a well-signed request naming no workload but the caller's; a refusal says
// which (ErrCSR or ErrForeignIdentity).
func FuzzParseCSRFor(f *testing.F) {
	for _, tc := range csrCases(f) {
		f.Add(tc.csr)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		csr, err := ParseCSRFor(data, csrCaller)
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
			if id, err := spiffe.FromURL(u); err != nil || !id.SameWorkload(csrCaller) {
				t.Fatalf("accepted a CSR for %q from %s", u, csrCaller)
			}
		}
	})
}
