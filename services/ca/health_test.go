package ca

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"sailplane.dev/shared/testwait"
)

// TestHealthServing: the CreateCertificate server answers the gRPC health service (service "")
// with SERVING once the ca is ready (a TLS client with only the roots may ask).
func TestHealthServing(t *testing.T) {
	r := startCA(t, Config{CertDir: t.TempDir()})
	health := healthpb.NewHealthClient(r.conn(t, r.RootsPEM(), nil))
	testwait.For(t, 30*time.Second, "the ca's health is SERVING", func() error {
		resp, err := health.Check(t.Context(), &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		if err != nil {
			return err
		}
		if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("health: %v", resp.GetStatus())
		}
		return nil
	})
}
