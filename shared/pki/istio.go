package pki

import (
	"bytes"
	"crypto/x509"
	"fmt"
	"time"
)

// The file names (and Secret keys) of Istio's CA layouts: the self-signed root istiod keeps in
// the istio-ca-secret Secret, and a plugged-in CA in cacerts (Secret or folder).
const (
	CACertFile    = "ca-cert.pem"    // the signing certificate
	CAKeyFile     = "ca-key.pem"     // its private key
	CertChainFile = "cert-chain.pem" // the signing certificate's chain up to the root (plugged-in)
	RootCertFile  = "root-cert.pem"  // the root(s)
)

// FromIstioLayout reads CA material in Istio's layout, files keyed by name. ca-cert.pem and
// ca-key.pem are required; root-cert.pem too unless ca-cert.pem is itself a root; cert-chain.pem
// may add intermediates. Errors name the file and wrap ErrBundle or ErrPEM.
func FromIstioLayout(files map[string][]byte) (*Authority, error) {
	for _, name := range []string{CACertFile, CAKeyFile} {
		if len(bytes.TrimSpace(files[name])) == 0 {
			return nil, fmt.Errorf("%w: %s is missing or empty", ErrBundle, name)
		}
	}
	certs, err := ParseCerts(files[CACertFile])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", CACertFile, err)
	}
	key, err := ParseKey(files[CAKeyFile])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", CAKeyFile, err)
	}
	chain, err := ParseCerts(files[CertChainFile])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", CertChainFile, err)
	}
	roots, err := ParseCerts(files[RootCertFile])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", RootCertFile, err)
	}
	signing := certs[0]
	if len(roots) == 0 {
		if !bytes.Equal(signing.RawIssuer, signing.RawSubject) {
			return nil, fmt.Errorf("%w: %s is missing or empty and %s is not a root", ErrBundle, RootCertFile, CACertFile)
		}
		roots = []*x509.Certificate{signing}
	}
	// cert-chain.pem usually repeats the signing certificate and the root; keep what lies between.
	var intermediates []*x509.Certificate
	for _, c := range append(certs[1:], chain...) {
		if c.Equal(signing) || containsCert(roots, c) || containsCert(intermediates, c) {
			continue
		}
		intermediates = append(intermediates, c)
	}
	a, err := NewAuthority(signing, key, intermediates, roots)
	if err != nil {
		return nil, err
	}
	if now := time.Now(); now.After(signing.NotAfter) {
		return nil, fmt.Errorf("%w: %s expired at %s", ErrBundle, CACertFile, signing.NotAfter.UTC().Format(time.RFC3339))
	}
	return a, nil
}

func containsCert(certs []*x509.Certificate, c *x509.Certificate) bool {
	for _, x := range certs {
		if x.Equal(c) {
			return true
		}
	}
	return false
}

// IstioLayout is a self-signed authority in istiod's istio-ca-secret layout: the root as
// ca-cert.pem and root-cert.pem, its key as ca-key.pem, an empty cert-chain.pem.
func IstioLayout(a *Authority) (map[string][]byte, error) {
	key, err := EncodeKey(a.Key)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{
		CACertFile:    EncodeCerts(a.Cert),
		CAKeyFile:     key,
		CertChainFile: EncodeCerts(a.Chain()...),
		RootCertFile:  EncodeCerts(a.Roots...),
	}, nil
}

// NewSelfSigned makes a root key and certificate valid for ttl and returns it as an Authority.
func NewSelfSigned(alg KeyAlgorithm, org string, ttl time.Duration) (*Authority, error) {
	key, err := GenerateKey(alg)
	if err != nil {
		return nil, err
	}
	root, err := NewRoot(key, org, ttl)
	if err != nil {
		return nil, err
	}
	return NewAuthority(root, key, nil, []*x509.Certificate{root})
}
