package bus

import (
	"context"
	"log/slog"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"

	"sailplane.dev/shared/grpcserver"
)

// ServerOption configures a Server.
type ServerOption func(*Server)

// WithServerLogger sets the Server's logger.
func WithServerLogger(l *slog.Logger) ServerOption {
	return func(s *Server) {
		if l != nil {
			s.log = l
		}
	}
}

// Server serves a Store over gRPC as envoy.service.discovery.v3.AggregatedDiscoveryService, both
// delta and state of the world, resources encoded as istio.mcp.v1alpha1.Resource.
type Server struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	store *Store
	log   *slog.Logger
}

var _ discoveryv3.AggregatedDiscoveryServiceServer = (*Server)(nil)

// NewServer returns a Server for s.
func NewServer(s *Store, opts ...ServerOption) *Server {
	srv := &Server{store: s, log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(srv)
	}
	return srv
}

// Register registers the Server's ADS service on gs.
func (srv *Server) Register(gs *grpc.Server) {
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, srv)
}

// receive reads a stream's requests on its own goroutine, so the sending side can wait on
// requests and store changes at once. It ends when the stream does.
func receive[T any](ctx context.Context, recv func() (*T, error)) <-chan recvResult[T] {
	ch := make(chan recvResult[T])
	go func() {
		for {
			req, err := recv()
			select {
			case ch <- recvResult[T]{req, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return ch
}

type recvResult[T any] struct {
	req *T
	err error
}

// nonces hands out a stream's response nonces.
type nonces uint64

func (n *nonces) next() uint64 {
	*n++
	return uint64(*n)
}

// ServeGRPC returns the component serving store's bus over gRPC on addr, with Sailplane's
// server defaults (panic recovery, keepalive, large messages), protected as sec says, with the
// gRPC health service SERVING once the store's producers synced (Store.WaitSynced). A
// plaintext listener on an address other than loopback, not allowed by sec, is ErrPlaintext.
// extra services (an Acceptor) are registered beside the bus's.
func ServeGRPC(store *Store, addr string, log *slog.Logger, sec Security, extra ...Registrar) (*grpcserver.Server, error) {
	log = log.With("component", "bus-server")
	opts, err := sec.serverOptions(addr, log)
	if err != nil {
		return nil, err
	}
	gs := grpcserver.New(log, opts...)
	NewServer(store, WithServerLogger(log)).Register(gs)
	for _, r := range extra {
		r.Register(gs)
	}
	return &grpcserver.Server{Addr: addr, GRPC: gs, Logger: log, WaitReady: store.WaitSynced}, nil
}

// Registrar is a gRPC service served beside the bus (an Acceptor).
type Registrar interface {
	Register(*grpc.Server)
}
