package framework

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/xds"
)

// Echo is a real gRPC backend answering grpc.testing.TestService/UnaryCall with its own ID, so
// a test can tell which backend served each RPC.
type Echo struct {
	testpb.UnimplementedTestServiceServer
	ID   string
	Addr string
}

// UnaryCall answers with the backend's ID.
func (e *Echo) UnaryCall(context.Context, *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	return &testpb.SimpleResponse{ServerId: e.ID}, nil
}

// StartEcho serves an Echo backend on addr (e.g. "127.0.0.1:0") until the test ends.
func StartEcho(t testing.TB, id, addr string) *Echo {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("echo %s: %v", id, err)
	}
	return StartEchoOn(t, id, lis)
}

// StartEchoOn serves an Echo backend on lis (e.g. a TestHost's listener) until the test ends.
func StartEchoOn(t testing.TB, id string, lis net.Listener) *Echo {
	t.Helper()
	e := &Echo{ID: id, Addr: lis.Addr().String()}
	ServeTestService(t, lis, e)
	return e
}

// ServeTestService serves impl as grpc.testing.TestService on lis until the test ends: for
// backends that misbehave on purpose.
func ServeTestService(t testing.TB, lis net.Listener, impl testpb.TestServiceServer) {
	t.Helper()
	srv := grpc.NewServer()
	testpb.RegisterTestServiceServer(srv, impl)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	// Wait for Serve to return so no goroutine outlives the test (goleak).
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
}

// GRPCBootstrap is the gRPC xDS bootstrap a proxyless client uses to reach Sailplane's xDS server.
func GRPCBootstrap(xdsAddr, nodeID string) []byte {
	b, _ := json.Marshal(map[string]any{
		"xds_servers": []any{map[string]any{
			"server_uri":      xdsAddr,
			"channel_creds":   []any{map[string]any{"type": "insecure"}},
			"server_features": []string{"xds_v3"},
		}},
		"node": map[string]any{
			"id":       nodeID,
			"locality": map[string]any{},
			"metadata": map[string]any{"GENERATOR": "grpc", "NAMESPACE": "demo", "CLUSTER_ID": "Kubernetes"},
		},
	})
	return b
}

// XDSClient dials target (e.g. "xds:///echo.demo.svc.cluster.local:7070") through gRPC's xDS
// resolver, bootstrapped against xdsAddr. Each client has its own xDS connection.
func XDSClient(t testing.TB, xdsAddr, target string) EchoClient {
	t.Helper()
	nodeID := fmt.Sprintf("sidecar~127.0.0.1~%s.demo~demo.svc.cluster.local", t.Name())
	builder, err := xds.NewXDSResolverWithConfigForTesting(GRPCBootstrap(xdsAddr, nodeID))
	if err != nil {
		t.Fatalf("xds resolver: %v", err)
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(builder))
	if err != nil {
		t.Fatalf("dial %s: %v", target, err)
	}
	t.Cleanup(func() { conn.Close() })
	return testpb.NewTestServiceClient(conn)
}

// Call sends one RPC, with optional header key/value pairs, and returns the ID of the backend
// that answered.
func Call(ctx context.Context, c EchoClient, headers ...string) (string, error) {
	if len(headers) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, headers...)
	}
	resp, err := c.UnaryCall(ctx, &testpb.SimpleRequest{})
	if err != nil {
		return "", err
	}
	return resp.GetServerId(), nil
}

// EchoClient calls Echo backends.
type EchoClient = testpb.TestServiceClient

// DialEcho connects straight to one Echo backend at addr, without xDS.
func DialEcho(t testing.TB, addr string) EchoClient {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	return testpb.NewTestServiceClient(conn)
}
