// Package grpcserver builds the gRPC servers every Sailplane service exposes (bus, xDS) with the
// same defaults, and runs them under the Run(ctx) lifecycle.
package grpcserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"
	"unicode/utf8"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats/opentelemetry"
	"google.golang.org/grpc/status"

	"sailplane.dev/shared/version"
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

// Response headers with which every server says what it is, on every RPC (even one of a service it
// does not serve): `sailplanectl version` reads them, and any client may log them.
const (
	VersionHeader   = "sailplane-version"
	ComponentHeader = "sailplane-component"
)

// ClientKeepalive is how the clients of long-lived streams that mostly listen (bus consumers,
// the agent's xDS upstream) ping a server that has sent nothing for Time, giving the connection
// up when no answer comes within Timeout. Without it, a server whose link went down (a node lost,
// a cable pulled) leaves the stream open on the client's side forever: the server's own keepalive
// drops the connection without the client hearing of it, and every change made since never
// arrives. Time respects New's enforcement (pings at most every 10 s).
var ClientKeepalive = keepalive.ClientParameters{Time: 20 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}

// New returns a gRPC server that logs each call with its peer (SetPeerIdentity), at Debug when it
// ends well, turns a handler panic into an Internal error instead of a crash, records grpc-go's
// OpenTelemetry server metrics (grpc.server.call.duration, …) on the global MeterProvider
// (WithMeterProvider), accepts the keepalive pings xDS clients send on long-lived streams,
// refuses requests over MaxRecvMsgSize, and sends its version headers (VersionHeader,
// ComponentHeader) on every RPC, and authenticates calls (WithAuth). Interceptors in opts run
// after these, so the calls they refuse are logged and measured too.
func New(log *slog.Logger, opts ...grpc.ServerOption) *grpc.Server {
	onPanic := recovery.WithRecoveryHandler(func(p any) error {
		log.Error("panic in gRPC handler", "panic", p)
		return status.Errorf(codes.Internal, "internal error")
	})
	var meters metric.MeterProvider = otel.GetMeterProvider()
	var authenticate auth.AuthFunc
	for _, o := range opts {
		if m, ok := o.(meterProviderOption); ok && m.provider != nil {
			meters = m.provider
		}
		if a, ok := o.(authOption); ok {
			authenticate = a.authenticate
		}
	}
	v := version.Get()
	header := metadata.Pairs(VersionHeader, v.Version, ComponentHeader, v.Component)
	calls := callLogger(log)
	unary := []grpc.UnaryServerInterceptor{unaryCall,
		logging.UnaryServerInterceptor(calls, callLogOptions(logging.FinishCall)...),
		recovery.UnaryServerInterceptor(onPanic), unaryHeader(header)}
	stream := []grpc.StreamServerInterceptor{streamCall,
		logging.StreamServerInterceptor(calls, callLogOptions(logging.StartCall, logging.FinishCall)...),
		recovery.StreamServerInterceptor(onPanic), streamHeader(header)}
	if authenticate != nil {
		unary = append(unary, auth.UnaryServerInterceptor(authenticate))
		stream = append(stream, auth.StreamServerInterceptor(authenticate))
	}
	base := []grpc.ServerOption{
		opentelemetry.ServerOption(opentelemetry.Options{MetricsOptions: opentelemetry.MetricsOptions{MeterProvider: meters}}),
		grpc.ChainUnaryInterceptor(unary...),
		grpc.ChainStreamInterceptor(stream...),
		// A method the server does not serve still goes through the interceptors, so that it
		// carries the version headers too; the answer stays Unimplemented.
		grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
			m, _ := grpc.MethodFromServerStream(ss)
			return status.Errorf(codes.Unimplemented, "unknown method %s", m)
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.MaxRecvMsgSize(MaxRecvMsgSize),
		grpc.MaxConcurrentStreams(MaxConcurrentStreams),
	}
	return grpc.NewServer(append(base, opts...)...)
}

