package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/tools/testenv"
)

const (
	clusterType  = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	listenerType = "type.googleapis.com/envoy.config.listener.v3.Listener"
)

// TestIstioctlProxyStatus runs Istio's own istioctl (built by tools/testenv from Istio's module)
// against hyper's plaintext loopback xDS port, as istioctl proxy-status --xds-address does
// against istiod: it (and istioctl x proxy-status, a column per type) lists a proxyless gRPC
// client and an Envoy-like sidecar, SYNCED on the replica named by --pod-name, and istioctl proxy-status <proxy> finds no difference between
// what the proxy holds (sailplanectl proxy-config all -o json, Envoy's config dump format) and
// what Sailplane answers for it.
func TestIstioctlProxyStatus(t *testing.T) {
	istioctl := testenv.IstioctlForTest(t)
	v1 := framework.StartEcho(t, "v1", "127.0.0.1:0")
	v2 := framework.StartEcho(t, "v2", "127.0.0.1:0")
	dir := t.TempDir()
	framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", "")
	framework.WriteFile(t, dir, "etc/sailplane/conf/service.yaml", serviceYAML(v1, v2))
	framework.WriteFile(t, dir, "etc/sailplane/conf/traffic.yaml", trafficYAML(50, 50))
	xdsAddr := framework.FreeAddr(t)
	framework.Start(t, dir, framework.Binary(t, "hyper"), "--config-source", "files", "--pod-name", "sailplane-0",
		"--xds-listen", xdsAddr, "--xds-tls-listen", framework.FreeAddr(t), "--bus-listen", framework.FreeAddr(t))

	client := framework.XDSClient(t, xdsAddr, echoTarget)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	framework.WaitServing(ctx, t, client)
	proxyless := t.Name() + ".demo" // framework.XDSClient's pod
	runSidecar(ctx, t, xdsAddr, "web")

	// istioctl's environment: no cluster to reach, and its own HOME.
	env := []string{"HOME=" + t.TempDir(), "KUBECONFIG=" + filepath.Join(dir, "no-kubeconfig")}
	istio := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, istioctl, args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	framework.Eventually(t, time.Minute, func() error {
		out, err := istio("proxy-status", "--xds-address", xdsAddr, "--plaintext", "-r", "default", "-o", "json")
		if err != nil {
			return fmt.Errorf("istioctl proxy-status: %v\n%s", err, out)
		}
		got := map[string]map[string]string{}
		var resp struct {
			Resources []struct {
				Node              struct{ ID string }
				GenericXdsConfigs []struct{ TypeURL, ConfigStatus string }
			}
			ControlPlane struct{ Identifier string }
		}
		if err := json.Unmarshal([]byte(out), &resp); err != nil {
			return fmt.Errorf("istioctl proxy-status -o json: %v\n%s", err, out)
		}
		for _, r := range resp.Resources {
			got[r.Node.ID] = map[string]string{}
			for _, g := range r.GenericXdsConfigs {
				got[r.Node.ID][g.TypeURL[strings.LastIndexByte(g.TypeURL, '.')+1:]] = g.ConfigStatus
			}
		}
		want := map[string]map[string]string{
			proxyless:  {"Cluster": "SYNCED", "ClusterLoadAssignment": "SYNCED", "Listener": "SYNCED", "RouteConfiguration": "SYNCED"},
			"web.demo": {"Cluster": "SYNCED", "Listener": "SYNCED"},
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("istioctl proxy-status: %v, want %v\n%s", got, want, out)
		}
		if !strings.Contains(resp.ControlPlane.Identifier, `"ID":"sailplane-0"`) {
			return fmt.Errorf("control plane %q, want the replica sailplane-0", resp.ControlPlane.Identifier)
		}
		return nil
	})
	out, err := istio("proxy-status", "--xds-address", xdsAddr, "--plaintext", "-r", "default")
	if err != nil || !strings.Contains(out, "web.demo") || !strings.Contains(out, "sailplane-0") || !strings.Contains(out, "2 (CDS,LDS)") {
		t.Errorf("istioctl proxy-status table (%v):\n%s", err, out)
	}
	t.Logf("istioctl proxy-status:\n%s", out)
	// The experimental command, a column per type.
	out, err = istio("x", "proxy-status", "--xds-address", xdsAddr, "--plaintext", "-r", "default", "--verbosity", "1")
	if web := rowOf(out, "web.demo"); err != nil || len(web) < 4 || web[2] != "SYNCED" || !strings.Contains(out, "sailplane-0") {
		t.Errorf("istioctl x proxy-status --verbosity 1 (%v): web.demo %q, want CDS SYNCED:\n%s", err, web, out)
	}
	t.Logf("istioctl x proxy-status --verbosity 1:\n%s", out)

	// What the proxy holds, in Envoy's config dump format, against what Sailplane answers.
	for _, proxy := range []string{"web.demo", proxyless} {
		dump := filepath.Join(t.TempDir(), "config_dump.json")
		pc := exec.CommandContext(ctx, framework.Binary(t, "sailplanectl"), "proxy-config", "all", proxy, "--xds-address", xdsAddr, "-o", "json")
		var stderr strings.Builder
		pc.Stderr = &stderr
		b, err := pc.Output()
		if err != nil {
			t.Fatalf("sailplanectl proxy-config all %s: %v\n%s", proxy, err, stderr.String())
		}
		framework.WriteFile(t, filepath.Dir(dump), filepath.Base(dump), string(b))
		out, err := istio("proxy-status", proxy, "--file", dump, "--xds-address", xdsAddr, "--plaintext", "-r", "default")
		if err != nil || !strings.Contains(out, "Clusters Match") || !strings.Contains(out, "Listeners Match") || !strings.Contains(out, "Routes Match") {
			t.Errorf("istioctl proxy-status %s --file (%v):\n%s", proxy, err, out)
		}
		t.Logf("istioctl proxy-status %s --file:\n%s", proxy, out)
		if proxy != "web.demo" {
			continue
		}
		// The comparison reads the clusters: a proxy missing them differs.
		framework.WriteFile(t, filepath.Dir(dump), filepath.Base(dump), withoutClusters(t, b))
		out, _ = istio("proxy-status", proxy, "--file", dump, "--xds-address", xdsAddr, "--plaintext", "-r", "default")
		if strings.Contains(out, "Clusters Match") || !strings.Contains(out, "Listeners Match") {
			t.Errorf("istioctl proxy-status %s --file, the clusters left out of the proxy's side:\n%s", proxy, out)
		}
	}
}

