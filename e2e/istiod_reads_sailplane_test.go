package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/bus/bustest"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/spiffe"
	"sailplane.dev/tools/demo/echo"
	"sailplane.dev/tools/testenv"
)

// istiodMesh is istiod's mesh config reading its Istio config only from the xds:// source at
// busAddr (no k8s:// source: the API server still gives istiod its service registry).
func istiodMesh(busAddr, tlsSettings string) string {
	return "rootNamespace: istio-system\nconfigSources:\n  - address: xds://" + busAddr + "\n" + tlsSettings
}

// TestIstiodReadsSailplane: Istio's istiod reads Sailplane's config-ingest (files mode, bus in
// plaintext on loopback) as its xds:// config source, the migration path where Sailplane
// ingests and validates config while istiod still serves the proxies. The echo ServiceEntry,
// WorkloadEntries, DestinationRule and 80/20 VirtualService all come from Sailplane's files; a
// real gRPC xDS client of istiod's sees the split, and an edit of the file to 0/100 moves its
// traffic, through istiod.
func TestIstiodReadsSailplane(t *testing.T) {
	v1 := framework.StartEcho(t, "v1", "127.0.0.1:0")
	v2 := framework.StartEcho(t, "v2", "127.0.0.1:0")
	dir := t.TempDir()
	framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", meshYAML)
	framework.WriteFile(t, dir, "etc/sailplane/conf/echo/service.yaml", serviceYAML(v1, v2))
	framework.WriteFile(t, dir, "etc/sailplane/conf/echo/traffic.yaml", trafficYAML(80, 20))
	busAddr := framework.FreeAddr(t)
	startIngest := func() *framework.Process {
		return framework.Start(t, dir, framework.Binary(t, "config-ingest"), "--config-source", "files",
			"--mesh-config", dir+"/etc/sailplane/mesh.yaml", "--bus-listen", busAddr)
	}
	ingest := startIngest()

	k := testenv.KubeForTest(t)
	istiod := testenv.IstiodForTest(t, k, istiodMesh(busAddr, ""))

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client := framework.XDSClient(t, istiod.XDSAddr(), echoTarget)
	framework.WaitServing(ctx, t, client)
	checkCanaryRouting(ctx, t, client, func() {
		framework.WriteFile(t, dir, "etc/sailplane/conf/echo/traffic.yaml", trafficYAML(0, 100))
	})
	t.Run("config-ingest restarted", func(t *testing.T) {
		// Down, istiod keeps what it read; back, its full state replaces it, deletions included:
		// without the VirtualService and DestinationRule the calls spread over both backends.
		ingest.Stop()
		if counts := countBackends(ctx, t, client, 100); counts["v2"] != 100 {
			t.Fatalf("config-ingest down: want all 100 RPCs still on v2, got %v", counts)
		}
		if err := os.Remove(filepath.Join(dir, "etc/sailplane/conf/echo/traffic.yaml")); err != nil {
			t.Fatal(err)
		}
		startIngest()
		// Calls may fail while the route switches (gRPC drops the subset clusters first).
		framework.Eventually(t, 30*time.Second, func() error {
			c, err := echo.Count(ctx, client, 50)
			if err != nil {
				return err
			}
			if c["v1"] == 0 || c["v2"] == 0 {
				return fmt.Errorf("calls reached %v, want both backends once the routing is deleted", c)
			}
			return nil
		})
	})
}

// TestIstiodReadsSailplaneMutualTLS: with an identity, config-ingest serves its bus only over
// mutual TLS to the peers it admits, and istiod cannot be one: its xds:// config source builds TLS
// only for tlsSettings mode SIMPLE, and never with a client certificate (Istio's
// getTransportCredentials: ISTIO_MUTUAL and MUTUAL dial plaintext). Both ways istiod is refused
// and never reaches "synced" (no config from the bus, not ready) — never served weaker than
// configured — though Sailplane's ca and istiod share one plugged-in root and istiod holds its
// own certificate from it. A consumer with istiod's SPIFFE identity is not a default peer either.
func TestIstiodReadsSailplaneMutualTLS(t *testing.T) {
	auth, cacerts := framework.PluggedInRoot(t, "istiod-reads-e2e")

	dir := t.TempDir()
	framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", meshYAML)
	framework.WriteFile(t, dir, "etc/sailplane/conf/vs.yaml", upstreamVS("v1"))
	caAddr, busAddr := framework.FreeAddr(t), framework.FreeAddr(t)
	framework.Start(t, dir, framework.Binary(t, "ca"), "--kubernetes=false", "--ca-listen", caAddr,
		"--cacerts-dir", cacerts, "--service-cert-dir", "var/service-certs", "--bus-listen", framework.FreeAddr(t))
	identity := waitServiceCerts(t, dir, caAddr)
	ingest := framework.Start(t, dir, framework.Binary(t, "config-ingest"), append(identity("config-ingest"),
		"--config-source", "files", "--mesh-config", "etc/sailplane/mesh.yaml", "--bus-listen", busAddr)...)
	// The bus is up and serves Sailplane's own consumers.
	xdsServer := framework.IdentityFromDir(t, filepath.Join(dir, "var/service-certs/xds-server"))
	rec := framework.RecordSecureBus(t, busAddr, bus.Security{Identity: xdsServer, Peers: bus.SailplanePeers("cluster.local", "istio-system")},
		schema.VirtualService.TypeURL)
	framework.Eventually(t, time.Minute, func() error { return rec.HasAll(schema.VirtualService.TypeURL, "demo/echo") })

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	istiodID := spiffe.ID{TrustDomain: "cluster.local", Namespace: "istio-system", ServiceAccount: "istiod"}
	err := bustest.SubscribeOnce(ctx, busAddr, framework.AnyServer(framework.SignIdentity(t, auth, istiodID)), schema.VirtualService.TypeURL)
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("a consumer with identity %s: %v, want PermissionDenied (not a default bus peer)", istiodID, err)
	}

	k := testenv.KubeForTest(t)
	for _, tc := range []struct{ name, tlsSettings, refusal string }{
		// Plaintext against the TLS listener.
		{"ISTIO_MUTUAL", "{mode: ISTIO_MUTUAL}", "bus client refused: plaintext client"},
		// TLS without a client certificate: the bus requires one ("tls: certificate required").
		{"SIMPLE", "{mode: SIMPLE, insecureSkipVerify: true}", "bus client refused: no client certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The stream istiod opens at start is refused, and istiod exits (as it does whenever
			// its xds:// source is unreachable at start) before it could serve anything.
			_, err := testenv.StartIstiod(ctx, k.KubeconfigPath(), istiodMesh(busAddr, "    tlsSettings: "+tc.tlsSettings+"\n"),
				[]string{"ENABLE_CA_SERVER=true", "ROOT_CA_DIR=" + cacerts}, testenv.WithIstiodTLS())
			if err == nil || !strings.Contains(err.Error(), "MCP: failed running rpc error: code = Unavailable") {
				t.Fatalf("istiod with tlsSettings %s against the mTLS bus: %v, want it refused (its MCP stream Unavailable)", tc.tlsSettings, err)
			}
			if strings.Contains(err.Error(), "type=networking.istio.io/v1/VirtualService") {
				t.Errorf("istiod received VirtualServices from the mTLS bus it cannot authenticate to:\n%v", err)
			}
			// config-ingest names the refused client and why.
			framework.Eventually(t, 10*time.Second, func() error {
				if !strings.Contains(ingest.Log(), tc.refusal) {
					return fmt.Errorf("config-ingest's log does not show %q", tc.refusal)
				}
				return nil
			})
		})
	}
}
