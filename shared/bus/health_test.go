package bus_test

import (
	"context"
	"testing"
	"time"

	"sailplane.dev/shared/bus/bustest"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/testwait"
)

// TestBusServerHealth: a bus server's gRPC health service (service "") answers NOT_SERVING while
// any producer holds its types (SyncAfter), and SERVING once every producer synced.
func TestBusServerHealth(t *testing.T) {
	s := bus.NewStore(bus.WithLogger(testLogger(t)))
	first, second := make(chan struct{}), make(chan struct{})
	s.SyncAfter(first, vsType)
	s.SyncAfter(second, vsType)
	conn, err := grpc.NewClient(bustest.Serve(t, s, testLogger(t), bus.Security{}), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	check := func() healthpb.HealthCheckResponse_ServingStatus {
		resp, err := health.Check(t.Context(), &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		if err != nil {
			t.Fatalf("health check: %v", err)
		}
		return resp.GetStatus()
	}

	if got := check(); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health with no producer synced: %v, want NOT_SERVING", got)
	}
	close(first)
	if got := check(); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health with one of two producers synced: %v, want NOT_SERVING", got)
	}
	close(second)
	testwait.Until(t, 30*time.Second, "the bus server's health is SERVING", func() bool {
		return check() == healthpb.HealthCheckResponse_SERVING
	})
}

// TestWaitSynced: Store.WaitSynced returns at once with no holds, ends with its context while a
// producer has not synced, and returns nil once it has.
func TestWaitSynced(t *testing.T) {
	s := bus.NewStore(bus.WithLogger(testLogger(t)))
	if err := s.WaitSynced(t.Context()); err != nil {
		t.Fatalf("WaitSynced with no holds: %v", err)
	}
	ready := make(chan struct{})
	s.SyncAfter(ready, vsType)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := s.WaitSynced(ctx); err == nil {
		t.Fatal("WaitSynced on an unsynced producer with an ended context: nil")
	}
	close(ready)
	if err := s.WaitSynced(t.Context()); err != nil {
		t.Fatalf("WaitSynced once synced: %v", err)
	}
}
