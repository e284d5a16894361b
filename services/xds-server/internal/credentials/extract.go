package credentials

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"slices"
	"strings"
)

// The keys of the two Secret layouts Istio reads: a generic Secret (cert, key, cacert, crl) and
// a kubernetes.io/tls one (tls.crt, tls.key, ca.crt, ca.crl, tls.ocsp-staple). Either layout
// may be in a Secret of any type, as in istiod.
const (
	genericCert   = "cert"
	genericKey    = "key"
	genericCACert = "cacert"
	genericCRL    = "crl"

	tlsCert   = "tls.crt"
	tlsKey    = "tls.key"
	tlsCACert = "ca.crt"
	tlsCRL    = "ca.crl"
	tlsStaple = "tls.ocsp-staple"
)

// keyPair is a certificate chain and its private key, as a Secret holds them.
type keyPair struct {
	cert, key, staple []byte
}

// caBundle is a CA certificate bundle and an optional revocation list.
type caBundle struct {
	cert, crl []byte
}

// secretError is what is wrong with a Secret, naming it and the key; it never holds the
// Secret's data.
type secretError struct {
	secret string // namespace/name
	msg    string
}

func (e *secretError) Error() string { return "Secret " + e.secret + ": " + e.msg }

// extractKeyPair reads the certificate and key as istiod does (generic keys first), and checks
// that they are PEM a TLS stack accepts: a Secret Envoy would refuse must not reach it.
func extractKeyPair(secret string, data map[string][]byte) (keyPair, error) {
	bad := func(format string, a ...any) (keyPair, error) {
		return keyPair{}, &secretError{secret: secret, msg: fmt.Sprintf(format, a...)}
	}
	var certKey, keyKey string
	var kp keyPair
	switch {
	case len(data[genericCert]) > 0 && len(data[genericKey]) > 0:
		certKey, keyKey = genericCert, genericKey
	case len(data[tlsCert]) > 0 && len(data[tlsKey]) > 0:
		certKey, keyKey = tlsCert, tlsKey
		kp.staple = data[tlsStaple]
	case has(data, genericCert, genericKey):
		return bad("keys %q and %q are empty", genericCert, genericKey)
	case has(data, tlsCert, tlsKey):
		return bad("keys %q and %q are empty", tlsCert, tlsKey)
	default:
		return bad("has neither keys %q and %q nor %q and %q; it has: %s", tlsCert, tlsKey, genericCert, genericKey, keyList(data))
	}
	kp.cert, kp.key = data[certKey], data[keyKey]
	if err := checkCertificates(kp.cert); err != nil {
		return bad("key %q: %v", certKey, err)
	}
	if _, err := tls.X509KeyPair(kp.cert, kp.key); err != nil {
		return bad("key %q is not the private key of the certificate in %q: %v", keyKey, certKey, err)
	}
	return kp, nil
}

// extractCA reads the CA certificate (and CRL) as istiod does: cacert (with crl), else ca.crt
// (with ca.crl).
func extractCA(secret string, data map[string][]byte) (caBundle, error) {
	bad := func(format string, a ...any) (caBundle, error) {
		return caBundle{}, &secretError{secret: secret, msg: fmt.Sprintf(format, a...)}
	}
	var certKey, crlKey string
	switch {
	case len(data[genericCACert]) > 0:
		certKey, crlKey = genericCACert, genericCRL
	case len(data[tlsCACert]) > 0:
		certKey, crlKey = tlsCACert, tlsCRL
	case has(data, genericCACert):
		return bad("key %q is empty", genericCACert)
	case has(data, tlsCACert):
		return bad("key %q is empty", tlsCACert)
	default:
		return bad("has no CA certificate (key %q or %q); it has: %s", tlsCACert, genericCACert, keyList(data))
	}
	ca := caBundle{cert: data[certKey], crl: data[crlKey]}
	if err := checkCertificates(ca.cert); err != nil {
		return bad("key %q: %v", certKey, err)
	}
	if len(ca.crl) > 0 {
		if err := checkCRL(ca.crl); err != nil {
			return bad("key %q: %v", crlKey, err)
		}
	}
	return ca, nil
}

// checkCertificates: b is PEM holding certificates only, at least one, each parsing.
func checkCertificates(b []byte) error {
	n := 0
	for rest := b; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return fmt.Errorf("PEM block %d is %q, want CERTIFICATE", n+1, block.Type)
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			return fmt.Errorf("certificate %d: %w", n+1, err)
		}
		n++
	}
	if n == 0 {
		return fmt.Errorf("no PEM certificate")
	}
	return nil
}

// checkCRL: b is PEM holding revocation lists, at least one, each parsing.
func checkCRL(b []byte) error {
	n := 0
	for rest := b; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if _, err := x509.ParseRevocationList(block.Bytes); err != nil {
			return fmt.Errorf("revocation list %d: %w", n+1, err)
		}
		n++
	}
	if n == 0 {
		return fmt.Errorf("no PEM revocation list")
	}
	return nil
}

func has(data map[string][]byte, keys ...string) bool {
	for _, k := range keys {
		if _, ok := data[k]; !ok {
			return false
		}
	}
	return true
}

// keyList names a Secret's keys (never its values), at most five.
func keyList(data map[string][]byte) string {
	keys := make([]string, 0, len(data))
	for k := range data {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if len(keys) == 0 {
		return "no keys"
	}
	if len(keys) > 5 {
		return strings.Join(keys[:5], ", ") + fmt.Sprintf(" and %d more", len(keys)-5)
	}
	return strings.Join(keys, ", ")
}
