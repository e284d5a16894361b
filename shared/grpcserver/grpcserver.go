// Package grpcserver builds the gRPC servers every Sailplane service exposes (bus, xDS) with the
// same defaults, and runs them under the Run(ctx) lifecycle.
package grpcserver

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
)

// New returns a gRPC server that turns a handler panic into an Internal error instead of a crash,
// and accepts the keepalive pings xDS clients send on long-lived streams.
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
		grpc.MaxRecvMsgSize(64 << 20),
	}
	return grpc.NewServer(append(base, opts...)...)
}

// Server serves a grpc.Server on an address under the Run(ctx) lifecycle.
type Server struct {
	Addr   string
	GRPC   *grpc.Server
	Logger *slog.Logger
	// Listening, when set, is called with the bound address once the listener is open.
	Listening func(net.Addr)
}

// Run listens on Addr and serves until ctx ends, then stops gracefully, cutting streams that
// are still open after a few seconds (xDS streams never end on their own).
func (s *Server) Run(ctx context.Context) error {
	lis, err := net.Listen("tcp", s.Addr)
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
