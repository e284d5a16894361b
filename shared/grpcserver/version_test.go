package grpcserver

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"sailplane.dev/shared/testlog"
	"sailplane.dev/shared/version"
)

// TestServerVersion: every server New builds tells its version to a client over a real
// connection, whether or not it serves the probe's service, and a server without the headers is
// told apart.
func TestServerVersion(t *testing.T) {
	defer func(v, c string) { version.Version, version.Component = v, c }(version.Version, version.Component)
	version.Version, version.Component = "v0.9.0-test", "xds-server"
	for _, tc := range []struct {
		name    string
		server  func() *grpc.Server
		want    version.Info
		wantErr error
	}{
		{"serves health", func() *grpc.Server {
			gs := New(testlog.New(t, slog.LevelInfo))
			healthpb.RegisterHealthServer(gs, health.NewServer())
			return gs
		}, version.Info{Component: "xds-server", Version: "v0.9.0-test"}, nil},
		{"without health", func() *grpc.Server { return New(testlog.New(t, slog.LevelInfo)) },
			version.Info{Component: "xds-server", Version: "v0.9.0-test"}, nil},
		{"not a Sailplane server", func() *grpc.Server { return grpc.NewServer() }, version.Info{}, ErrNoVersion},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			gs := tc.server()
			go func() { _ = gs.Serve(lis) }()
			defer gs.Stop()
			conn := dial(t, lis.Addr().String())
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			got, err := ServerVersion(ctx, conn)
			if !errors.Is(err, tc.wantErr) || got != tc.want {
				t.Errorf("ServerVersion = %+v, %v; want %+v, %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// TestStreamHeader: a stream's client reads the headers with the server's first message.
func TestStreamHeader(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := New(testlog.New(t, slog.LevelInfo))
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()
	defer hs.Shutdown()
	conn := dial(t, lis.Addr().String())
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	watch, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch.Recv(); err != nil {
		t.Fatal(err)
	}
	md, err := watch.Header()
	if err != nil {
		t.Fatal(err)
	}
	if got := md.Get(VersionHeader); len(got) != 1 || got[0] != version.Get().Version {
		t.Errorf("%s = %v, want [%s]", VersionHeader, got, version.Get().Version)
	}
}

func dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
