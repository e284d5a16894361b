package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/tools/demo/echo"
)

func localityYAML(near, far string) string {
	return echoServiceEntry + fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: echo-near, namespace: demo}
spec: {address: 127.0.0.1, ports: {grpc: %s}, labels: {app: echo}, locality: us-east/us-east-1a}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: echo-far, namespace: demo}
spec: {address: 127.0.0.1, ports: {grpc: %s}, labels: {app: echo}, locality: eu-west/eu-west-1a}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: echo, namespace: demo}
spec:
  host: echo.demo.svc.cluster.local
  trafficPolicy:
    outlierDetection: {consecutive5xxErrors: 5, interval: 1s}
`, near, far)
}

// TestProxylessLocality has real gRPC xDS clients in two regions prefer the backend in their
// own region, and fail over to the other when it goes away: EDS priorities as istiod sends
// them once outlier detection is on (the mesh enables locality load balancing by default).
func TestProxylessLocality(t *testing.T) {
	nearLis, farLis := listen(t), listen(t)
	stopNear := framework.ServeTestService(t, nearLis, &echo.Server{ID: "us-east"})
	framework.ServeTestService(t, farLis, &echo.Server{ID: "eu-west"})

	dir := t.TempDir()
	framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", meshYAML)
	framework.WriteFile(t, dir, "etc/sailplane/conf/echo.yaml",
		localityYAML(port(nearLis.Addr().String()), port(farLis.Addr().String())))
	xdsAddr, _ := topologies[0].start(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	for _, region := range []string{"us-east", "eu-west"} {
		t.Run("client in "+region, func(t *testing.T) {
			client := framework.XDSClientIn(t, xdsAddr, echoTarget, region, region+"-1a")
			framework.WaitServing(ctx, t, client)
			if counts := countBackends(ctx, t, client, 50); counts[region] != 50 {
				t.Fatalf("want all 50 RPCs in the client's own region %s, got %v", region, counts)
			}
		})
	}
	t.Run("fails over to the other region", func(t *testing.T) {
		client := framework.XDSClientIn(t, xdsAddr, echoTarget, "us-east", "us-east-1a")
		framework.Eventually(t, time.Minute, func() error {
			id, err := framework.Call(ctx, client)
			if err != nil || id != "us-east" {
				return fmt.Errorf("want the local backend first, got %q, %v", id, err)
			}
			return nil
		})
		stopNear()
		framework.Eventually(t, time.Minute, func() error {
			if id, err := framework.Call(ctx, client); err != nil || id != "eu-west" {
				return fmt.Errorf("want the eu-west backend after us-east went away, got %q, %v", id, err)
			}
			return nil
		})
	})
}
