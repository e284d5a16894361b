package xdsserver

import (
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"testing"

	resource "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"sailplane.dev/services/xds-server/internal/fakebus"
	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/services/xds-server/internal/testinput"
	"sailplane.dev/shared/golden"
	"sailplane.dev/shared/telemetry/telemetrytest"
)

// TestPushStatusGolden: each testdata/push_status/<case>/input.yaml is a mesh and the proxies
// of its Proxy documents; once every proxy has been generated all it can ask for, the push
// status (/debug/push_status's JSON) with those proxies connected is golden.json.
func TestPushStatusGolden(t *testing.T) {
	for _, dir := range golden.Cases(t, "testdata/push_status") {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			proxies, rest, err := testinput.ReadCase(dir)
			if err != nil {
				t.Fatal(err)
			}
			snap := snapshotOf(t, rest)
			status := newPushStatus()
			gen := generatorFor(testLogger(t), status, false)
			var connected []*model.Proxy
			for _, p := range proxies {
				connected = append(connected, p.Proxy)
				for _, typeURL := range []string{resource.ClusterType, resource.EndpointType, resource.ListenerType, resource.RouteType} {
					if _, err := gen(p.Proxy).Generate(snap, p.Proxy, typeURL, nil); err != nil {
						t.Fatalf("proxy %s, %s: %v", p.Name, typeURL, err)
					}
				}
			}
			got, err := json.MarshalIndent(status.status(snap, connected), "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			golden.Compare(t, filepath.Join(dir, "golden.json"), append(got, '\n'))
		})
	}
}

// snapshotOf builds a snapshot of testinput documents, as the bus would deliver them.
func snapshotOf(t *testing.T, docs []byte) *model.Snapshot {
	t.Helper()
	store := model.NewStore()
	h := store.Handler(nil)
	for _, c := range changes(t, string(docs)) {
		if err := h.Apply(c); err != nil {
			t.Fatalf("apply %s: %v", c.TypeURL, err)
		}
	}
	snap, _ := store.Next()
	return snap
}

// TestPushStatusConfigVersions: what generation reports holds for its config version: a
// newer one starts afresh, a late report for an older one is dropped, and the status of a
// snapshot shows only what was found for its config.
func TestPushStatusConfigVersions(t *testing.T) {
	problem := func(key string) model.Problem {
		return model.Problem{Metric: model.MetricDupDomain, Key: key, Proxy: "a.demo", Message: "duplicate domain from service: " + key}
	}
	v1, v2 := &model.Snapshot{ConfigVersion: 1}, &model.Snapshot{ConfigVersion: 2}
	ps := newPushStatus()
	ps.Report(v1, problem("old:80"))
	if got := ps.status(v1, nil)[model.MetricDupDomain]; len(got) != 1 || got["old:80"].Proxy != "a.demo" {
		t.Fatalf("after one report: %v", got)
	}
	if got := ps.status(v2, nil); len(got) != 0 {
		t.Errorf("status of a newer config before any generation for it: %v, want nothing", got)
	}
	ps.Report(v2, problem("new:80"))
	ps.Report(v1, problem("late:80"))
	if got := ps.status(v2, nil)[model.MetricDupDomain]; len(got) != 1 || got["new:80"].Message == "" {
		t.Errorf("after a new config and a late report for the old: %v, want new:80 only", got)
	}
}

// TestAdszPush: /debug/adsz?push=true answers as istiod, and a connected client receives its
// listener again though nothing changed.
func TestAdszPush(t *testing.T) {
	srv := startServer(t, fakebus.New(changes(t, registry(10001, 10002))...))
	base := serveMonitoring(t, srv.Debug())
	stream, _ := subscribeListener(t, srv, "pushed")

	resp, err := http.Get(base + "/debug/adsz?push=true")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || string(body) != "Pushed to 1 servers\n" {
		t.Fatalf("adsz?push=true: %d %q, want 200 %q", resp.StatusCode, string(body), "Pushed to 1 servers\n")
	}
	again, err := stream.Recv()
	if err != nil {
		t.Fatalf("no push after adsz?push=true: %v", err)
	}
	if len(again.GetResources()) != 1 || again.GetResources()[0].GetName() != echoListener {
		t.Errorf("pushed %v, want the listener %s again", again.GetResources(), echoListener)
	}
}

// TestPushStatusGauges: /metrics has istiod's push status gauges, each the number of keys of
// its metric, and pilot_virt_services; they follow the served config.
func TestPushStatusGauges(t *testing.T) {
	metrics := telemetrytest.New(t)
	src := fakebus.New(changes(t, registry(10001, 10002)+"---\n"+virtualService(80, 20)+"---\n"+emptyService)...)
	srv, err := New(Config{CacheAssert: true}, Deps{Logger: testLogger(t), Config: src, Registry: src, MeterProvider: metrics.Provider()})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, srv)
	metrics.WaitValue(1, "pilot_eds_no_instances")
	if got := metrics.Value("pilot_virt_services"); got != 1 {
		t.Errorf("pilot_virt_services = %v, want 1", got)
	}
	if got := metrics.Value("pilot_vservice_dup_domain"); got != 0 {
		t.Errorf("pilot_vservice_dup_domain = %v, want 0", got)
	}

	for _, c := range changes(t, `
apiVersion: sailplane.dev/v1
kind: Endpoints
spec:
  hostname: empty.demo.svc.cluster.local
  namespace: demo
  endpoints: [{address: 10.0.1.1}]
`) {
		src.Push(c)
	}
	metrics.WaitValue(0, "pilot_eds_no_instances")
}
