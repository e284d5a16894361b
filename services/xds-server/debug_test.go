package xdsserver

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resource "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"sailplane.dev/services/xds-server/internal/fakebus"
	"sailplane.dev/shared/monitoring"
)

// serveMonitoring serves d on a monitoring server on a loopback port until the test ends and
// returns its base URL.
func serveMonitoring(t *testing.T, d monitoring.Debug) string {
	t.Helper()
	mon := monitoring.New("127.0.0.1:0", testLogger(t))
	mon.AddDebug("xds-server", d)
	addr := make(chan net.Addr, 1)
	mon.OnListening(func(a net.Addr) { addr <- a })
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := mon.Run(ctx); err != nil {
			t.Errorf("monitoring: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return "http://" + (<-addr).String()
}

// getJSON GETs url and decodes its JSON body into v; it returns the status code.
func getJSON(t *testing.T, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK {
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: content type %q", url, ct)
		}
		if err := json.Unmarshal(body, v); err != nil {
			t.Fatalf("%s: %v: %s", url, err, body)
		}
	}
	return resp.StatusCode
}

// subscribeListener connects proxy node name (delta ADS), subscribes to echo's listener and
// ACKs the first response, which it returns with the stream.
func subscribeListener(t *testing.T, srv *Server, name string) (discoverygrpc.AggregatedDiscoveryService_DeltaAggregatedResourcesClient, *discoverygrpc.DeltaDiscoveryResponse) {
	t.Helper()
	stream, err := adsClient(t, srv.Addr()).DeltaAggregatedResources(streamContext(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discoverygrpc.DeltaDiscoveryRequest{Node: testNode(name), TypeUrl: resource.ListenerType,
		ResourceNamesSubscribe: []string{echoListener}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: resource.ListenerType, ResponseNonce: resp.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	return stream, resp
}

// emptyService is a service without endpoints: its cluster has no instances.
const emptyService = `
apiVersion: sailplane.dev/v1
kind: Service
spec:
  hostname: empty.demo.svc.cluster.local
  namespace: demo
  registry: kubernetes
  addresses: [10.0.0.9]
  ports: [{name: http, number: 80, protocol: HTTP}]
`

// TestDebugEndpoints: istiod's JSON debug endpoints, in the shapes istiod gives them (the keys
// Kiali and scripts written for istiod read), for a proxyless client that ACKed its listener.
func TestDebugEndpoints(t *testing.T) {
	src := fakebus.New(changes(t, registry(10001, 10002)+"---\n"+virtualService(80, 20)+"---\n"+emptyService)...)
	srv := startServer(t, src)
	base := serveMonitoring(t, srv.Debug())
	_, resp := subscribeListener(t, srv, "debugged")

	t.Run("syncz", func(t *testing.T) {
		var got []map[string]any
		waitUntil(t, func() bool {
			getJSON(t, base+"/debug/syncz", &got)
			return len(got) == 1 && got[0]["listener_acked"] == resp.GetNonce()
		})
		for k, want := range map[string]any{"proxy": "debugged.demo", "cluster_id": "Kubernetes", "proxy_type": "sidecar",
			"listener_sent": resp.GetNonce(), "listener_acked": resp.GetNonce()} {
			if got[0][k] != want {
				t.Errorf("%s = %v, want %v", k, got[0][k], want)
			}
		}
		lds, _ := got[0]["resources"].(map[string]any)[resource.ListenerType].(map[string]any)
		if lds["sent"] != resp.GetNonce() || lds["acked"] != resp.GetNonce() || lds["status"] != "SYNCED" || lds["sentTime"] == nil {
			t.Errorf("resources[LDS] = %v, want sent and acked %s, SYNCED, a sent time", lds, resp.GetNonce())
		}
		if getJSON(t, base+"/debug/syncz?namespace=other", &got); len(got) != 0 {
			t.Errorf("syncz of namespace other: %v", got)
		}
	})

	t.Run("config_dump", func(t *testing.T) {
		r, err := http.Get(base + "/debug/config_dump?proxyID=debugged.demo")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(r.Body)
		r.Body.Close()
		dump := &adminv3.ConfigDump{}
		if err := protojson.Unmarshal(body, dump); err != nil {
			t.Fatalf("%v: %s", err, body)
		}
		var listeners adminv3.ListenersConfigDump
		for _, c := range dump.GetConfigs() {
			if c.MessageIs(&listeners) {
				if err := c.UnmarshalTo(&listeners); err != nil {
					t.Fatal(err)
				}
			}
		}
		if l := listeners.GetDynamicListeners(); len(l) != 1 || l[0].GetName() != echoListener {
			t.Fatalf("listeners dumped %v, want %s", l, echoListener)
		}
		var l listenerv3.Listener
		if err := listeners.GetDynamicListeners()[0].GetActiveState().GetListener().UnmarshalTo(&l); err != nil || l.GetApiListener() == nil {
			t.Errorf("dumped listener %v (%v), want the API listener sent", &l, err)
		}
		for query, want := range map[string]int{"": http.StatusBadRequest, "?proxyID=nobody.demo": http.StatusNotFound} {
			if code := getJSON(t, base+"/debug/config_dump"+query, nil); code != want {
				t.Errorf("config_dump%s: %d, want %d", query, code, want)
			}
		}
	})

	t.Run("adsz", func(t *testing.T) {
		var got struct {
			Total   int `json:"totalClients"`
			Clients []struct {
				ConnectionID string              `json:"connectionId"`
				ConnectedAt  string              `json:"connectedAt"`
				Address      string              `json:"address"`
				Metadata     map[string]any      `json:"metadata"`
				Watches      map[string][]string `json:"watches"`
			} `json:"clients"`
		}
		getJSON(t, base+"/debug/adsz", &got)
		if got.Total != 1 || len(got.Clients) != 1 {
			t.Fatalf("adsz %+v, want one client", got)
		}
		c := got.Clients[0]
		if !strings.HasPrefix(c.ConnectionID, "debugged.demo-") || c.ConnectedAt == "" || !strings.HasPrefix(c.Address, "127.0.0.1:") ||
			c.Metadata["NAMESPACE"] != "demo" || c.Metadata["GENERATOR"] != "grpc" {
			t.Errorf("client %+v", c)
		}
		if w := c.Watches[resource.ListenerType]; len(w) != 1 || w[0] != echoListener {
			t.Errorf("watches %v, want the listener %s", c.Watches, echoListener)
		}
		if code := getJSON(t, base+"/debug/adsz?proxyID=nobody.demo", nil); code != http.StatusNotFound {
			t.Errorf("adsz of an unknown proxy: %d, want 404", code)
		}
	})

	t.Run("registryz", func(t *testing.T) {
		var got []struct {
			Attributes struct {
				ServiceRegistry, Name, Namespace string
			}
			Ports []struct {
				Name     string
				Port     int
				Protocol string
			} `json:"ports"`
			Hostname       string                                  `json:"hostname"`
			DefaultAddress string                                  `json:"defaultAddress"`
			ClusterVIPs    struct{ Addresses map[string][]string } `json:"clusterVIPs"`
			Resolution     int
		}
		getJSON(t, base+"/debug/registryz", &got)
		if len(got) != 2 || got[0].Hostname != "echo.demo.svc.cluster.local" || got[1].Hostname != "empty.demo.svc.cluster.local" {
			t.Fatalf("registryz %+v, want echo and empty", got)
		}
		if p := got[0].Ports; len(p) != 1 || p[0].Name != "grpc" || p[0].Port != 7070 || p[0].Protocol != "GRPC" {
			t.Errorf("echo's ports %+v", p)
		}
		e := got[1]
		if e.Attributes.ServiceRegistry != "Kubernetes" || e.Attributes.Name != "empty" || e.Attributes.Namespace != "demo" ||
			e.DefaultAddress != "10.0.0.9" || len(e.ClusterVIPs.Addresses["Kubernetes"]) != 1 || e.Resolution != 0 {
			t.Errorf("empty's entry %+v", e)
		}
	})

	t.Run("configz", func(t *testing.T) {
		var got []struct {
			Kind       string `json:"kind"`
			APIVersion string `json:"apiVersion"`
			Metadata   struct{ Name, Namespace string }
			Spec       struct{ Hosts []string }
		}
		getJSON(t, base+"/debug/configz", &got)
		kinds := map[string]bool{}
		for _, c := range got {
			kinds[c.Kind+" "+c.APIVersion+" "+c.Metadata.Namespace+"/"+c.Metadata.Name] = true
			if c.Kind == "VirtualService" && (len(c.Spec.Hosts) != 1 || c.Spec.Hosts[0] != "echo") {
				t.Errorf("VirtualService spec %+v", c.Spec)
			}
		}
		for _, want := range []string{"VirtualService networking.istio.io/v1 demo/echo", "DestinationRule networking.istio.io/v1 demo/echo"} {
			if !kinds[want] {
				t.Errorf("configz lacks %s: %v", want, kinds)
			}
		}
	})

	t.Run("push_status", func(t *testing.T) {
		var got map[string]map[string]struct{ Proxy, Message string }
		getJSON(t, base+"/debug/push_status", &got)
		if _, ok := got["pilot_eds_no_instances"]["outbound|80||empty.demo.svc.cluster.local"]; !ok || len(got["pilot_eds_no_instances"]) != 1 {
			t.Errorf("push_status %v, want pilot_eds_no_instances of empty's cluster only", got)
		}
	})

	t.Run("mesh", func(t *testing.T) {
		var got map[string]any
		if code := getJSON(t, base+"/debug/mesh", &got); code != http.StatusOK {
			t.Errorf("mesh: %d", code)
		}
	})

	t.Run("status page", func(t *testing.T) {
		proxies := srv.Debug().Status.Proxies()
		if len(proxies) != 1 || proxies[0].ID != "debugged.demo" || len(proxies[0].Watches) != 1 ||
			proxies[0].Watches[0].Type != "LDS" || proxies[0].Watches[0].State != monitoring.Synced {
			t.Errorf("status page proxies %+v, want debugged.demo with LDS SYNCED", proxies)
		}

		// A change pushed to the proxy is a point of the convergence chart.
		before := len(srv.Debug().Status.Pushes())
		for _, c := range changes(t, `
apiVersion: sailplane.dev/v1
kind: Service
spec:
  hostname: echo.demo.svc.cluster.local
  namespace: demo
  labels: {changed: "yes"}
  ports: [{name: grpc, number: 7070, protocol: GRPC}]
`) {
			src.Push(c)
		}
		var pushes []monitoring.PushTiming
		waitUntil(t, func() bool { pushes = srv.Debug().Status.Pushes(); return len(pushes) > before })
		p := pushes[len(pushes)-1]
		if p.Proxy != "debugged.demo" || p.Failed || p.Convergence <= 0 || p.Done.IsZero() {
			t.Errorf("push recorded %+v, want debugged.demo's, done, with its convergence time", p)
		}
	})
}

// TestPushLogRing: the push log keeps the last pushLogSize pushes, oldest first.
func TestPushLogRing(t *testing.T) {
	var l pushLog
	for i := range pushLogSize + 7 {
		l.add(monitoring.PushTiming{Convergence: time.Duration(i)})
	}
	got := l.list()
	if len(got) != pushLogSize || got[0].Convergence != 7 || got[len(got)-1].Convergence != pushLogSize+6 {
		t.Fatalf("%d kept, from %v to %v; want %d, from 7 to %d", len(got), got[0].Convergence, got[len(got)-1].Convergence, pushLogSize, pushLogSize+6)
	}
	for i := 1; i < len(got); i++ {
		if got[i].Convergence != got[i-1].Convergence+1 {
			t.Fatalf("out of order at %d: %v after %v", i, got[i].Convergence, got[i-1].Convergence)
		}
	}
}
