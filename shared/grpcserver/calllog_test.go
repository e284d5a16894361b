package grpcserver

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"sailplane.dev/shared/telemetry/telemetrytest"
	"sailplane.dev/shared/testlog"
)

// record is one log line a test kept.
type record struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

// records keeps every line a logger writes (and passes it on to the test's log).
type records struct {
	slog.Handler
	mu    *sync.Mutex
	lines *[]record
	with  []slog.Attr
}

func newRecords(t *testing.T) (*slog.Logger, func() []record) {
	r := records{Handler: testlog.New(t, slog.LevelDebug).Handler(), mu: &sync.Mutex{}, lines: &[]record{}}
	return slog.New(r), func() []record {
		r.mu.Lock()
		defer r.mu.Unlock()
		return slices.Clone(*r.lines)
	}
}

func (r records) Handle(ctx context.Context, rec slog.Record) error {
	line := record{level: rec.Level, msg: rec.Message, attrs: map[string]string{}}
	for _, a := range r.with {
		line.attrs[a.Key] = a.Value.String()
	}
	rec.Attrs(func(a slog.Attr) bool {
		line.attrs[a.Key] = a.Value.String()
		return true
	})
	r.mu.Lock()
	*r.lines = append(*r.lines, line)
	r.mu.Unlock()
	return r.Handler.Handle(ctx, rec)
}

func (r records) WithAttrs(attrs []slog.Attr) slog.Handler {
	r.Handler = r.Handler.WithAttrs(attrs)
	r.with = append(slices.Clip(r.with), attrs...)
	return r
}

// ads is an xDS server that reads one request, says who the caller is, and ends the stream with
// err.
type ads struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	err error
}

func (a ads) StreamAggregatedResources(stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	SetPeerIdentity(stream.Context(), "spiffe://cluster.local/ns/default/sa/reviews")
	for {
		if _, err := stream.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return a.err
			}
			return err
		}
	}
}

// TestCallLog: a stream is logged when it opens (at its first message) and when it closes, with
// the peer's address, the identity the handler verified and the xDS node of its first request,
// and only twice however many requests it carries; the level says how it ended.
func TestCallLog(t *testing.T) {
	for _, tc := range []struct {
		name      string
		err       error
		wantCode  string
		wantLevel slog.Level
	}{
		{"normal close", nil, "OK", slog.LevelDebug},
		{"refused", status.Error(codes.PermissionDenied, "no"), "PermissionDenied", slog.LevelInfo},
		{"server fault", status.Error(codes.Internal, "broken"), "Internal", slog.LevelWarn},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log, lines := newRecords(t)
			gs := New(log)
			discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, ads{err: tc.err})
			conn := dial(t, serve(t, gs))
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
			if err != nil {
				t.Fatal(err)
			}
			node := &corev3.Node{Id: "sidecar~10.0.0.1~reviews-1.default~default.svc.cluster.local"}
			for i := range 5 {
				req := &discoveryv3.DiscoveryRequest{TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster"}
				if i == 0 {
					req.Node = node // Envoy sends its node on the first request only
				}
				if err := stream.Send(req); err != nil {
					t.Fatal(err)
				}
			}
			if err := stream.CloseSend(); err != nil {
				t.Fatal(err)
			}
			_, err = stream.Recv()
			if errors.Is(err, io.EOF) {
				err = nil // the stream ended with OK
			}
			if status.Code(err).String() != tc.wantCode {
				t.Fatalf("stream ended with %v, want %s", err, tc.wantCode)
			}
			gs.Stop() // the server's interceptors have returned: the close is logged

			var calls []record
			for _, l := range lines() {
				if l.attrs["grpc.method"] == "StreamAggregatedResources" {
					calls = append(calls, l)
				}
			}
			if len(calls) != 2 {
				t.Fatalf("%d lines for the stream, want 2 (open, close): %v", len(calls), calls)
			}
			open, closed := calls[0], calls[1]
			if open.msg != "gRPC started call" || open.level != slog.LevelDebug {
				t.Errorf("first line %q at %v, want %q at DEBUG", open.msg, open.level, "gRPC started call")
			}
			if closed.msg != "gRPC finished call" || closed.level != tc.wantLevel {
				t.Errorf("last line %q at %v, want %q at %v", closed.msg, closed.level, "gRPC finished call", tc.wantLevel)
			}
			for _, l := range calls {
				for _, k := range []string{"peer.address", "grpc.service"} {
					if l.attrs[k] == "" {
						t.Errorf("%q has no %s: %v", l.msg, k, l.attrs)
					}
				}
				if l.attrs["node"] != node.Id {
					t.Errorf("%q: node %q, want %q", l.msg, l.attrs["node"], node.Id)
				}
			}
			if got := closed.attrs["peer.identity"]; got != "spiffe://cluster.local/ns/default/sa/reviews" {
				t.Errorf("peer.identity %q, want the one the handler set", got)
			}
			if closed.attrs["grpc.code"] != tc.wantCode || closed.attrs["grpc.duration"] == "" {
				t.Errorf("close line: code %q duration %q, want %s and a duration", closed.attrs["grpc.code"], closed.attrs["grpc.duration"], tc.wantCode)
			}
		})
	}
}

// TestUnaryCallLog: a unary call is logged once, when it ends.
func TestUnaryCallLog(t *testing.T) {
	log, lines := newRecords(t)
	gs := New(log)
	healthpb.RegisterHealthServer(gs, health.NewServer())
	conn := dial(t, serve(t, gs))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	gs.Stop()
	var calls []record
	for _, l := range lines() {
		if l.attrs["grpc.method"] == "Check" {
			calls = append(calls, l)
		}
	}
	if len(calls) != 1 || calls[0].msg != "gRPC finished call" || calls[0].level != slog.LevelDebug || calls[0].attrs["grpc.code"] != "OK" {
		t.Errorf("lines for the call: %v, want one DEBUG %q with code OK", calls, "gRPC finished call")
	}
}

// TestCallMetrics: an RPC moves grpc-go's OpenTelemetry server metrics on the MeterProvider
// given, as Prometheus reads them: grpc.server.call.duration is grpc_server_call_duration.
func TestCallMetrics(t *testing.T) {
	metrics := telemetrytest.New(t)
	gs := New(testlog.New(t, slog.LevelInfo), WithMeterProvider(metrics.Provider()))
	healthpb.RegisterHealthServer(gs, health.NewServer())
	conn := dial(t, serve(t, gs))

	const name, method = "grpc_server_call_duration", "grpc.health.v1.Health/Check"
	labels := []string{"grpc_method", method, "grpc_status", "OK"}
	before := metrics.Value(name, labels...)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	// The server records the call when it ends, which may be just after the client has its answer.
	metrics.WaitValue(before+1, name, labels...)
}

func serve(t testing.TB, gs *grpc.Server) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return lis.Addr().String()
}
