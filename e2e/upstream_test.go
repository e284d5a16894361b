package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/shared/schema"
	"sailplane.dev/tools/demo/echo"
	"sailplane.dev/tools/testenv"
)

// upstreamVS routes every echo call to one subset.
func upstreamVS(subset string) string {
	return `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: echo, namespace: demo}
spec:
  hosts: [echo.demo.svc.cluster.local]
  http:
    - route: [{destination: {host: echo.demo.svc.cluster.local, subset: ` + subset + `}}]
`
}

// upstreamDR names the echo subsets.
const upstreamDR = `apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: echo, namespace: demo}
spec:
  host: echo.demo.svc.cluster.local
  subsets:
    - {name: v1, labels: {version: v1}}
    - {name: v2, labels: {version: v2}}
`

// A Kubernetes Service: istiod's api generator answers a ServiceEntry "synthetic-web" for it.
const upstreamKubeService = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}]
`

// waitBackend waits until every call of a few reaches backend. Calls may fail while the route
// switches: gRPC's client picks the new route's cluster before it fetched that cluster.
func waitBackend(ctx context.Context, t *testing.T, client framework.EchoClient, backend string) {
	t.Helper()
	framework.Eventually(t, 60*time.Second, func() error {
		c, err := echo.Count(ctx, client, 20)
		if err != nil {
			return err
		}
		if c[backend] != 20 {
			return fmt.Errorf("calls reached %v, want all on %s", c, backend)
		}
		return nil
	})
}

// TestUpstreamIstiod: hyper (files mode) reads Istio's istiod as an xds:// config source, as
// istiod reads another control plane: the VirtualService kept in istiod's API server routes a
// real gRPC xDS client of hyper, and an edit there moves its traffic. istiod answers only a
// four-part node ID with GENERATOR api; its synthetic ServiceEntries for Kubernetes services
// are not imported (the registry has those services).
func TestUpstreamIstiod(t *testing.T) {
	k := testenv.KubeForTest(t)
	kube := framework.NewKube(t, k.RestConfig())
	kube.Apply(t, upstreamKubeService+"---\n"+upstreamVS("v1"))
	// Plaintext: its api generator then wants no authenticated control-plane identity.
	istiod := testenv.IstiodForTest(t, k, "rootNamespace: istio-system\n", "ENABLE_XDS_API_GENERATOR_AUTH=false")

	v1 := framework.StartEcho(t, "v1", "127.0.0.1:0")
	v2 := framework.StartEcho(t, "v2", "127.0.0.1:0")
	dir := t.TempDir()
	framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", "configSources:\n  - address: fs://conf\n"+
		"  - address: xds://"+istiod.XDSAddr()+"\n    tlsSettings: {mode: DISABLE}\n")
	framework.WriteFile(t, dir, "etc/sailplane/conf/echo.yaml", serviceYAML(v1, v2)+"---\n"+upstreamDR)
	xds, busAddr := framework.FreeAddr(t), framework.FreeAddr(t)
	hyper := framework.Start(t, dir, framework.Binary(t, "hyper"), "--config-source", "files",
		"--xds-listen", xds, "--bus-listen", busAddr, "--xds-tls-listen", framework.FreeAddr(t))

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	client := framework.XDSClient(t, xds, echoTarget)
	framework.WaitServing(ctx, t, client)
	waitBackend(ctx, t, client, "v1")

	kube.Apply(t, upstreamVS("v2"))
	waitBackend(ctx, t, client, "v2")
	if !strings.Contains(hyper.Log(), "upstream config source synced") {
		t.Errorf("hyper did not log the upstream's first full state")
	}

	rec := framework.RecordBus(t, busAddr, schema.ServiceEntry.TypeURL, schema.VirtualService.TypeURL)
	framework.Eventually(t, 30*time.Second, func() error { return rec.HasAll(schema.VirtualService.TypeURL, "demo/echo") })
	if got := rec.Names(schema.ServiceEntry.TypeURL); !slices.Equal(got, []string{"demo/echo"}) {
		t.Fatalf("ServiceEntries on hyper's bus: %v, want only the local demo/echo (no synthetic ones)", got)
	}
}

// TestUpstreamIstiodMutualTLS: hyper reads istiod on its TLS port (15012) over mutual TLS with
// hyper's own workload certificate (tlsSettings.mode ISTIO_MUTUAL), both signed by one plugged-in
// root: istiod's api generator answers only an authenticated control-plane identity of its root
// namespace, so the VirtualService reaching hyper's gRPC client proves istiod verified hyper's
// certificate, and hyper checked istiod's (chain and the name istiod.istio-system.svc).
func TestUpstreamIstiodMutualTLS(t *testing.T) {
	_, cacerts := framework.PluggedInRoot(t, "upstream-e2e")
	k := testenv.KubeForTest(t)
	kube := framework.NewKube(t, k.RestConfig())
	kube.Apply(t, upstreamVS("v1"))
	istiod := testenv.IstiodForTestWith(t, k, "rootNamespace: istio-system\n",
		[]string{"ENABLE_CA_SERVER=true", "ROOT_CA_DIR=" + cacerts}, testenv.WithIstiodTLS())

	v1 := framework.StartEcho(t, "v1", "127.0.0.1:0")
	v2 := framework.StartEcho(t, "v2", "127.0.0.1:0")
	dir := t.TempDir()
	framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", "configSources:\n  - address: fs://conf\n"+
		"  - address: xds://"+istiod.SecureXDSAddr()+"\n    tlsSettings: {mode: ISTIO_MUTUAL, sni: istiod.istio-system.svc}\n")
	framework.WriteFile(t, dir, "etc/sailplane/conf/echo.yaml", serviceYAML(v1, v2)+"---\n"+upstreamDR)
	xds := framework.FreeAddr(t)
	hyper := framework.Start(t, dir, framework.Binary(t, "hyper"), "--config-source", "files", "--cacerts-dir", cacerts,
		"--namespace", "istio-system", "--xds-listen", xds, "--bus-listen", framework.FreeAddr(t), "--xds-tls-listen", framework.FreeAddr(t))

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	client := framework.XDSClient(t, xds, echoTarget)
	framework.WaitServing(ctx, t, client)
	waitBackend(ctx, t, client, "v1")
	kube.Apply(t, upstreamVS("v2"))
	waitBackend(ctx, t, client, "v2")
	if strings.Contains(hyper.Log(), "api generator requires") {
		t.Errorf("istiod refused hyper's identity at some point:\n%s", hyper.Log())
	}
}

// TestUpstreamSailplane: a config-ingest reads another Sailplane's config-ingest as an xds://
// config source (both binaries, plaintext on loopback); a VirtualService edited in the upstream's
// files reaches a real gRPC xDS client of the downstream's xds-server.
func TestUpstreamSailplane(t *testing.T) {
	v1 := framework.StartEcho(t, "v1", "127.0.0.1:0")
	v2 := framework.StartEcho(t, "v2", "127.0.0.1:0")

	upDir := t.TempDir()
	framework.WriteFile(t, upDir, "etc/sailplane/mesh.yaml", meshYAML)
	framework.WriteFile(t, upDir, "etc/sailplane/conf/vs.yaml", upstreamVS("v1"))
	upBus := framework.FreeAddr(t)
	framework.Start(t, upDir, framework.Binary(t, "config-ingest"), "--config-source", "files",
		"--mesh-config", upDir+"/etc/sailplane/mesh.yaml", "--bus-listen", upBus)

	dir := t.TempDir()
	framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", "configSources:\n  - address: fs://conf\n"+
		"  - address: xds://"+upBus+"\n    tlsSettings: {mode: DISABLE}\n")
	framework.WriteFile(t, dir, "etc/sailplane/conf/echo.yaml", serviceYAML(v1, v2)+"---\n"+upstreamDR)
	xds := framework.FreeAddr(t)
	framework.Start(t, dir, framework.Binary(t, "hyper"), "--config-source", "files",
		"--xds-listen", xds, "--bus-listen", framework.FreeAddr(t), "--xds-tls-listen", framework.FreeAddr(t))

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	client := framework.XDSClient(t, xds, echoTarget)
	framework.WaitServing(ctx, t, client)
	waitBackend(ctx, t, client, "v1")

	framework.WriteFile(t, upDir, "etc/sailplane/conf/vs.yaml", upstreamVS("v2"))
	waitBackend(ctx, t, client, "v2")
}
