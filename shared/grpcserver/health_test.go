package grpcserver_test

import (
	"context"
	"log/slog"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"sailplane.dev/shared/grpcserver"
	"sailplane.dev/shared/testlog"
)

// TestHealthUntilStopped: with WaitReady set, a server answers the gRPC health service; one never
// ready says NOT_SERVING and still stops with its context (goleak checks that nothing waits on).
// Without WaitReady it serves no health service at all.
func TestHealthUntilStopped(t *testing.T) {
	for _, tc := range []struct {
		name      string
		waitReady func(context.Context) error
		want      healthpb.HealthCheckResponse_ServingStatus
		wantErr   bool
	}{
		{name: "never ready", waitReady: grpcserver.Closed(make(chan struct{})), want: healthpb.HealthCheckResponse_NOT_SERVING},
		{name: "no health service", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := testlog.New(t, slog.LevelDebug)
			addrc := make(chan string, 1)
			srv := &grpcserver.Server{Addr: "127.0.0.1:0", GRPC: grpcserver.New(log), Logger: log, WaitReady: tc.waitReady,
				Listening: func(a net.Addr) { addrc <- a.String() }}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- srv.Run(ctx) }()
			conn, err := grpc.NewClient(<-addrc, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			resp, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
			switch {
			case tc.wantErr && err == nil:
				t.Errorf("health check answered %v, want an error", resp.GetStatus())
			case !tc.wantErr && err != nil:
				t.Errorf("health check: %v", err)
			case !tc.wantErr && resp.GetStatus() != tc.want:
				t.Errorf("health %v, want %v", resp.GetStatus(), tc.want)
			}
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
}
