package xdsserver

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"sailplane.dev/shared/grpcserver"
	"sailplane.dev/shared/kube"
	"sailplane.dev/shared/spiffe"
)

// TokenReviewer checks a service-account token and names its account (kube.TokenReviewer; in
// hyper the ca's, so that one token costs one TokenReview for both). An error wrapping
// kube.ErrTokenReviewUnavailable is the reviewer's failure, any other the token's.
type TokenReviewer interface {
	Review(ctx context.Context, token string) (spiffe.ID, error)
}

var _ TokenReviewer = (*kube.TokenReviewer)(nil)

// Authentication failures, mapped to gRPC codes by authenticate.
var (
	errUnauthenticated = errors.New("unauthenticated")
	errUnavailable     = errors.New("cannot authenticate now")
	errNoCertificate   = errors.New("no client certificate")
)

// adsMethods are the calls that must be authenticated over TLS: every xDS stream, the debug
// types' included. The health and load-report services answer anyone, as before.
var adsMethods = map[string]bool{
	"/" + discoverygrpc.AggregatedDiscoveryService_ServiceDesc.ServiceName + "/StreamAggregatedResources": true,
	"/" + discoverygrpc.AggregatedDiscoveryService_ServiceDesc.ServiceName + "/DeltaAggregatedResources":  true,
}

// caller is who opened a stream, for the log line of a refusal.
type caller struct {
	addr  string
	via   string    // "certificate" or "token"
	token string    // TokenFingerprint of the bearer token, never the token
	id    spiffe.ID // zero until authenticated
}

func (c caller) logAttrs() []any {
	attrs := []any{"peer", c.addr}
	if c.via != "" {
		attrs = append(attrs, "auth", c.via)
	}
	if c.token != "" {
		attrs = append(attrs, "token-sha256", c.token)
	}
	if c.id != (spiffe.ID{}) {
		attrs = append(attrs, "identity", c.id.String())
	}
	return attrs
}

// authenticate is the gRPC servers' authenticator (grpcserver.WithAuth). As istiod does on
// 15012, an xDS stream over TLS must be authenticated, by a client certificate the mesh's trust
// bundle verifies or else by a service-account token ("authorization: Bearer", reviewed with
// TokenReview); without either it is refused with Unauthenticated. The identity is recorded for
// the handlers (grpcserver.PeerIdentity), which hold the node's claimed namespace and service
// account to it, and decide debug access by it. Over plaintext (istiod's 15010, loopback by
// default) nothing is asked, as in istiod: there is no identity, and so no claims check.
func (s *Server) authenticate(ctx context.Context) (context.Context, error) {
	p, _ := peer.FromContext(ctx)
	if p == nil {
		return ctx, nil
	}
	info, isTLS := p.AuthInfo.(credentials.TLSInfo)
	if !isTLS {
		return ctx, nil
	}
	method, _ := grpc.Method(ctx)
	if !adsMethods[method] {
		// Names a caller with a certificate in the call's log line; refuses no one.
		if id, err := s.certIdentity(info); err == nil {
			grpcserver.SetPeerIdentity(ctx, id.String())
		}
		return ctx, nil
	}
	c := caller{addr: "unknown"}
	if p.Addr != nil {
		c.addr = p.Addr.String()
	}
	c, err := s.identify(ctx, info, c)
	if err != nil {
		code := codes.Unauthenticated
		if errors.Is(err, errUnavailable) {
			code = codes.Unavailable
		}
		s.log.Warn("xDS client refused", append(c.logAttrs(), "code", code.String(), "err", err)...)
		return nil, status.Errorf(code, "xds-server: %v", err)
	}
	grpcserver.SetPeerIdentity(ctx, c.id.String())
	if s.log.Enabled(ctx, slog.LevelDebug) { // spares building the attributes on every stream
		s.log.Debug("xDS client authenticated", c.logAttrs()...)
	}
	return ctx, nil
}

// identify finds the identity of a TLS caller: its certificate's, else its token's.
func (s *Server) identify(ctx context.Context, info credentials.TLSInfo, c caller) (caller, error) {
	id, certErr := s.certIdentity(info)
	if certErr == nil {
		c.via, c.id = "certificate", id
		return c, nil
	}
	token, found := grpcserver.BearerToken(ctx)
	if !found {
		if errors.Is(certErr, errNoCertificate) {
			return c, fmt.Errorf("%w: neither a client certificate nor an authorization: Bearer token", errUnauthenticated)
		}
		c.via = "certificate"
		return c, fmt.Errorf("%w: %w, and no authorization: Bearer token", errUnauthenticated, certErr)
	}
	c.via, c.token = "token", kube.TokenFingerprint(token)
	md, _ := metadata.FromIncomingContext(ctx)
	if ids := md.Get("clusterid"); len(ids) == 1 && ids[0] != "" && ids[0] != s.cfg.ClusterID {
		return c, fmt.Errorf("%w: the caller claims cluster %q, this server knows only %q", errUnauthenticated, ids[0], s.cfg.ClusterID)
	}
	if s.deps.Tokens == nil {
		return c, fmt.Errorf("%w: tokens cannot be reviewed here (no Kubernetes); use a client certificate", errUnauthenticated)
	}
	id, err := s.deps.Tokens.Review(ctx, token)
	switch {
	case errors.Is(err, kube.ErrTokenReviewUnavailable):
		return c, fmt.Errorf("%w: %w", errUnavailable, err)
	case err != nil:
		return c, fmt.Errorf("%w: %w", errUnauthenticated, err)
	}
	c.id = id
	return c, nil
}

// certIdentity is the SPIFFE ID of the client's certificate, verified against the trust bundles
// held; errNoCertificate when it presented none.
func (s *Server) certIdentity(info credentials.TLSInfo) (spiffe.ID, error) {
	chain := info.State.PeerCertificates
	if len(chain) == 0 {
		return spiffe.ID{}, errNoCertificate
	}
	opts := x509.VerifyOptions{
		Roots:         s.bundles.pool(),
		Intermediates: x509.NewCertPool(),
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	for _, c := range chain[1:] {
		opts.Intermediates.AddCert(c)
	}
	if _, err := chain[0].Verify(opts); err != nil {
		return spiffe.ID{}, fmt.Errorf("client certificate not verified by the mesh's trust bundle: %w", err)
	}
	for _, u := range chain[0].URIs {
		if id, err := spiffe.FromURL(u); err == nil {
			return id, nil
		}
	}
	return spiffe.ID{}, errors.New("client certificate has no SPIFFE ID")
}

// peerIdentity is the verified SPIFFE ID of the call's client certificate, "" for none.
func (s *Server) peerIdentity(ctx context.Context) string {
	p, _ := peer.FromContext(ctx)
	if p == nil {
		return ""
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return ""
	}
	id, err := s.certIdentity(info)
	if err != nil {
		return ""
	}
	return id.String()
}
