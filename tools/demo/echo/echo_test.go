package echo

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// headerEcho answers with the value of its request's x-id header, or fails without one.
type headerEcho struct {
	testpb.UnimplementedTestServiceServer
}

func (headerEcho) UnaryCall(ctx context.Context, _ *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("x-id"); len(v) == 1 {
		return &testpb.SimpleResponse{ServerId: v[0]}, nil
	}
	return nil, status.Error(codes.InvalidArgument, "no x-id")
}

// serve serves impl on 127.0.0.1 and returns a client of it.
func serve(t *testing.T, impl testpb.TestServiceServer) Client {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	Register(srv, impl)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
		<-done
	})
	return NewClient(conn)
}

func TestCount(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	counts, err := Count(ctx, serve(t, &Server{ID: "v1"}), 3)
	if err != nil || len(counts) != 1 || counts["v1"] != 3 {
		t.Fatalf("Count: %v, %v; want v1: 3", counts, err)
	}
	// Headers reach the server.
	withHeader := serve(t, headerEcho{})
	if counts, err := Count(ctx, withHeader, 2, "x-id", "canary"); err != nil || counts["canary"] != 2 {
		t.Fatalf("Count with a header: %v, %v; want canary: 2", counts, err)
	}
	// A failing RPC stops the count and says which one failed.
	if _, err := Count(ctx, withHeader, 2); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Count without the header: %v, want the server's InvalidArgument", err)
	}
}

func TestCountsPrint(t *testing.T) {
	for _, tc := range []struct {
		name   string
		counts Counts
		want   string
	}{
		{"split", Counts{"v2": 203, "v1": 797}, "v1     797   80%\nv2     203   20%\n"},
		{"one server", Counts{"v2": 100}, "v2     100  100%\n"},
		{"none", Counts{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := tc.counts.Print(&b); err != nil {
				t.Fatal(err)
			}
			if b.String() != tc.want {
				t.Fatalf("got\n%q\nwant\n%q", b.String(), tc.want)
			}
		})
	}
}
