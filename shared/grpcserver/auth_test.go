package grpcserver

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// byHeader authenticates callers by an x-test-identity header (standing in for a certificate).
func byHeader(ctx context.Context) (context.Context, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	ids := md.Get("x-test-identity")
	if len(ids) != 1 {
		return nil, status.Error(codes.Unauthenticated, "who are you")
	}
	SetPeerIdentity(ctx, ids[0])
	return ctx, nil
}

// whoAmI is an xDS server ending each stream with its caller's identity as its status message.
type whoAmI struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
}

func (whoAmI) StreamAggregatedResources(stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	return status.Error(codes.Aborted, "identity "+PeerIdentity(stream.Context()))
}

// ownAuth is a health service that authenticates its own callers, refusing everyone.
type ownAuth struct{ healthpb.HealthServer }

func (ownAuth) AuthFuncOverride(ctx context.Context, method string) (context.Context, error) {
	return nil, status.Errorf(codes.PermissionDenied, "%s: not for anyone", method)
}

// TestWithAuth: WithAuth's authenticator runs on unary calls and streams, refusing with its
// status (and the refusal logged as the call's end) or handing the handler the identity it
// verified; a service with its own authentication is asked instead.
func TestWithAuth(t *testing.T) {
	log, lines := newRecords(t)
	gs := New(log, WithAuth(byHeader))
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, whoAmI{})
	healthpb.RegisterHealthServer(gs, health.NewServer())
	conn := dial(t, serve(t, gs))

	ownServer := New(log, WithAuth(byHeader))
	healthpb.RegisterHealthServer(ownServer, ownAuth{health.NewServer()})
	ownConn := dial(t, serve(t, ownServer))

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	as := func(id string) context.Context {
		if id == "" {
			return ctx
		}
		return metadata.AppendToOutgoingContext(ctx, "x-test-identity", id)
	}
	check := func(conn *grpc.ClientConn, id string) error {
		_, err := healthpb.NewHealthClient(conn).Check(as(id), &healthpb.HealthCheckRequest{})
		return err
	}
	stream := func(id string) error {
		s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(as(id))
		if err != nil {
			return err
		}
		if _, err = s.Recv(); errors.Is(err, io.EOF) {
			return nil
		}
		return err
	}
	const id = "spiffe://cluster.local/ns/demo/sa/web"
	for _, tc := range []struct {
		name     string
		call     func() error
		wantCode codes.Code
		wantMsg  string
	}{
		{"unary, authenticated", func() error { return check(conn, id) }, codes.OK, ""},
		{"unary, refused", func() error { return check(conn, "") }, codes.Unauthenticated, "who are you"},
		{"stream, authenticated", func() error { return stream(id) }, codes.Aborted, "identity " + id},
		{"stream, refused", func() error { return stream("") }, codes.Unauthenticated, "who are you"},
		{"service's own authentication", func() error { return check(ownConn, id) }, codes.PermissionDenied,
			"/grpc.health.v1.Health/Check: not for anyone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if st := status.Convert(err); st.Code() != tc.wantCode || st.Message() != tc.wantMsg {
				t.Fatalf("got %v, want %v %q", err, tc.wantCode, tc.wantMsg)
			}
		})
	}
	gs.Stop()
	ownServer.Stop()
	refused := 0
	for _, l := range lines() {
		if l.msg == "gRPC finished call" && l.attrs["grpc.code"] == "Unauthenticated" {
			refused++
		}
	}
	if refused != 2 {
		t.Errorf("%d refused calls logged, want 2", refused)
	}
}
