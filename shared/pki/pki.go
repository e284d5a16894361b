// Package pki is the certificate work of the ca (and of agents creating CSRs): keys, a
// self-signed root, CSR checks, leaf issuance, and the PEM forms Istio stores them in. Everything
// is crypto/x509 from the standard library.
package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"time"

	"sailplane.dev/shared/spiffe"
)

// KeyAlgorithm names the kind of key GenerateKey makes.
type KeyAlgorithm string

// The supported key algorithms; ECDSA P-256 is the default (istiod's default is RSA 2048).
const (
	ECDSAP256 KeyAlgorithm = "ECDSA_P256"
	RSA2048   KeyAlgorithm = "RSA_2048"
)

// ErrCSR marks a certificate request that cannot be parsed or whose signature is wrong.
var ErrCSR = errors.New("invalid certificate signing request")

// ErrForeignIdentity marks a certificate request naming a workload other than the caller's.
var ErrForeignIdentity = errors.New("certificate signing request for another workload")

// GenerateKey makes a private key; the zero algorithm is ECDSA P-256.
func GenerateKey(alg KeyAlgorithm) (crypto.Signer, error) {
	switch alg {
	case ECDSAP256, "":
		return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case RSA2048:
		return rsa.GenerateKey(rand.Reader, 2048)
	default:
		return nil, fmt.Errorf("key algorithm %q: want %s or %s", alg, ECDSAP256, RSA2048)
	}
}

// ClockSkew backdates NotBefore so a peer whose clock is a little behind accepts a fresh
// certificate: a certificate was made at its NotBefore plus ClockSkew.
const ClockSkew = 2 * time.Minute

const clockSkew = ClockSkew

func serialNumber() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
}

// NewRoot makes a self-signed CA certificate for key, valid for ttl.
func NewRoot(key crypto.Signer, org string, ttl time.Duration) (*x509.Certificate, error) {
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{org}},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(ttl),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("self-signed root: %w", err)
	}
	return x509.ParseCertificate(der)
}

// CreateCSR makes a PEM certificate request for id signed by key, as an agent sends it.
func CreateCSR(key crypto.Signer, id spiffe.ID) ([]byte, error) {
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{id.URL()}}, key)
	if err != nil {
		return nil, fmt.Errorf("CSR: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

// ParseCSR reads one PEM certificate request and checks its signature (proof that the caller
// holds the key). Errors wrap ErrCSR.
func ParseCSR(data []byte) (*x509.CertificateRequest, error) {
	block, rest := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE REQUEST" && block.Type != "NEW CERTIFICATE REQUEST" {
		return nil, fmt.Errorf("%w: no PEM CERTIFICATE REQUEST block", ErrCSR)
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, fmt.Errorf("%w: data after the PEM block", ErrCSR)
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCSR, err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("%w: signature: %w", ErrCSR, err)
	}
	switch k := csr.PublicKey.(type) {
	case *ecdsa.PublicKey:
	case *rsa.PublicKey:
		if k.N.BitLen() < 2048 {
			return nil, fmt.Errorf("%w: RSA key of %d bits, at least 2048 required", ErrCSR, k.N.BitLen())
		}
	default:
		return nil, fmt.Errorf("%w: unsupported public key type %T", ErrCSR, k)
	}
	return csr, nil
}

// ParseCSRFor parses a workload's CSR (ParseCSR) and checks that every identity it names is the
// caller's workload (wrapping ErrForeignIdentity otherwise). The trust domain may differ: the
// agent's may be stale, and the ca names the caller in its own.
func ParseCSRFor(data []byte, caller spiffe.ID) (*x509.CertificateRequest, error) {
	csr, err := ParseCSR(data)
	if err != nil {
		return nil, err
	}
	for _, u := range csr.URIs {
		asked, err := spiffe.FromURL(u)
		if err != nil || !asked.SameWorkload(caller) {
			return nil, fmt.Errorf("%w: it asks for %q, the caller is %s", ErrForeignIdentity, u.String(), caller)
		}
	}
	return csr, nil
}
