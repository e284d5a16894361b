package e2e

import (
	"context"
	"testing"
	"time"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/tools/testenv"
)

// TestKubeEndpointSliceScaling: Service demo/echo's EndpointSlice goes from 2 to 3 ready
// endpoints (echo servers in test hosts) and a real gRPC xDS client, connected to Sailplane, starts
// sending RPCs to the third.
func TestKubeEndpointSliceScaling(t *testing.T) {
	for _, topo := range kubeTopologies {
		t.Run(topo.name, func(t *testing.T) { testKubeEndpointSliceScaling(t, topo.start) })
	}
}

func testKubeEndpointSliceScaling(t *testing.T, start func(*testing.T, *testenv.Kube, *framework.Kube) sailplaneOnKube) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, echo, _, client := startTwoOfThreeOnKube(ctx, t, start)
	counts, err := reached(ctx, client, 60)
	if err != nil {
		t.Fatalf("with 2 ready endpoints: %v", err)
	}
	if err := onlyFrom(counts, echo.ids[:2]...); err != nil {
		t.Fatalf("with 2 ready endpoints: %v", err)
	}

	echo.setReady(t, 3)
	framework.Eventually(t, time.Minute, func() error {
		counts, err := reached(ctx, client, 30)
		if err != nil {
			return err
		}
		return allOf(counts, echo.ids[2])
	})
	counts, err = reached(ctx, client, 90)
	if err != nil {
		t.Fatalf("with 3 ready endpoints: %v", err)
	}
	if err := allOf(counts, echo.ids...); err != nil {
		t.Fatalf("with 3 ready endpoints: %v", err)
	}
}

// startTwoOfThreeOnKube starts a real API server, three echo backends published as Service
// demo/echo with two ready endpoints, and Sailplane on top; it returns once a real gRPC xDS
// client reaches both ready backends.
func startTwoOfThreeOnKube(ctx context.Context, t *testing.T, start func(*testing.T, *testenv.Kube, *framework.Kube) sailplaneOnKube) (*testenv.Kube, *echoBackends, sailplaneOnKube, framework.EchoClient) {
	t.Helper()
	k := testenv.KubeForTest(t)
	kube := framework.NewKube(t, k.RestConfig())
	echo := startEchoBackends(t, kube, 3)
	echo.publish(t)
	echo.setReady(t, 2)
	sp := start(t, k, kube)

	client := framework.XDSClient(t, sp.xds, echoTarget)
	// Generous: in the microservices topology every service first gets its certificate from the
	// ca, and a loaded CI machine starts four processes and an API server on two cores.
	framework.Eventually(t, 2*time.Minute, func() error {
		counts, err := reached(ctx, client, 20)
		if err != nil {
			return err
		}
		return allOf(counts, echo.ids[:2]...)
	})
	return k, echo, sp, client
}
