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
	"sailplane.dev/shared/spiffe"
)

func peerAuthenticationYAML(mode string) string {
	return fmt.Sprintf(`apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: demo}
spec:
  mtls: {mode: %s}
`, mode)
}

// TestProxylessMTLS runs a real gRPC xDS server (xds.NewGRPCServer with xDS credentials) and
// client through Sailplane, each with the certificates and gRPC bootstrap a real agent binary
// wrote (file_watcher provider). With a STRICT PeerAuthentication the server's listener
// requires mTLS and the client, in the mesh, gets auto mTLS: each side sees the other's
// SPIFFE ID, a plaintext client is refused, and an AuthorizationPolicy denying the caller's
// principal makes its calls PermissionDenied. Under PERMISSIVE the server accepts both
// clients: a gRPC server cannot tell TLS from plaintext on one port, so, as istiod, Sailplane
// serves a workload not labelled in the mesh in plaintext, and clients follow.
func TestProxylessMTLS(t *testing.T) {
	for _, topo := range topologies {
		t.Run(topo.name, func(t *testing.T) {
			lis := listen(t)
			dir := t.TempDir()
			framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", meshYAML)
			// A ServiceEntry is outside the mesh unless it says otherwise, and then gets no
			// auto mTLS.
			framework.WriteFile(t, dir, "etc/sailplane/conf/echo.yaml", `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: echo, namespace: demo}
spec:
  hosts: [echo.demo.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{name: grpc, number: 7070, protocol: GRPC}]
  workloadSelector: {labels: {app: echo}}
---
`+fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: echo-server, namespace: demo}
spec: {address: 127.0.0.1, ports: {grpc: %s}, labels: {app: echo}, serviceAccount: echo}
`, port(lis.Addr().String())))
			framework.WriteFile(t, dir, "etc/sailplane/conf/peer.yaml", peerAuthenticationYAML("STRICT"))
			xdsAddr, _ := topo.start(t, dir)

			ca := framework.StartCA(t, t.TempDir())
			serverID := spiffe.ID{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "echo"}
			callerID := spiffe.ID{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "caller"}
			serverBoot := framework.StartAgent(t, ca, framework.Agent{ID: serverID, XDSAddr: xdsAddr, Labels: map[string]string{"app": "echo"}})
			// The injector labels workloads that hold mesh certificates; auto mTLS needs it.
			callerBoot := framework.StartAgent(t, ca, framework.Agent{ID: callerID, XDSAddr: xdsAddr,
				Labels: map[string]string{"app": "caller", "security.istio.io/tlsMode": "istio"}})

			framework.StartMeshEchoOn(t, "server", lis, framework.ReadBootstrap(t, serverBoot))
			meshClient := framework.MeshClient(t, echoTarget, framework.ReadBootstrap(t, callerBoot))
			plainClient := framework.XDSClient(t, xdsAddr, echoTarget)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()

			want := framework.Identities{Server: "server", Caller: callerID.String(), Peer: serverID.String()}
			framework.Eventually(t, time.Minute, func() error {
				got, err := framework.CallIdentities(ctx, meshClient)
				if err != nil || got != want {
					return fmt.Errorf("mTLS client under STRICT: %+v, %v; want %+v", got, err, want)
				}
				return nil
			})
			// The server has its STRICT listener: plaintext is refused at the handshake.
			framework.Eventually(t, time.Minute, func() error {
				callCtx, callCancel := context.WithTimeout(ctx, 10*time.Second)
				defer callCancel()
				got, err := framework.CallIdentities(callCtx, plainClient)
				switch {
				case err == nil:
					t.Fatalf("a plaintext client reached a STRICT server: %+v", got)
				case status.Code(err) != codes.Unavailable:
					return fmt.Errorf("plaintext client: want Unavailable (refused), got %v", err)
				}
				return nil
			})

			// gRPC's RBAC matches principals against the caller's certificate.
			framework.WriteFile(t, dir, "etc/sailplane/conf/deny.yaml", `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-caller, namespace: demo}
spec:
  selector: {matchLabels: {app: echo}}
  action: DENY
  rules: [{from: [{source: {principals: [cluster.local/ns/demo/sa/caller]}}]}]
`)
			framework.Eventually(t, time.Minute, func() error {
				if _, err := framework.CallIdentities(ctx, meshClient); status.Code(err) != codes.PermissionDenied {
					return fmt.Errorf("caller denied by principal: want PermissionDenied, got %v", err)
				}
				return nil
			})
			if err := os.Remove(filepath.Join(dir, "etc/sailplane/conf/deny.yaml")); err != nil {
				t.Fatal(err)
			}

			framework.WriteFile(t, dir, "etc/sailplane/conf/peer.yaml", peerAuthenticationYAML("PERMISSIVE"))
			plaintext := framework.Identities{Server: "server"}
			framework.Eventually(t, time.Minute, func() error {
				for name, c := range map[string]framework.EchoClient{"plaintext": plainClient, "mesh": meshClient} {
					got, err := framework.CallIdentities(ctx, c)
					if err != nil || got != plaintext {
						return fmt.Errorf("%s client under PERMISSIVE: %+v, %v; want %+v", name, got, err, plaintext)
					}
				}
				return nil
			})
		})
	}
}
