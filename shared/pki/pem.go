package pki

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
)

// ErrPEM marks PEM data that does not hold what it should.
var ErrPEM = errors.New("invalid PEM")

// EncodeCerts is certs as consecutive PEM CERTIFICATE blocks.
func EncodeCerts(certs ...*x509.Certificate) []byte {
	var b bytes.Buffer
	for _, c := range certs {
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return b.Bytes()
}

// ParseCerts reads every PEM CERTIFICATE block of data; anything else in it is an error. Empty
// data gives no certificates and no error.
func ParseCerts(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for rest := bytes.TrimSpace(data); len(rest) > 0; rest = bytes.TrimSpace(rest) {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return nil, fmt.Errorf("%w: data that is not a PEM block after %d certificate(s)", ErrPEM, len(certs))
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("%w: a %q block where a CERTIFICATE was expected", ErrPEM, block.Type)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: certificate %d: %w", ErrPEM, len(certs)+1, err)
		}
		certs = append(certs, c)
	}
	return certs, nil
}

// EncodeKey is key as a PEM "PRIVATE KEY" (PKCS #8) block.
func EncodeKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParseKey reads one PEM private key: PKCS #8, PKCS #1 (RSA) or SEC 1 (EC), as Istio's tools write them.
func ParseKey(data []byte) (crypto.Signer, error) {
	block, rest := pem.Decode(data)
	if block == nil {
		return nil, fmt.Errorf("%w: no PEM private key block", ErrPEM)
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, fmt.Errorf("%w: data after the private key block", ErrPEM)
	}
	var key any
	var err error
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("%w: a %q block where a private key was expected", ErrPEM, block.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: private key: %w", ErrPEM, err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%w: unsupported private key type %T", ErrPEM, key)
	}
	return signer, nil
}
