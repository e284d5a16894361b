package xdsserver

import (
	"crypto/x509"
	"fmt"
	"sync"

	"google.golang.org/protobuf/proto"

	securityv1 "sailplane.dev/proto/security/v1"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
)

// trustBundles holds the ca's trust bundles from the bus, by trust domain: what proxies will be
// told to verify peers with (SDS ROOTCA) and the TLS listener's clients with.
type trustBundles struct {
	mu      sync.Mutex
	bundles map[string]*securityv1.TrustBundle
	roots   *x509.CertPool // of all bundles, parsed once per change; nil: to be parsed
	synced  chan struct{}
}

func newTrustBundles() *trustBundles {
	return &trustBundles{bundles: map[string]*securityv1.TrustBundle{}, synced: make(chan struct{})}
}

func (t *trustBundles) Apply(c bus.Change) error {
	if c.TypeURL != schema.TrustBundle.TypeURL {
		return fmt.Errorf("xds-server: unexpected type %s on the trust bundle subscription", c.TypeURL)
	}
	for _, r := range c.Updated {
		if _, ok := r.Body.(*securityv1.TrustBundle); !ok {
			return fmt.Errorf("xds-server: TrustBundle %s: body is %T", r.Name, r.Body)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range c.Updated {
		t.bundles[r.Name] = r.Body.(*securityv1.TrustBundle)
	}
	for _, name := range c.Removed {
		delete(t.bundles, name)
	}
	t.roots = nil
	return nil
}

// pool is the roots of every bundle held, which verify the TLS listener's client certificates.
// The caller must not modify it.
func (t *trustBundles) pool() *x509.CertPool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.roots == nil {
		t.roots = x509.NewCertPool()
		for _, b := range t.bundles {
			for _, root := range b.GetRootCertificates() {
				t.roots.AppendCertsFromPEM([]byte(root))
			}
		}
	}
	return t.roots
}

func (t *trustBundles) Synced() { close(t.synced) }

// TrustBundle is the ca's trust bundle for trustDomain as last received on the bus (a copy), or
// nil when none was (no Deps.Bundle, the ca not publishing yet).
func (s *Server) TrustBundle(trustDomain string) *securityv1.TrustBundle {
	s.bundles.mu.Lock()
	defer s.bundles.mu.Unlock()
	if b, ok := s.bundles.bundles[trustDomain]; ok {
		return proto.CloneOf(b)
	}
	return nil
}
