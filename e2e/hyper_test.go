package e2e

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/schema"
	"sailplane.dev/tools/testenv"
)

// TestHyperNoFlags runs ./hyper with no flags from a folder holding etc/sailplane/, as a person
// trying Sailplane would, and expects it to serve that config on the default port. The mesh
// file is empty (Istio's defaults), so the config comes from etc/sailplane/conf/ beside it, and
// the ca keeps its root in etc/certs/.
func TestHyperNoFlags(t *testing.T) {
	const defaultXDS = "127.0.0.1:15010"
	for _, addr := range []string{defaultXDS, "127.0.0.1:15012", "127.0.0.1:15051", "127.0.0.1:15014"} {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("hyper's default port %s is taken by another process: %v", addr, err)
		}
		l.Close()
	}
	v1 := framework.StartEcho(t, "v1", "127.0.0.1:0")
	v2 := framework.StartEcho(t, "v2", "127.0.0.1:0")
	dir := t.TempDir()
	framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", "")
	framework.WriteFile(t, dir, "etc/sailplane/conf/service.yaml", serviceYAML(v1, v2))
	framework.WriteFile(t, dir, "etc/sailplane/conf/traffic.yaml", trafficYAML(0, 100))
	framework.Start(t, dir, framework.Binary(t, "hyper"))

	client := framework.XDSClient(t, defaultXDS, echoTarget)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	framework.WaitServing(ctx, t, client)
	if counts := countBackends(ctx, t, client, 50); counts["v2"] != 50 {
		t.Fatalf("want all 50 RPCs on v2, got %v", counts)
	}
	// Ready on the default monitoring port, once every linked service synced.
	framework.WaitReadyAt(t, "127.0.0.1:15014")

	// The ca keeps its root in etc/certs/ beside etc/sailplane/, and the TLS port's certificate
	// chains to it: a client trusting only that file gets the same answers over TLS.
	certs := filepath.Join(dir, "etc/certs")
	for _, f := range []string{pki.RootCertFile, pki.CACertFile, pki.CAKeyFile} {
		if _, err := os.Stat(filepath.Join(certs, f)); err != nil {
			t.Errorf("the ca's root is not in etc/certs/: %v", err)
		}
	}
	secure := framework.XDSClientTLS(t, "127.0.0.1:15012", echoTarget, certs)
	framework.WaitServing(ctx, t, secure)
	if counts := countBackends(ctx, t, secure, 10); counts["v2"] != 10 {
		t.Fatalf("over TLS, want all 10 RPCs on v2, got %v", counts)
	}
}

// TestHyperFindsKubernetes runs hyper with no config-source flag while $KUBECONFIG names a real
// API server: it must pick Kubernetes on its own and serve the Istio config stored there.
func TestHyperFindsKubernetes(t *testing.T) {
	k := testenv.KubeForTest(t)
	kube := framework.NewKube(t, k.RestConfig())
	kube.Apply(t, `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: found, namespace: demo}
spec:
  hosts: [found.demo.svc.cluster.local]
  http:
  - route: [{destination: {host: found.demo.svc.cluster.local}}]
`)
	t.Setenv("KUBECONFIG", k.KubeconfigPath())
	dir := t.TempDir() // no etc/sailplane here: files mode would find nothing to serve
	busAddr := framework.FreeAddr(t)
	hyper := framework.Start(t, dir, framework.Binary(t, "hyper"),
		"--xds-listen", framework.FreeAddr(t), "--bus-listen", busAddr, "--xds-tls-listen", framework.FreeAddr(t),
		"--webhook-listen", framework.FreeAddr(t))
	config := framework.RecordBus(t, busAddr, schema.VirtualService.TypeURL)
	framework.Eventually(t, time.Minute, func() error {
		return config.HasAll(schema.VirtualService.TypeURL, "demo/found")
	})
	if !strings.Contains(hyper.Log(), k.KubeconfigPath()) {
		t.Errorf("hyper's log does not say which kubeconfig it chose:\n%s", hyper.Log())
	}
}
