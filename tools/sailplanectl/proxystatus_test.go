package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/xds"
	"google.golang.org/protobuf/types/known/structpb"
	networking "istio.io/api/networking/v1alpha3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	xdsserver "sailplane.dev/services/xds-server"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/testlog"
	"sailplane.dev/shared/testwait"
)

const (
	clusterType = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	echoHost    = "echo.demo.svc.cluster.local"
	waitFor     = 30 * time.Second
)

// startXDSServer runs a real xds-server named replica on 127.0.0.1, serving the echo service
// (gRPC on 7070) from store.
func startXDSServer(t *testing.T, replica string, store *bus.Store) string {
	t.Helper()
	svc := &discoveryv1.Service{Hostname: echoHost, Namespace: "demo",
		Ports: []*discoveryv1.Port{{Name: "grpc", Number: 7070, Protocol: "GRPC"}}}
	eps := &discoveryv1.Endpoints{Hostname: echoHost, Namespace: "demo",
		Endpoints: []*discoveryv1.Endpoint{{Address: "127.0.0.1", Ports: map[string]uint32{"grpc": 17070}}}}
	name := schema.Name("demo", echoHost)
	if err := store.Upsert(schema.Service.TypeURL, &bus.Resource{Name: name, Body: svc}); err != nil {
		t.Fatal(err)
	}
	if err := store.Upsert(schema.Endpoints.TypeURL, &bus.Resource{Name: name, Body: eps}); err != nil {
		t.Fatal(err)
	}
	src := bus.Local(store)
	srv, err := xdsserver.New(xdsserver.Config{Listen: "127.0.0.1:0", PodName: replica, Debounce: 5 * time.Millisecond},
		xdsserver.Deps{Logger: testlog.New(t, slog.LevelInfo), Config: src, Registry: src})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := srv.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("xds-server: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	select {
	case <-srv.Ready():
	case <-time.After(waitFor):
		t.Fatal("xds-server not ready")
	}
	return srv.Addr().String()
}

// startProxyless connects a real gRPC xDS client (pod grpc-client.demo) resolving the echo
// service: it subscribes to its listener, route, cluster and endpoints.
func startProxyless(t *testing.T, addr string) {
	t.Helper()
	bootstrap := fmt.Sprintf(`{
  "xds_servers": [{"server_uri": %q, "channel_creds": [{"type": "insecure"}], "server_features": ["xds_v3"]}],
  "node": {"id": "sidecar~127.0.0.1~grpc-client.demo~demo.svc.cluster.local", "metadata": {"GENERATOR": "grpc", "NAMESPACE": "demo"}, "locality": {}}
}`, addr)
	builder, err := xds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("xds:///"+echoHost+":7070", grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(builder))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	conn.Connect()
}

// envoyClient is an Envoy-like sidecar on a state-of-the-world stream: it watches clusters and
// ACKs, or NACKs when told to.
type envoyClient struct {
	t      *testing.T
	stream discoverygrpc.AggregatedDiscoveryService_StreamAggregatedResourcesClient
}

func startEnvoy(t *testing.T, addr, pod string) *envoyClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	md, _ := structpb.NewStruct(map[string]any{"NAMESPACE": "demo", "ISTIO_VERSION": "1.31.1", "PROXY_CONFIG": map[string]any{}})
	e := &envoyClient{t: t, stream: stream}
	e.send(&discoverygrpc.DiscoveryRequest{TypeUrl: clusterType,
		Node: &corev3.Node{Id: "sidecar~127.0.0.2~" + pod + ".demo~demo.svc.cluster.local", Metadata: md}})
	return e
}

func (e *envoyClient) send(req *discoverygrpc.DiscoveryRequest) {
	e.t.Helper()
	if err := e.stream.Send(req); err != nil {
		e.t.Fatal(err)
	}
}

// answer receives the next clusters and ACKs them, or NACKs them with reason.
func (e *envoyClient) answer(reason string) {
	e.t.Helper()
	resp, err := e.stream.Recv()
	if err != nil {
		e.t.Fatal(err)
	}
	req := &discoverygrpc.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce(), VersionInfo: resp.GetVersionInfo()}
	if reason != "" {
		req.VersionInfo, req.ErrorDetail = "", &statuspb.Status{Code: 3, Message: reason}
	}
	e.send(req)
}

