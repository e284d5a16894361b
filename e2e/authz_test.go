package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"sailplane.dev/e2e/framework"
)

const denyUnaryCallYAML = `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-unary, namespace: demo}
spec:
  selector: {matchLabels: {app: echo}}
  action: DENY
  rules:
  - to: [{operation: {paths: [/grpc.testing.TestService/UnaryCall]}}]
    when: [{key: "request.headers[x-deny]", values: ["yes"]}]
`

// TestProxylessServerAuthorization runs a real gRPC xDS server (xds.NewGRPCServer) and client
// through Sailplane: an AuthorizationPolicy denying one method for requests with a header makes
// those RPCs fail with PermissionDenied on the server (gRPC's RBAC filter, from the server-side
// listener, which follows the server's endpoint appearing in the registry), others pass, and
// deleting the policy lets them all through again.
func TestProxylessServerAuthorization(t *testing.T) {
	for _, topo := range topologies {
		t.Run(topo.name, func(t *testing.T) {
			lis := listen(t)
			dir := t.TempDir()
			framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", meshYAML)
			framework.WriteFile(t, dir, "etc/sailplane/conf/echo.yaml", echoServiceEntry)
			framework.WriteFile(t, dir, "etc/sailplane/conf/authz.yaml", denyUnaryCallYAML)
			xdsAddr, _ := topo.start(t, dir)

			// The server starts before the registry has its endpoint, as a pod does before it
			// is ready: its listener must follow when the endpoint appears.
			nodeID := "sidecar~127.0.0.1~echo-server.demo~demo.svc.cluster.local"
			framework.StartXDSEchoOn(t, "server", lis, framework.GRPCServerBootstrap(xdsAddr, nodeID, map[string]string{"app": "echo"}))
			framework.WriteFile(t, dir, "etc/sailplane/conf/workload.yaml", fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: echo-server, namespace: demo}
spec: {address: 127.0.0.1, ports: {grpc: %s}, labels: {app: echo}}
`, port(lis.Addr().String())))
			client := framework.XDSClient(t, xdsAddr, echoTarget)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()

			// The server serves only once it has its listener, which carries the policy.
			framework.Eventually(t, time.Minute, func() error {
				_, err := framework.Call(ctx, client, "x-deny", "yes")
				if status.Code(err) != codes.PermissionDenied {
					return fmt.Errorf("with x-deny: want PermissionDenied, got %v", err)
				}
				return nil
			})
			if id, err := framework.Call(ctx, client); err != nil || id != "server" {
				t.Fatalf("without the header: %q, %v; want an answer from the server", id, err)
			}
			if id, err := framework.Call(ctx, client, "x-deny", "no"); err != nil || id != "server" {
				t.Fatalf("with another header value: %q, %v; want an answer from the server", id, err)
			}

			if err := os.Remove(filepath.Join(dir, "etc/sailplane/conf/authz.yaml")); err != nil {
				t.Fatal(err)
			}
			framework.Eventually(t, 30*time.Second, func() error {
				_, err := framework.Call(ctx, client, "x-deny", "yes")
				return err
			})
		})
	}
}
