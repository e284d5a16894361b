package e2e

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"sailplane.dev/e2e/framework"
)

// brokenBackend fails every RPC with UNAVAILABLE, the code istiod's retry policies retry.
type brokenBackend struct {
	testpb.UnimplementedTestServiceServer
	calls atomic.Int64
}

func (b *brokenBackend) UnaryCall(context.Context, *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	b.calls.Add(1)
	return nil, status.Error(codes.Unavailable, "broken on purpose")
}

// heldBackend holds every RPC until release is closed, announcing each on arrived.
type heldBackend struct {
	testpb.UnimplementedTestServiceServer
	arrived chan struct{}
	release chan struct{}
}

func (h *heldBackend) UnaryCall(ctx context.Context, _ *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	h.arrived <- struct{}{}
	select {
	case <-h.release:
		return &testpb.SimpleResponse{ServerId: "held"}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}

func policyYAML(v1, broken, held string) string {
	return echoServiceEntry + fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: echo-v1, namespace: demo}
spec: {address: 127.0.0.1, ports: {grpc: %s}, labels: {app: echo, version: v1, pool: flaky}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: echo-broken, namespace: demo}
spec: {address: 127.0.0.1, ports: {grpc: %s}, labels: {app: echo, version: broken, pool: flaky}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: echo-held, namespace: demo}
spec: {address: 127.0.0.1, ports: {grpc: %s}, labels: {app: echo, version: held}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: echo, namespace: demo}
spec:
  host: echo.demo.svc.cluster.local
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: flaky, labels: {pool: flaky}}
  - name: held
    labels: {version: held}
    trafficPolicy:
      connectionPool:
        http: {http2MaxRequests: 1}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: echo, namespace: demo}
spec:
  hosts: [echo.demo.svc.cluster.local]
  http:
  - match: [{headers: {x-test: {exact: abort}}}]
    fault:
      abort: {grpcStatus: ABORTED, percentage: {value: 100}}
    route: [{destination: {host: echo.demo.svc.cluster.local, subset: v1}}]
  - match: [{headers: {x-test: {exact: retry}}}]
    retries: {attempts: 3, retryOn: unavailable}
    route: [{destination: {host: echo.demo.svc.cluster.local, subset: flaky}}]
  - match: [{headers: {x-test: {exact: no-retry}}}]
    retries: {attempts: 0}
    route: [{destination: {host: echo.demo.svc.cluster.local, subset: flaky}}]
  - match: [{headers: {x-test: {exact: held}}}]
    retries: {attempts: 0}
    route: [{destination: {host: echo.demo.svc.cluster.local, subset: held}}]
  - route: [{destination: {host: echo.demo.svc.cluster.local, subset: v1}}]
`, port(v1), port(broken), port(held))
}

// TestProxylessPolicies checks that what a VirtualService and DestinationRule say about
// resilience reaches a real gRPC xDS client as it does from istiod: an injected abort (gRFC
// A33), retries over a failing backend (A44), and the maxRequests circuit breaker (A32).
func TestProxylessPolicies(t *testing.T) {
	v1 := framework.StartEcho(t, "v1", "127.0.0.1:0")
	brokenLis, heldLis := listen(t), listen(t)
	broken := &brokenBackend{}
	held := &heldBackend{arrived: make(chan struct{}, 4), release: make(chan struct{})}
	framework.ServeTestService(t, brokenLis, broken)
	framework.ServeTestService(t, heldLis, held)

	dir := t.TempDir()
	framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", meshYAML)
	framework.WriteFile(t, dir, "etc/sailplane/conf/echo.yaml",
		policyYAML(v1.Addr, brokenLis.Addr().String(), heldLis.Addr().String()))
	xdsAddr, _ := topologies[0].start(t, dir)
	client := framework.XDSClient(t, xdsAddr, echoTarget)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	t.Run("fault abort", func(t *testing.T) {
		// The first answer with the injected code also shows the client has the routes.
		framework.Eventually(t, time.Minute, func() error {
			_, err := framework.Call(ctx, client, "x-test", "abort")
			if status.Code(err) != codes.Aborted {
				return fmt.Errorf("want the injected ABORTED, got %v", err)
			}
			return nil
		})
		if id, err := framework.Call(ctx, client); err != nil || id != "v1" {
			t.Fatalf("without the header: %q, %v; want v1", id, err)
		}
	})

	t.Run("retries over a failing backend", func(t *testing.T) {
		before := broken.calls.Load()
		counts := countBackends(ctx, t, client, 50, "x-test", "retry")
		if counts["v1"] != 50 {
			t.Fatalf("want all 50 RPCs answered by v1 after retries, got %v", counts)
		}
		if broken.calls.Load() == before {
			t.Fatal("the broken backend was never tried: the test proves nothing")
		}
	})

	t.Run("no retries when attempts is 0", func(t *testing.T) {
		failed := 0
		for range 50 {
			if _, err := framework.Call(ctx, client, "x-test", "no-retry"); status.Code(err) == codes.Unavailable {
				failed++
			} else if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
		}
		if failed == 0 || failed == 50 {
			t.Fatalf("%d of 50 RPCs failed; want the broken backend's share to fail without retries", failed)
		}
	})

	t.Run("maxRequests limits concurrent RPCs", func(t *testing.T) {
		first := make(chan error, 1)
		go func() {
			_, err := framework.Call(ctx, client, "x-test", "held")
			first <- err
		}()
		select {
		case <-held.arrived:
		case <-ctx.Done():
			t.Fatal("the first RPC never reached the held backend")
		}
		// The second RPC exceeds maxRequests: 1 and is refused by the client, not queued.
		callCtx, callCancel := context.WithTimeout(ctx, 30*time.Second)
		defer callCancel()
		_, err := framework.Call(callCtx, client, "x-test", "held")
		if status.Code(err) != codes.Unavailable {
			t.Errorf("second concurrent RPC: %v; want UNAVAILABLE from the circuit breaker", err)
		}
		close(held.release)
		if err := <-first; err != nil {
			t.Fatalf("first RPC: %v", err)
		}
		if _, err := framework.Call(ctx, client, "x-test", "held"); err != nil {
			t.Fatalf("an RPC after the first finished: %v", err)
		}
	})
}
