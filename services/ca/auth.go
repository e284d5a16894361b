package ca

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"sailplane.dev/shared/grpcserver"
	"sailplane.dev/shared/kube"
	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/spiffe"
)

// Authentication failures. errUnavailable is the API server failing to answer, not the caller's fault.
var (
	errUnauthenticated = errors.New("unauthenticated")
	errUnavailable     = errors.New("cannot review the token now")
)

// caller is who asked, for the log line of a refusal and for the certificate.
type caller struct {
	addr  string
	id    spiffe.ID // zero until authenticated
	token string    // a short hash of the bearer token, never the token
	via   string    // "certificate" or "token"
}

func (c caller) logAttrs() []any {
	attrs := []any{"peer", c.addr}
	if c.via != "" {
		attrs = append(attrs, "auth", c.via)
	}
	if c.id != (spiffe.ID{}) {
		attrs = append(attrs, "identity", c.id.String())
	}
	if c.token != "" {
		attrs = append(attrs, "token-sha256", c.token)
	}
	return attrs
}

// authenticate finds the caller's identity: a client certificate this ca issued, else a
// service-account token in "authorization: Bearer", reviewed by the API server.
func (s *Service) authenticate(ctx context.Context, auth *pki.Authority) (caller, error) {
	c := caller{addr: "unknown"}
	p, ok := peer.FromContext(ctx)
	if ok && p.Addr != nil {
		c.addr = p.Addr.String()
	}
	tlsInfo, isTLS := p.AuthInfo.(credentials.TLSInfo)
	if isTLS && len(tlsInfo.State.PeerCertificates) > 0 {
		c.via = "certificate"
		id, err := s.certIdentity(auth, tlsInfo.State.PeerCertificates)
		c.id = id
		return c, err
	}

	token, found := grpcserver.BearerToken(ctx)
	if !found {
		return c, fmt.Errorf("%w: neither a client certificate nor an authorization: Bearer token", errUnauthenticated)
	}
	c.via, c.token = "token", kube.TokenFingerprint(token)
	if !isTLS {
		return c, fmt.Errorf("%w: a bearer token over plaintext is refused", errUnauthenticated)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	if ids := md.Get("clusterid"); len(ids) == 1 && ids[0] != "" && ids[0] != s.cfg.ClusterID {
		return c, fmt.Errorf("%w: the caller claims cluster %q, this ca knows only %q", errUnauthenticated, ids[0], s.cfg.ClusterID)
	}
	if s.kube == nil {
		return c, fmt.Errorf("%w: tokens cannot be reviewed without Kubernetes; use a client certificate", errUnauthenticated)
	}
	id, err := s.tokens().Review(ctx, token)
	c.id = id
	switch {
	case errors.Is(err, kube.ErrTokenReviewUnavailable):
		return c, fmt.Errorf("%w: %w", errUnavailable, err)
	case err != nil:
		return c, fmt.Errorf("%w: %w", errUnauthenticated, err)
	}
	return c, nil
}

// certIdentity verifies a client chain against the roots now and reads its one SPIFFE URI SAN.
func (s *Service) certIdentity(auth *pki.Authority, chain []*x509.Certificate) (spiffe.ID, error) {
	if err := auth.Verify(chain[0], chain[1:], x509.ExtKeyUsageClientAuth); err != nil {
		return spiffe.ID{}, fmt.Errorf("%w: client certificate: %w", errUnauthenticated, err)
	}
	if len(chain[0].URIs) != 1 {
		return spiffe.ID{}, fmt.Errorf("%w: client certificate has %d URI SANs, want one SPIFFE ID", errUnauthenticated, len(chain[0].URIs))
	}
	id, err := spiffe.FromURL(chain[0].URIs[0])
	if err != nil {
		return spiffe.ID{}, fmt.Errorf("%w: client certificate: %w", errUnauthenticated, err)
	}
	return id, nil
}

// tokens is the ca's token reviewer, made on first use.
func (s *Service) tokens() *kube.TokenReviewer {
	s.reviewerOnce.Do(func() {
		s.reviewer = kube.NewTokenReviewer(s.kube, kube.TokenReviewOptions{
			Audiences: s.cfg.TokenAudiences, TrustDomain: s.cfg.TrustDomain, TTL: s.cfg.TokenCacheTTL, Size: s.cfg.TokenCacheSize,
		})
	})
	return s.reviewer
}

// TokenReviewer is the ca's token reviewer, for xds-server to authenticate its TLS callers with
// the same audiences and cache (hyper): pilot-agent sends one token to both. Nil without
// Kubernetes.
func (s *Service) TokenReviewer() *kube.TokenReviewer {
	if s.kube == nil {
		return nil
	}
	return s.tokens()
}
