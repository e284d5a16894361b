package loadgen

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"
	"sigs.k8s.io/yaml"

	xdsserver "sailplane.dev/services/xds-server"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
)

// upsertYAML publishes Gateway API documents as config-ingest does: the spec as a Struct.
func upsertYAML(t *testing.T, store *bus.Store, docs string) {
	t.Helper()
	kinds := map[string]schema.Kind{"Gateway": schema.KubernetesGateway, "HTTPRoute": schema.HTTPRoute}
	for doc := range strings.SplitSeq(docs, "---\n") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		js, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		var obj struct {
			Kind     string `json:"kind"`
			Metadata struct{ Name, Namespace string }
			Spec     map[string]any `json:"spec"`
		}
		if err := json.Unmarshal(js, &obj); err != nil {
			t.Fatal(err)
		}
		spec, err := structpb.NewStruct(obj.Spec)
		if err != nil {
			t.Fatal(err)
		}
		kind, ok := kinds[obj.Kind]
		if !ok {
			t.Fatalf("unexpected kind %q", obj.Kind)
		}
		store.Upsert(kind.TypeURL, &bus.Resource{Name: schema.Name(obj.Metadata.Namespace, obj.Metadata.Name), Body: spec})
	}
}

// TestGatewayProxiesAgainstXDSServer: the generated Gateways and HTTPRoutes reach the router
// proxies of their Gateways (and only those), and an edit of one route reaches its gateway
// proxy without any push to the others.
func TestGatewayProxiesAgainstXDSServer(t *testing.T) {
	for _, delta := range []bool{false, true} {
		name := "sotw"
		if delta {
			name = "delta"
		}
		t.Run(name, func(t *testing.T) {
			mesh := Mesh{Namespace: "load", Services: 4, Endpoints: 1}
			g := GatewayAPI{Gateways: 3, Routes: 6}
			store, srv := startServer(t, mesh, xdsserver.Config{Debounce: 5 * time.Millisecond, CacheAssert: true})
			dir := t.TempDir()
			if err := os.MkdirAll(filepath.Join(dir, "conf"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := g.Write(dir, mesh); err != nil {
				t.Fatal(err)
			}
			entries, err := os.ReadDir(filepath.Join(dir, "conf"))
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) != 1+g.Routes {
				t.Fatalf("%d files written, want gateways.yaml and %d routes", len(entries), g.Routes)
			}
			for _, e := range entries {
				b, err := os.ReadFile(filepath.Join(dir, "conf", e.Name()))
				if err != nil {
					t.Fatal(err)
				}
				upsertYAML(t, store, string(b))
			}

			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			defer wg.Wait()
			defer cancel()
			shared := NewShared()
			var proxies []*Proxy
			var own, foreign []*Marker
			for j := range g.Gateways {
				p := NewProxy(ProxyConfig{Addr: srv.Addr().String(), Delta: delta, Index: j, Namespace: mesh.Namespace,
					Labels: map[string]string{GatewayNameLabel: GatewayName(j)}, Router: true, Shared: shared, Logger: testLogger(t)})
				if !strings.HasPrefix(p.NodeID(), "router~") {
					t.Fatalf("node ID %q is not a router's", p.NodeID())
				}
				proxies = append(proxies, p)
				// Route j is on Gateway j, route j+1 on the next one.
				own = append(own, shared.NewMarker(RouteType, "", RoutePath(j, ""), []*Proxy{p}))
				foreign = append(foreign, shared.NewMarker(RouteType, "", RoutePath((j+1)%g.Gateways, ""), []*Proxy{p}))
			}
			for _, m := range append(own, foreign...) {
				m.Begin()
			}
			for i, p := range proxies {
				wg.Go(func() {
					if err := p.Run(ctx); err != nil {
						t.Errorf("gateway proxy %d: %v", i, err)
					}
				})
			}
			for j, p := range proxies {
				wait(t, "gateway proxy synced", p.Synced())
				wait(t, "gateway proxy has its route", own[j].Done())
				if c := mesh.Cluster(j % mesh.Services); !p.Watching(EndpointType, c) {
					t.Errorf("gateway proxy %d has no cluster %s", j, c)
				}
			}
			if err := waitQuiet(ctx, shared, 30*time.Second); err != nil {
				t.Fatal(err)
			}
			for j, m := range foreign {
				if _, missing := m.Latencies(); missing == 0 {
					t.Errorf("gateway proxy %d got another Gateway's route", j)
				}
				shared.Remove(m)
			}

			// Route 4 is on Gateway 1.
			route := 4
			gw := g.GatewayOf(route)
			before := make([]int64, len(proxies))
			for j, p := range proxies {
				before[j] = p.Responses()
			}
			m := shared.NewMarker(RouteType, "", RoutePath(route, "edited"), []*Proxy{proxies[gw]})
			m.Begin()
			upsertYAML(t, store, g.RouteYAML(mesh, route, "edited"))
			wait(t, "edit at its gateway proxy", m.Done())
			if err := waitQuiet(ctx, shared, 30*time.Second); err != nil {
				t.Fatal(err)
			}
			for j, p := range proxies {
				got := p.Responses() - before[j]
				if j == gw && got == 0 {
					t.Errorf("the edited route's gateway proxy %d counted no response", j)
				}
				if j != gw && got != 0 {
					t.Errorf("gateway proxy %d, not the edited route's, got %d responses", j, got)
				}
			}
		})
	}
}

func TestParseMemory(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     Memory
		wantErr  bool
	}{
		{name: "both", in: "# HELP go_memstats_heap_inuse_bytes x\n# TYPE go_memstats_heap_inuse_bytes gauge\n" +
			"go_memstats_heap_inuse_bytes 5.5115776e+07\ngo_goroutines 12\nprocess_resident_memory_bytes 1.3964e+08\n",
			want: Memory{HeapInuse: 55115776, RSS: 139640000}},
		{name: "no RSS", in: "go_memstats_heap_inuse_bytes 1\n", wantErr: true},
		{name: "bad value", in: "go_memstats_heap_inuse_bytes x\nprocess_resident_memory_bytes 1\n", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseMemory(strings.NewReader(tc.in))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if !tc.wantErr && got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestWriteGatewayTable(t *testing.T) {
	r := &GatewayResult{Topology: TopologyHyper, Gateways: 50, Routes: 1000, Services: 100, Edits: 40,
		RouteEdit: Latency{P50: .312, P99: .641}, XDSProcess: "hyper",
		Memory: map[string]Memory{"after_edits": {HeapInuse: 56 << 20, RSS: 148 << 20}},
		Usage:  map[string]Usage{"hyper": {PeakRSS: 152 << 20}}}
	var b strings.Builder
	if err := WriteGatewayTable(&b, []*GatewayResult{r}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"hyper/sotw", "50 / 1000 / 100", "0.312 / 0.641 s", "56 MiB / 148 MiB", "152 MiB"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}