// WithMeterProvider is a New option recording the server's metrics with mp instead of the
// global MeterProvider (tests read them from their own); nil keeps the global one.
func WithMeterProvider(mp metric.MeterProvider) grpc.ServerOption {
	return meterProviderOption{provider: mp}
}

type meterProviderOption struct {
	grpc.EmptyServerOption
	provider metric.MeterProvider
}

// WithAuth is a New option authenticating every call in go-grpc-middleware's auth interceptor,
// after New's own interceptors so that refused calls are logged and measured: authenticate
// returns the handler's context, having recorded the caller's verified identity
// (SetPeerIdentity; handlers read it with PeerIdentity), or a gRPC status refusing the call. A
// service implementing auth.ServiceAuthFuncOverride authenticates its own calls instead,
// wherever it is registered (the ca, served on xds-server's listener in hyper). What a request
// may ask, given who asks, is the handler's to decide: it alone sees the request.
func WithAuth(authenticate auth.AuthFunc) grpc.ServerOption {
	return authOption{authenticate: authenticate}
}

type authOption struct {
	grpc.EmptyServerOption
	authenticate auth.AuthFunc
}

// Anyone is a WithAuth authenticator for servers whose callers need no identity: it lets every
// call through, so that the services registered on them that authenticate their own callers
// (auth.ServiceAuthFuncOverride) are asked.
func Anyone(ctx context.Context) (context.Context, error) { return ctx, nil }

// unaryHeader sets header on every unary response; it is sent with the response or the error.
func unaryHeader(header metadata.MD) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		_ = grpc.SetHeader(ctx, header)
		return handler(ctx, req)
	}
}

// streamHeader sets header on every stream; it is sent with the first response or the status,
// so that an xDS or bus stream costs no extra frame.
func streamHeader(header metadata.MD) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		_ = ss.SetHeader(header)
		return handler(srv, ss)
	}
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
	// WaitReady, when set, makes Run register the gRPC health service (grpc.health.v1, service
	// ""): NOT_SERVING until WaitReady returns nil (it blocks until what the server serves has
	// synced, or ctx ends), SERVING then, NOT_SERVING again while the server stops.
	WaitReady func(ctx context.Context) error
}

// Closed adapts a ready channel to Server.WaitReady.
func Closed(ready <-chan struct{}) func(context.Context) error {
	return func(ctx context.Context) error {
		select {
		case <-ready:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
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
	var hs *health.Server
	if s.WaitReady != nil {
		hs = health.NewServer()
		hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
		healthpb.RegisterHealthServer(s.GRPC, hs)
		ctx, cancel := context.WithCancel(ctx)
		healthDone := make(chan struct{})
		go func() {
			defer close(healthDone)
			if s.WaitReady(ctx) == nil {
				hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
			}
		}()
		// Registered first, so it runs last: the health goroutine has ended when Run returns.
		defer func() { <-healthDone }()
		defer cancel()
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
	if hs != nil {
		hs.Shutdown() // NOT_SERVING while stopping, so clients go elsewhere
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

// ErrNoVersion: the server answered without Sailplane's version headers (not a Sailplane server,
// or an older one).
var ErrNoVersion = errors.New("no version headers in the response")

// probeMethod is the RPC ServerVersion makes: the standard health check, which servers that do not
// serve it answer Unimplemented, with the headers all the same.
const probeMethod = "/grpc.health.v1.Health/Check"

// ServerVersion asks the server behind conn for its version, from the headers of one RPC.
func ServerVersion(ctx context.Context, conn grpc.ClientConnInterface) (version.Info, error) {
	var header metadata.MD
	err := conn.Invoke(ctx, probeMethod, &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{}, grpc.Header(&header))
	if v := header.Get(VersionHeader); len(v) > 0 {
		info := version.Info{Version: v[0]}
		if c := header.Get(ComponentHeader); len(c) > 0 {
			info.Component = c[0]
		}
		return info, nil
	}
	if err != nil && status.Code(err) != codes.Unimplemented {
		return version.Info{}, err
	}
	return version.Info{}, ErrNoVersion
}
