package bus

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"sailplane.dev/shared/grpcserver"
	"sailplane.dev/shared/spiffe"
	"sailplane.dev/shared/workloadcert"
)

// Security is how a bus listener or connection is protected. The zero value is plaintext, which
// a listener accepts only on a loopback address.
type Security struct {
	// Identity, when set, makes the bus mutual TLS with this workload's certificate: a server
	// requires clients to present one chaining to the same trust bundle, a client checks the
	// server's. Certificates are taken at each handshake, so renewals need no restart and open
	// streams are kept.
	Identity workloadcert.Source
	// Peers are the identities allowed at the other end (with Identity): the consumers a server
	// serves (others get PermissionDenied), the producers a consumer accepts.
	Peers []spiffe.ID
	// AllowPlaintext lets a listener without Identity serve on an address other than loopback.
	AllowPlaintext bool
}

// ErrPlaintext is a plaintext bus listener on an address other than loopback, not asked for.
var ErrPlaintext = errors.New("a plaintext bus is served only on a loopback address unless asked for explicitly")

// SailplanePeers are the identities of Sailplane's own services in a namespace (the service
// accounts of deploy/microservices): the default peers of every bus.
func SailplanePeers(trustDomain, namespace string) []spiffe.ID {
	var ids []spiffe.ID
	for _, sa := range []string{"config-ingest", "endpoint-watcher", "xds-server", "ca", "webhook"} {
		ids = append(ids, spiffe.ID{TrustDomain: trustDomain, Namespace: namespace, ServiceAccount: sa})
	}
	return ids
}

// IsLoopback reports whether a listen address binds only loopback (127.0.0.0/8, ::1, localhost).
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// serverOptions are the gRPC options of a bus listener on addr: mTLS and the peers check, or
// plaintext where allowed.
func (sec Security) serverOptions(addr string, log *slog.Logger) ([]grpc.ServerOption, error) {
	if sec.Identity == nil {
		if !sec.AllowPlaintext && !IsLoopback(addr) {
			return nil, fmt.Errorf("bus listener %s: %w (give the service a certificate, or allow plaintext)", addr, ErrPlaintext)
		}
		return nil, nil
	}
	return []grpc.ServerOption{
		grpc.Creds(logHandshakes(credentials.NewTLS(workloadcert.ServerTLS(sec.Identity)), log)),
		grpcserver.WithAuth(peerAuthorizer(sec.Peers, log)),
	}, nil
}

// maxLoggedRefusals bounds the identities whose refusal is remembered: every workload of the
// mesh has a certificate from the same ca, and each may try.
const maxLoggedRefusals = 1024

// peerAuthorizer refuses callers whose SPIFFE ID is not one of peers, with PermissionDenied,
// logging each refused identity once.
func peerAuthorizer(peers []spiffe.ID, log *slog.Logger) func(context.Context) (context.Context, error) {
	var (
		mu     sync.Mutex
		logged = map[spiffe.ID]bool{}
	)
	return func(ctx context.Context) (context.Context, error) {
		id, err := workloadcert.PeerID(ctx)
		if err != nil {
			return nil, status.Errorf(codes.Unauthenticated, "bus: %v", err)
		}
		grpcserver.SetPeerIdentity(ctx, id.String()) // verified in the handshake
		if slices.Contains(peers, id) {
			return ctx, nil
		}
		mu.Lock()
		first := !logged[id] && len(logged) < maxLoggedRefusals
		if first {
			logged[id] = true
		}
		mu.Unlock()
		if first {
			log.Warn("bus peer refused: identity not allowed", "peer", id.String(), "allowed", idList(peers))
		}
		return nil, status.Errorf(codes.PermissionDenied, "bus: %s may not use this bus", id)
	}
}

// handshakeLog remembers the refused handshakes logged, shared by a listener's credentials and
// their clones.
type handshakeLog struct {
	log    *slog.Logger
	mu     sync.Mutex
	logged map[string]bool // remote host + reason
}

// loggedHandshakes are a bus listener's TLS credentials that log a failed handshake once per
// remote host and reason: a client that cannot do mTLS at all — plaintext, or TLS without a
// certificate, as istiod's xds:// config source dials (it has no client certificate) — is
// otherwise refused with no trace on the bus's side.
type loggedHandshakes struct {
	credentials.TransportCredentials
	hl *handshakeLog
}

func logHandshakes(c credentials.TransportCredentials, log *slog.Logger) credentials.TransportCredentials {
	return &loggedHandshakes{TransportCredentials: c, hl: &handshakeLog{log: log, logged: map[string]bool{}}}
}

func (c *loggedHandshakes) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	out, info, err := c.TransportCredentials.ServerHandshake(conn)
	if err != nil {
		c.hl.refused(conn.RemoteAddr(), err)
	}
	return out, info, err
}

func (c *loggedHandshakes) Clone() credentials.TransportCredentials {
	return &loggedHandshakes{TransportCredentials: c.TransportCredentials.Clone(), hl: c.hl}
}

func (hl *handshakeLog) refused(remote net.Addr, err error) {
	// A connection closed before or during the handshake (a TCP probe, a client giving up) is
	// no refusal.
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, os.ErrDeadlineExceeded) {
		return
	}
	reason := "TLS handshake failed"
	var rh tls.RecordHeaderError
	switch {
	case errors.As(err, &rh):
		reason = "plaintext client (this bus is mutual TLS)"
	case strings.Contains(err.Error(), "didn't provide a certificate"):
		reason = "no client certificate (this bus is mutual TLS)"
	}
	host := remote.String()
	if h, _, splitErr := net.SplitHostPort(host); splitErr == nil {
		host = h
	}
	hl.mu.Lock()
	key := host + " " + reason
	first := !hl.logged[key] && len(hl.logged) < maxLoggedRefusals
	if first {
		hl.logged[key] = true
	}
	hl.mu.Unlock()
	if first {
		hl.log.Warn("bus client refused: "+reason, "remote", host, "err", err)
	}
}

// authorizeServer is a consumer's check of the producer's identity.
func (sec Security) authorizeServer(id spiffe.ID) error {
	if slices.Contains(sec.Peers, id) {
		return nil
	}
	return fmt.Errorf("not an allowed bus peer (%s)", idList(sec.Peers))
}

// WithSecurity protects the consumer's connection: mTLS with sec.Identity, the producer's
// identity one of sec.Peers; plaintext without Identity.
func WithSecurity(sec Security) DialOption {
	return func(c *dialConfig) {
		if creds := sec.ClientCredentials(); creds != nil {
			c.creds = creds
		}
	}
}

// ClientCredentials are the gRPC credentials of a connection to a bus protected as sec says: mTLS
// with sec.Identity, the producer's identity checked against sec.Peers; nil for plaintext.
func (sec Security) ClientCredentials() credentials.TransportCredentials {
	if sec.Identity == nil {
		return nil
	}
	return credentials.NewTLS(workloadcert.ClientTLS(sec.Identity, sec.authorizeServer))
}

func idList(ids []spiffe.ID) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = id.String()
	}
	return strings.Join(s, ", ")
}