// withoutClusters is an Envoy config dump (JSON) with its clusters section emptied.
func withoutClusters(t *testing.T, dump []byte) string {
	t.Helper()
	var d struct {
		Configs []map[string]any `json:"configs"`
	}
	if err := json.Unmarshal(dump, &d); err != nil {
		t.Fatal(err)
	}
	for _, c := range d.Configs {
		if strings.HasSuffix(fmt.Sprint(c["@type"]), ".ClustersConfigDump") {
			delete(c, "dynamicActiveClusters")
		}
	}
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// rowOf is the fields of the line of out starting with name.
func rowOf(out, name string) []string {
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == name {
			return f
		}
	}
	return nil
}

// runSidecar is an Envoy-like sidecar, pod <pod>.demo, on a state-of-the-world stream: it
// watches every cluster and listener and ACKs each response, until ctx ends.
func runSidecar(ctx context.Context, t *testing.T, xdsAddr, pod string) {
	t.Helper()
	conn, err := grpc.NewClient(xdsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	stream, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	md, err := structpb.NewStruct(map[string]any{"NAMESPACE": "demo", "ISTIO_VERSION": "1.31.1", "PROXY_CONFIG": map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	node := &corev3.Node{Id: "sidecar~127.0.0.3~" + pod + ".demo~demo.svc.cluster.local", Metadata: md}
	for i, typeURL := range []string{clusterType, listenerType} {
		req := &discoverygrpc.DiscoveryRequest{TypeUrl: typeURL}
		if i == 0 {
			req.Node = node
		}
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan struct{})
	t.Cleanup(func() { <-done })
	go func() {
		defer close(done)
		for {
			resp, err := stream.Recv()
			if err != nil {
				return // the test ended
			}
			if err := stream.Send(&discoverygrpc.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(),
				VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}); err != nil {
				return
			}
		}
	}()
}
