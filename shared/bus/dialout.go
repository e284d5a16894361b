package bus

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"sailplane.dev/shared/spiffe"
	"sailplane.dev/shared/workloadcert"
)

// Reverse ADS: a producer behind a firewall (a remote cluster's endpoint-watcher) dials the
// consumer and serves its Store over the stream it opened, as Kuma's zones dial their global
// control plane. The stream carries delta ADS with the roles swapped: the dialer sends
// DeltaDiscoveryResponses and receives DeltaDiscoveryRequests. Both ends reuse the ordinary bus
// code: the dialer runs Server on the stream, the acceptor runs the delta consumer on it.
const (
	ReverseServiceName = "sailplane.bus.v1.ReverseDiscoveryService"
	reverseStreamName  = "PublishResources"
	// ReverseMethod is the full gRPC method of the reverse stream.
	ReverseMethod = "/" + ReverseServiceName + "/" + reverseStreamName
)

// reverseServer is the handler type of the reverse service (grpc.ServiceDesc.HandlerType).
type reverseServer interface {
	serve(grpc.ServerStream) error
}

var reverseDesc = grpc.ServiceDesc{
	ServiceName: ReverseServiceName,
	HandlerType: (*reverseServer)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName:    reverseStreamName,
		Handler:       func(srv any, ss grpc.ServerStream) error { return srv.(reverseServer).serve(ss) },
		ServerStreams: true,
		ClientStreams: true,
	}},
	Metadata: "sailplane/bus/reverse",
}

// ErrStreamEnded is a dialed-in producer's stream that ended: its Source delivers no more.
var ErrStreamEnded = errors.New("bus: the dialed-in producer's stream ended")

// WithPlaintextDialOut lets DialOut connect without TLS to an address other than loopback.
func WithPlaintextDialOut() DialOption { return func(c *dialConfig) { c.plaintextDialOut = true } }

// DialOut connects to the bus consumer at target and serves store over the connection it opened
// (reverse ADS), reconnecting with the consumer's capped, jittered backoff until ctx is done.
// The connection is protected with WithSecurity (the consumer's identity checked against
// Security.Peers); a plaintext connection to an address other than loopback needs
// WithPlaintextDialOut, else DialOut returns ErrPlaintext.
func DialOut(ctx context.Context, target string, store *Store, opts ...DialOption) error {
	cfg := newDialConfig(opts)
	if cfg.creds.Info().SecurityProtocol == "insecure" && !cfg.plaintextDialOut && !IsLoopback(target) {
		return fmt.Errorf("bus dial-out to %s: %w (give the service a certificate, or allow plaintext)", target, ErrPlaintext)
	}
	srv := NewServer(store, WithServerLogger(cfg.log))
	return cfg.run(ctx, target, func(ctx context.Context, conn *grpc.ClientConn) (bool, error) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		cs, err := conn.NewStream(ctx, &reverseDesc.Streams[0], ReverseMethod)
		if err != nil {
			return false, err
		}
		rs := &reversedServerStream{ClientStream: cs}
		err = srv.DeltaAggregatedResources(rs)
		if err == nil {
			err = rs.recvErr
		}
		if errors.Is(err, io.EOF) {
			err = errors.New("the consumer ended the stream")
		}
		return rs.progress, err
	})
}

// reversedServerStream is the stream a producer dialed, seen as the server stream of delta ADS.
type reversedServerStream struct {
	grpc.ClientStream
	// Written by the receiving goroutine, read once the server returned (it waits for it no
	// longer, but the values are only reported).
	mu       sync.Mutex
	progress bool
	recvErr  error
}

func (s *reversedServerStream) Recv() (*discoveryv3.DeltaDiscoveryRequest, error) {
	req := new(discoveryv3.DeltaDiscoveryRequest)
	err := s.ClientStream.RecvMsg(req)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.recvErr = err
		return nil, err
	}
	s.progress = true
	return req, nil
}

func (s *reversedServerStream) Send(resp *discoveryv3.DeltaDiscoveryResponse) error {
	return s.ClientStream.SendMsg(resp)
}

func (s *reversedServerStream) SetHeader(metadata.MD) error  { return nil }
func (s *reversedServerStream) SendHeader(metadata.MD) error { return nil }
func (s *reversedServerStream) SetTrailer(metadata.MD)       {}

// reversedClientStream is a stream a producer dialed in, seen as a delta ADS consumer's stream.
type reversedClientStream struct {
	grpc.ServerStream
}

func (s reversedClientStream) Send(req *discoveryv3.DeltaDiscoveryRequest) error {
	return s.ServerStream.SendMsg(req)
}

func (s reversedClientStream) Recv() (*discoveryv3.DeltaDiscoveryResponse, error) {
	resp := new(discoveryv3.DeltaDiscoveryResponse)
	if err := s.ServerStream.RecvMsg(resp); err != nil {
		return nil, err
	}
	return resp, nil
}

func (s reversedClientStream) Header() (metadata.MD, error) { return nil, nil }
func (s reversedClientStream) Trailer() metadata.MD         { return nil }
func (s reversedClientStream) CloseSend() error             { return nil }

