package xdsserver

import (
	"context"
	"net"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"sailplane.dev/shared/spiffe"
)

// debugAccess is who may ask for Istio's debug types (proxy status and config dumps, which
// show every proxy's configuration). istiod requires an authenticated caller unless
// ENABLE_DEBUG_ENDPOINT_AUTH=false; here:
//   - over TLS, an identity (a client certificate the mesh's trust bundle verifies, or a
//     service-account token) of a service account in the control plane's namespace
//     (Config.Namespace);
//   - over plaintext, anyone, but only when the plaintext listener is on a loopback address
//     (so only this host can ask), or Config.DebugPlaintext says so.
//
// client is the stream's verified identity (peerIdentity), taken when the stream opened.
func (s *Server) debugAccess(ctx context.Context, client string) error {
	p, _ := peer.FromContext(ctx)
	if p == nil {
		return status.Error(codes.Unauthenticated, "xds-server: debug request from an unknown peer")
	}
	if _, isTLS := p.AuthInfo.(credentials.TLSInfo); !isTLS {
		if s.plaintextDebug {
			return nil
		}
		return status.Errorf(codes.PermissionDenied, "xds-server: debug types are served over plaintext only on a loopback listener (or with --debug-plaintext); "+
			"use the TLS port with a client certificate or token of a service account in %s", s.cfg.Namespace)
	}
	if client == "" {
		return status.Errorf(codes.Unauthenticated, "xds-server: debug types over TLS need a client certificate from the mesh's CA or a token, of a service account in %s", s.cfg.Namespace)
	}
	id, err := spiffe.Parse(client)
	if err != nil || id.Namespace != s.cfg.Namespace {
		return status.Errorf(codes.PermissionDenied, "xds-server: %s may not read debug types: only service accounts of %s may", client, s.cfg.Namespace)
	}
	return nil
}

// isLoopback reports whether a listener's address is on a loopback interface.
func isLoopback(a net.Addr) bool {
	tcp, ok := a.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}
