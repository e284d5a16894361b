package pki

import (
	"crypto/tls"
	"sync"
	"time"
)

// ServingCert is a TLS listener's certificate issued by an in-process Authority to a key of its
// own, renewed in place once half its lifetime has passed.
type ServingCert struct {
	auth *Authority
	alg  KeyAlgorithm
	opts LeafOptions

	mu      sync.Mutex
	current *tls.Certificate
}

// NewServingCert issues the first certificate for opts (its names and TTL) with a key of alg.
func NewServingCert(auth *Authority, alg KeyAlgorithm, opts LeafOptions) (*ServingCert, error) {
	sc := &ServingCert{auth: auth, alg: alg, opts: opts}
	if _, err := sc.GetCertificate(nil); err != nil {
		return nil, err
	}
	return sc, nil
}

// GetCertificate is a tls.Config.GetCertificate: the current certificate followed by the
// Authority's Chain, a new one once half its lifetime has passed.
func (sc *ServingCert) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if c := sc.current; c != nil {
		if half := c.Leaf.NotBefore.Add(c.Leaf.NotAfter.Sub(c.Leaf.NotBefore) / 2); time.Now().Before(half) {
			return c, nil
		}
	}
	key, err := GenerateKey(sc.alg)
	if err != nil {
		return nil, err
	}
	leaf, err := sc.auth.Issue(key.Public(), sc.opts)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}
	for _, ca := range sc.auth.Chain() {
		c.Certificate = append(c.Certificate, ca.Raw)
	}
	sc.current = c
	return c, nil
}
