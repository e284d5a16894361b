// Package grpcserver builds the gRPC servers every Sailplane service exposes (bus, xDS) with the
// same defaults, and runs them under the Run(ctx) lifecycle.
package grpcserver

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"
	"unicode/utf8"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
)

// Limits every server applies to what its clients send, as istiod does
// (ISTIO_GPRC_MAXRECVMSGSIZE, ISTIO_GPRC_MAXSTREAMS): xDS clients are not authenticated (and a
// plaintext bus's consumers neither), so one request (an xDS node's metadata, a consumer's initial
// versions) must not cost more than this.
const (
	// MaxRecvMsgSize bounds one request; a larger one ends its stream with ResourceExhausted.
	MaxRecvMsgSize = 4 << 20
	// MaxConcurrentStreams bounds the streams of one connection.
	MaxConcurrentStreams = 100000
)

// New returns a gRPC server that turns a handler panic into an Internal error instead of a crash,
// accepts the keepalive pings xDS clients send on long-lived streams, and refuses requests over
// MaxRecvMsgSize.
func New(log *slog.Logger, opts ...grpc.ServerOption) *grpc.Server {
	onPanic := recovery.WithRecoveryHandler(func(p any) error {
		log.Error("panic in gRPC handler", "panic", p)
		return status.Errorf(codes.Internal, "internal error")
	})
	base := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(recovery.UnaryServerInterceptor(onPanic)),
		grpc.ChainStreamInterceptor(recovery.StreamServerInterceptor(onPanic)),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.MaxRecvMsgSize(MaxRecvMsgSize),
		grpc.MaxConcurrentStreams(MaxConcurrentStreams),
	}
	return grpc.NewServer(append(base, opts...)...)
}

// Server serves a grpc.Server on an address under the Run(ctx) lifecycle.
type Server struct {
	// Network is "tcp" when empty, or "unix" (Addr is then the socket's path).
	Network string
	Addr    string
	GRPC    *grpc.Server
	Logger  *slog.Logger
	// Listening, when set, is called with the bound address once the listener is open.
	Listening func(net.Addr)
}

// Run listens on Addr and serves until ctx ends, then stops gracefully, cutting streams that
// are still open after a few seconds (xDS streams never end on their own).
func (s *Server) Run(ctx context.Context) error {
	network := s.Network
	if network == "" {
		network = "tcp"
	}
	lis, err := net.Listen(network, s.Addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", s.Addr, err)
	}
	if s.Listening != nil {
		s.Listening(lis.Addr())
	}
	s.Logger.Info("serving gRPC", "addr", lis.Addr().String())
	errc := make(chan error, 1)
	go func() { errc <- s.GRPC.Serve(lis) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() { s.GRPC.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		s.GRPC.Stop()
		<-stopped
	}
	<-errc
	return nil
}

// maxLoggedText bounds a client-supplied string in a log line.
const maxLoggedText = 1024

// ClientText bounds a string a client sent (a NACK's error_detail, a node ID) before it is logged
// or kept, so a client cannot flood the logs or grow memory with it. Longer text is cut at a rune
// boundary and says how much was dropped.
func ClientText(s string) string {
	if len(s) <= maxLoggedText {
		return s
	}
	cut := maxLoggedText
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d more bytes)", s[:cut], len(s)-cut)
}
