package xdsserver

import (
	"context"
	"crypto/x509"
	"fmt"
	"sync"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"

	securityv1 "sailplane.dev/proto/security/v1"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/grpcserver"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/spiffe"
)

// trustBundles holds the ca's trust bundles from the bus, by trust domain: what proxies will be
// told to verify peers with (SDS ROOTCA) and the TLS listener's clients with.
type trustBundles struct {
	mu      sync.Mutex
	bundles map[string]*securityv1.TrustBundle
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
	return nil
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

// authenticate is the gRPC servers' authenticator (grpcserver.WithAuth): it records the
// verified identity of the client's certificate (peerIdentity) for the handlers
// (grpcserver.PeerIdentity) and the call's log lines. It refuses no one: xDS serves clients
// without a certificate too. What a client may ask is decided where its requests are seen:
// a proxy's claims against its identity and debug access are the ADS server's hooks.
func (s *Server) authenticate(ctx context.Context) (context.Context, error) {
	s.peerIdentity(ctx)
	return ctx, nil
}

// peerIdentity is the SPIFFE ID of the certificate the call's client presented, verified
// against the trust bundles held; "" when it presented none, or one they do not verify. It names
// the proxy in the logs (grpcserver.SetPeerIdentity), and the node's namespace and service
// account must be its own.
func (s *Server) peerIdentity(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return ""
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return ""
	}
	leaf := info.State.PeerCertificates[0]
	opts := x509.VerifyOptions{
		Roots:         x509.NewCertPool(),
		Intermediates: x509.NewCertPool(),
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	for _, c := range info.State.PeerCertificates[1:] {
		opts.Intermediates.AddCert(c)
	}
	s.bundles.mu.Lock()
	for _, b := range s.bundles.bundles {
		for _, root := range b.GetRootCertificates() {
			opts.Roots.AppendCertsFromPEM([]byte(root))
		}
	}
	s.bundles.mu.Unlock()
	if _, err := leaf.Verify(opts); err != nil {
		s.log.Debug("xDS client certificate not verified", "peer", p.Addr, "err", err)
		return ""
	}
	for _, u := range leaf.URIs {
		if id, err := spiffe.FromURL(u); err == nil {
			grpcserver.SetPeerIdentity(ctx, id.String())
			return id.String()
		}
	}
	return ""
}
