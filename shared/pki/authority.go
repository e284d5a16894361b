package pki

import (
	"bytes"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"
)

// ErrBundle marks CA material that is unusable: unparsable, a key that does not match the
// certificate, a signing certificate that is not a CA or does not chain to the roots.
var ErrBundle = errors.New("unusable CA material")

// Authority signs certificates with a CA key. Its certificate is either the root itself
// (self-signed) or an intermediate that chains to Roots through Intermediates.
type Authority struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	// Intermediates are the CA certificates between Cert and a root, Cert's issuer first; empty
	// when Cert is a root.
	Intermediates []*x509.Certificate
	// Roots are the trust anchors: the bundle workloads verify peers with.
	Roots []*x509.Certificate
}

// NewAuthority checks that key belongs to cert, that cert is a CA and that it chains to roots
// through intermediates (a self-signed cert must be one of roots). Errors wrap ErrBundle.
func NewAuthority(cert *x509.Certificate, key crypto.Signer, intermediates, roots []*x509.Certificate) (*Authority, error) {
	if len(roots) == 0 {
		return nil, fmt.Errorf("%w: no root certificate", ErrBundle)
	}
	if !cert.IsCA || !cert.BasicConstraintsValid {
		return nil, fmt.Errorf("%w: the signing certificate (%s) is not a CA certificate", ErrBundle, cert.Subject)
	}
	if !PublicKeysEqual(cert.PublicKey, key.Public()) {
		return nil, fmt.Errorf("%w: the private key does not match the signing certificate (%s)", ErrBundle, cert.Subject)
	}
	rootPool, interPool := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range roots {
		rootPool.AddCert(r)
	}
	for _, c := range intermediates {
		interPool.AddCert(c)
	}
	if _, err := cert.Verify(x509.VerifyOptions{
		Roots: rootPool, Intermediates: interPool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	}); err != nil {
		return nil, fmt.Errorf("%w: the signing certificate (%s) does not chain to the root certificates: %w", ErrBundle, cert.Subject, err)
	}
	return &Authority{Cert: cert, Key: key, Intermediates: intermediates, Roots: roots}, nil
}

// PublicKeysEqual reports whether a and b are the same public key (a certificate's and a
// private key's, say).
func PublicKeysEqual(a, b crypto.PublicKey) bool {
	ka, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ka.Equal(b)
}

// SelfSigned reports whether the authority signs with a root.
func (a *Authority) SelfSigned() bool {
	return len(a.Intermediates) == 0 && bytes.Equal(a.Cert.RawIssuer, a.Cert.RawSubject) && a.Cert.CheckSignatureFrom(a.Cert) == nil
}

// LeafOptions are what a leaf certificate says besides its key.
type LeafOptions struct {
	URIs     []*url.URL
	DNSNames []string
	IPs      []net.IP
	TTL      time.Duration
}

// Issue signs a leaf certificate for pub, usable for TLS as client and server. The SANs are
// exactly opts', with an empty subject as Istio's workload certificates have (so the SAN
// extension is critical). The lifetime ends no later than the signing certificate's.
func (a *Authority) Issue(pub crypto.PublicKey, opts LeafOptions) (*x509.Certificate, error) {
	if opts.TTL <= 0 {
		return nil, fmt.Errorf("certificate TTL %s: must be positive", opts.TTL)
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	notAfter := now.Add(opts.TTL)
	if notAfter.After(a.Cert.NotAfter) {
		notAfter = a.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		URIs:                  opts.URIs,
		DNSNames:              opts.DNSNames,
		IPAddresses:           opts.IPs,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.Cert, pub, a.Key)
	if err != nil {
		return nil, fmt.Errorf("sign certificate: %w", err)
	}
	return x509.ParseCertificate(der)
}

// Chain is what a workload presents after its own certificate: the intermediates, the signing
// certificate first, without the roots.
func (a *Authority) Chain() []*x509.Certificate {
	if a.SelfSigned() {
		return nil
	}
	return append([]*x509.Certificate{a.Cert}, a.Intermediates...)
}

// RootPool is the roots as a pool for verification.
func (a *Authority) RootPool() *x509.CertPool {
	pool := x509.NewCertPool()
	for _, r := range a.Roots {
		pool.AddCert(r)
	}
	return pool
}

// Verify checks that leaf, presented with intermediates, chains to the roots now, for usage.
func (a *Authority) Verify(leaf *x509.Certificate, intermediates []*x509.Certificate, usage x509.ExtKeyUsage) error {
	pool := x509.NewCertPool()
	for _, c := range intermediates {
		pool.AddCert(c)
	}
	_, err := leaf.Verify(x509.VerifyOptions{Roots: a.RootPool(), Intermediates: pool, KeyUsages: []x509.ExtKeyUsage{usage}})
	return err
}

// IssueCA signs an intermediate CA certificate for pub, valid for ttl (bounded by the signing
// certificate's own lifetime): how a plugged-in CA's signing certificate is made.
func (a *Authority) IssueCA(pub crypto.PublicKey, org string, ttl time.Duration) (*x509.Certificate, error) {
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	notAfter := now.Add(ttl)
	if notAfter.After(a.Cert.NotAfter) {
		notAfter = a.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{org}, CommonName: "Intermediate CA"},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.Cert, pub, a.Key)
	if err != nil {
		return nil, fmt.Errorf("sign CA certificate: %w", err)
	}
	return x509.ParseCertificate(der)
}