// AcceptFunc receives each producer that dialed in, authorized, as a Source of its resources.
// ctx ends when the producer's stream does; Subscribe on src then returns ErrStreamEnded. The
// stream ends when AcceptFunc returns or when the Subscribe context is done. peer is the
// producer's SPIFFE ID (zero on a plaintext bus).
type AcceptFunc func(ctx context.Context, peer spiffe.ID, src Source)

// Acceptor accepts producers that dial out (DialOut) to this bus's gRPC server: register it on
// the server (ServeGRPC's extra services). Only the identities in peers may dial in; they are
// authorized for the reverse stream only, not to consume the bus.
type Acceptor struct {
	peers          []spiffe.ID
	allowPlaintext bool
	accept         AcceptFunc
	log            *slog.Logger
	authorize      func(context.Context) (context.Context, error)
	opts           []DialOption
}

// AcceptorOption configures an Acceptor.
type AcceptorOption func(*Acceptor)

// WithAcceptorLogger sets the Acceptor's logger.
func WithAcceptorLogger(l *slog.Logger) AcceptorOption {
	return func(a *Acceptor) {
		if l != nil {
			a.log = l
		}
	}
}

// WithAcceptorPlaintext accepts producers without a certificate, on a plaintext bus (tests,
// or a network the user trusts); their peer ID is zero.
func WithAcceptorPlaintext() AcceptorOption { return func(a *Acceptor) { a.allowPlaintext = true } }

// WithAcceptorDialOptions configure the consumer run on each accepted stream (node ID, meter
// provider); connection options do not apply.
func WithAcceptorDialOptions(opts ...DialOption) AcceptorOption {
	return func(a *Acceptor) { a.opts = append(a.opts, opts...) }
}

// NewAcceptor returns an Acceptor handing each authorized producer to accept.
func NewAcceptor(peers []spiffe.ID, accept AcceptFunc, opts ...AcceptorOption) *Acceptor {
	a := &Acceptor{peers: slices.Clone(peers), accept: accept, log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(a)
	}
	a.authorize = peerAuthorizer(a.peers, a.log)
	return a
}

// Register registers the reverse service on gs.
func (a *Acceptor) Register(gs *grpc.Server) { gs.RegisterService(&reverseDesc, a) }

// AuthFuncOverride authorizes the reverse stream's callers against the Acceptor's peers rather
// than the bus's consumers (grpcserver.WithAuth asks it instead of the server's check).
func (a *Acceptor) AuthFuncOverride(ctx context.Context, _ string) (context.Context, error) {
	return a.authorize(ctx)
}

func (a *Acceptor) serve(ss grpc.ServerStream) error {
	ctx := ss.Context()
	id, err := workloadcert.PeerID(ctx)
	switch {
	case err != nil && !a.allowPlaintext:
		return status.Errorf(codes.Unauthenticated, "bus: dialing in needs a client certificate: %v", err)
	case err != nil:
		id = spiffe.ID{}
	case !slices.Contains(a.peers, id):
		// Checked here too: a plaintext-configured server does not run the authorizer.
		return status.Errorf(codes.PermissionDenied, "bus: %s may not dial in", id)
	}
	cfg := newDialConfig(a.opts)
	cfg.log = a.log
	src := &acceptedSource{stream: ss, cfg: cfg, peer: id.String(), end: make(chan struct{})}
	a.log.Info("bus producer dialed in", "peer", id.String())
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.accept(ctx, id, src)
	}()
	select {
	case <-done:
	case <-src.end:
	}
	a.log.Info("bus producer's stream ended", "peer", id.String())
	return nil
}

// acceptedSource is the Source of one dialed-in stream: one subscription, one session.
type acceptedSource struct {
	stream  grpc.ServerStream
	cfg     *dialConfig
	peer    string
	end     chan struct{}
	endOnce sync.Once
	used    sync.Mutex
	taken   bool
}

func (s *acceptedSource) Subscribe(ctx context.Context, typeURLs []string, h Handler) error {
	s.used.Lock()
	taken := s.taken
	s.taken = true
	s.used.Unlock()
	if taken {
		return errors.New("bus: a dialed-in stream carries one subscription")
	}
	defer s.endOnce.Do(func() { close(s.end) })
	cs := newConsumerState("dialed-in "+s.peer, typeURLs, h, s.cfg)
	defer cs.release()
	if len(cs.order) == 0 {
		h.Synced()
		select {
		case <-ctx.Done():
			return nil
		case <-s.stream.Context().Done():
			return ErrStreamEnded
		}
	}
	done := make(chan error, 1)
	go func() {
		_, err := deltaSession(reversedClientStream{s.stream}, cs, s.cfg)
		done <- err
	}()
	select {
	case err := <-done:
		return fmt.Errorf("%w: %v", ErrStreamEnded, err)
	case <-ctx.Done():
		// Ending the handler cancels the stream, which ends the session.
		s.endOnce.Do(func() { close(s.end) })
		<-done
		return nil
	}
}