// eventually retries check until it passes or the deadline.
func eventually(t *testing.T, check func() error) {
	t.Helper()
	testwait.For(t, waitFor, "condition", check)
}

// rows are a table's lines split in cells, by the first cell.
func rows(out string) map[string][]string {
	m := map[string][]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(l)
		if len(f) > 0 {
			m[f[0]] = f
		}
	}
	return m
}

// TestProxyStatus: a proxyless gRPC client and an Envoy-like sidecar, on two replicas, listed
// in one table with their replica, SYNCED; the sidecar NACKing a change shows NACKED, with the
// proxy's message in -o yaml and in the per-proxy view.
func TestProxyStatus(t *testing.T) {
	store := bus.NewStore()
	replica1 := startXDSServer(t, "xds-1", store)
	replica2 := startXDSServer(t, "xds-2", store)
	startProxyless(t, replica1)
	envoy := startEnvoy(t, replica2, "web")
	envoy.answer("")

	args := []string{"proxy-status", "--xds-address", replica1, "--xds-address", replica2, "--plaintext"}
	var table map[string][]string
	eventually(t, func() error {
		out, err := run(t, args...)
		if err != nil {
			return err
		}
		table = rows(out)
		g, w := table["grpc-client.demo"], table["web.demo"]
		// NAME CLUSTER CDS LDS EDS RDS REPLICA VERSION (two words for proxyless gRPC)
		if len(g) < 8 || strings.Join(g[2:7], " ") != "SYNCED SYNCED SYNCED SYNCED xds-1" {
			return fmt.Errorf("proxyless client's row %q, want SYNCED for CDS LDS EDS RDS on xds-1:\n%s", g, out)
		}
		if strings.Join(w, " ") != "web.demo Kubernetes SYNCED IGNORED IGNORED IGNORED xds-2 1.31.1" {
			return fmt.Errorf("sidecar's row %q, want clusters SYNCED on xds-2:\n%s", w, out)
		}
		return nil
	})
	if h := table["NAME"]; strings.Join(h, " ") != "NAME CLUSTER CDS LDS EDS RDS REPLICA VERSION" {
		t.Errorf("header %q", h)
	}

	// A DestinationRule changes the clusters; the sidecar rejects them.
	if err := store.Upsert(schema.DestinationRule.TypeURL, &bus.Resource{Name: "demo/echo", Body: &networking.DestinationRule{
		Host: echoHost, TrafficPolicy: &networking.TrafficPolicy{LoadBalancer: &networking.LoadBalancerSettings{
			LbPolicy: &networking.LoadBalancerSettings_Simple{Simple: networking.LoadBalancerSettings_RANDOM}}}}}); err != nil {
		t.Fatal(err)
	}
	envoy.answer("cluster outbound|7070||echo.demo.svc.cluster.local: unsupported")
	eventually(t, func() error {
		out, err := run(t, args...)
		if err != nil {
			return err
		}
		if w := rows(out)["web.demo"]; len(w) < 3 || w[2] != "NACKED" {
			return fmt.Errorf("sidecar's row %q, want CDS NACKED:\n%s", w, out)
		}
		return nil
	})
	out, err := run(t, append(args, "-o", "json")...)
	if err != nil {
		t.Fatal(err)
	}
	var statuses []proxyStatus
	if err := json.Unmarshal([]byte(out), &statuses); err != nil {
		t.Fatalf("-o json: %v\n%s", err, out)
	}
	var nacked *typeStatus
	for _, ps := range statuses {
		if ps.Name == "web.demo" && ps.Replica == "xds-2" && len(ps.Types) == 1 {
			nacked = &ps.Types[0]
		}
	}
	if nacked == nil || nacked.Status != "NACKED" || nacked.Error == nil || !strings.Contains(nacked.Error.Details, "unsupported") ||
		nacked.VersionAcked == "" || nacked.VersionAcked == nacked.VersionSent {
		t.Errorf("-o json for web.demo: %+v, want NACKED with the message, an acked version older than the one sent", nacked)
	}
	out, err = run(t, append(args, "web.demo")...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "CDS") || !strings.Contains(out, "NACKED") || !strings.Contains(out, "unsupported") {
		t.Errorf("proxy-status web.demo:\n%s", out)
	}
	if _, err := run(t, append(args, "nobody.demo")...); err == nil || !strings.Contains(err.Error(), "not connected") {
		t.Errorf("an unknown proxy: %v", err)
	}
	if _, err := run(t, "proxy-status", "--xds-address", freeAddr(t), "--timeout", "2s"); err == nil {
		t.Error("a replica that does not answer: no error")
	}
	if _, err := run(t, "proxy-status", "--plaintext", "--cert-dir", t.TempDir()); err == nil || !strings.Contains(err.Error(), "choose one") {
		t.Errorf("--plaintext with --cert-dir: %v", err)
	}
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestProxyConfig: what a proxyless client holds, per section, from the replica it is on.
func TestProxyConfig(t *testing.T) {
	store := bus.NewStore()
	other := startXDSServer(t, "xds-1", store)
	addr := startXDSServer(t, "xds-2", store)
	startProxyless(t, addr)
	args := func(section string, more ...string) []string {
		return append([]string{"proxy-config", section, "grpc-client.demo", "--xds-address", other, "--xds-address", addr}, more...)
	}
	eventually(t, func() error {
		out, err := run(t, args("endpoint")...)
		if err != nil {
			return err
		}
		if !strings.Contains(out, "127.0.0.1:17070") {
			return fmt.Errorf("endpoints:\n%s", out)
		}
		return nil
	})
	for _, tc := range []struct{ section, want string }{
		{"cluster", "echo.demo.svc.cluster.local  7070  -       outbound   EDS"},
		{"listener", "echo.demo.svc.cluster.local:7070  -          -     API listener  Route: outbound|7070||echo.demo.svc.cluster.local"},
		{"route", "outbound|7070||echo.demo.svc.cluster.local"},
		{"endpoint", "127.0.0.1:17070  HEALTHY"},
	} {
		out, err := run(t, args(tc.section)...)
		if err != nil {
			t.Fatalf("%s: %v", tc.section, err)
		}
		if !strings.Contains(out, tc.want) {
			t.Errorf("proxy-config %s:\n%s\nwant a row with %q", tc.section, out, tc.want)
		}
	}
	out, err := run(t, args("all", "-o", "json")...)
	if err != nil {
		t.Fatal(err)
	}
	var dump struct {
		Configs []map[string]any `json:"configs"`
	}
	if err := json.Unmarshal([]byte(out), &dump); err != nil || len(dump.Configs) != 8 {
		t.Fatalf("all -o json: %d sections (%v), want Envoy's 8:\n%.2000s", len(dump.Configs), err, out)
	}

	// An Envoy sidecar's listeners carry many typed filters: all of them print as JSON.
	envoy := startEnvoy(t, addr, "web")
	envoy.answer("")
	envoy.send(&discoverygrpc.DiscoveryRequest{TypeUrl: "type.googleapis.com/envoy.config.listener.v3.Listener"})
	envoy.answer("")
	out, err = run(t, "proxy-config", "listener", "web.demo", "--xds-address", addr)
	if err != nil || !strings.Contains(out, "virtualOutbound") || !strings.Contains(out, "PassthroughCluster") {
		t.Errorf("sidecar listeners (%v):\n%s", err, out)
	}
	if out, err := run(t, "proxy-config", "all", "web.demo", "--xds-address", addr, "-o", "json"); err != nil || !strings.Contains(out, "envoy.filters.listener.original_dst") {
		t.Errorf("sidecar's config as JSON (%v):\n%.2000s", err, out)
	}
	if _, err := run(t, "proxy-config", "cluster", "nobody.demo", "--xds-address", addr); err == nil || !strings.Contains(err.Error(), "not connected") {
		t.Errorf("an unknown proxy: %v", err)
	}
}
