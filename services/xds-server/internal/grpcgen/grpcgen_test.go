package grpcgen

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/services/xds-server/internal/testinput"
	"sailplane.dev/services/xds-server/internal/translate"
	"sailplane.dev/shared/golden"
	"sailplane.dev/shared/testlog"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testLogger(t testing.TB) *slog.Logger {
	return testlog.New(t, slog.LevelDebug)
}

func generate(t *testing.T, dir string) *Resources {
	t.Helper()
	items, err := testinput.ReadFile(filepath.Join(dir, "input.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	store := model.NewStore()
	h := store.Handler(nil)
	for _, c := range testinput.Changes(items) {
		if err := h.Apply(c); err != nil {
			t.Fatalf("apply %s: %v", c.TypeURL, err)
		}
	}
	snap := store.Snapshot()
	// The client runs in namespace demo, as most test services, without labels, and holds
	// mesh certificates, unless client.yaml says otherwise.
	c := struct {
		InMesh    bool              `json:"inMesh"`
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels"`
		// Network, when set, is the client's network: split-horizon EDS applies.
		Network string `json:"network"`
	}{InMesh: true, Namespace: "demo"}
	if b, err := os.ReadFile(filepath.Join(dir, "client.yaml")); err == nil {
		if err := yaml.UnmarshalStrict(b, &c); err != nil {
			t.Fatalf("%s/client.yaml: %v", dir, err)
		}
	}
	viewer := &model.Viewer{Namespace: c.Namespace, Labels: c.Labels}
	var client *Client
	if c.Network != "" {
		client = &Client{SplitHorizon: translate.SplitHorizonFor(snap, &model.Proxy{Network: c.Network})}
	}
	res := Generate(snap, c.Namespace+".svc.cluster.local", viewer, client, c.InMesh, testLogger(t))
	// server.yaml, if present, names a proxyless server whose server-side listeners join.
	if b, err := os.ReadFile(filepath.Join(dir, "server.yaml")); err == nil {
		var srv struct {
			Namespace string            `json:"namespace"`
			Labels    map[string]string `json:"labels"`
			IPs       []string          `json:"ips"`
		}
		if err := yaml.UnmarshalStrict(b, &srv); err != nil {
			t.Fatalf("%s/server.yaml: %v", dir, err)
		}
		res.Listeners = append(res.Listeners, ServerListeners(snap, Server{Namespace: srv.Namespace, Labels: srv.Labels, IPs: srv.IPs})...)
	}
	return res
}

func all(r *Resources) []proto.Message {
	var out []proto.Message
	for _, l := range r.Listeners {
		out = append(out, l)
	}
	for _, x := range r.Routes {
		out = append(out, x)
	}
	for _, c := range r.Clusters {
		out = append(out, c)
	}
	for _, e := range r.Endpoints {
		out = append(out, e)
	}
	return out
}

// render prints the resources as YAML, grouped by type; protojson's output is not stable byte
// for byte, so it goes through a generic value that the YAML encoder prints in key order.
func render(t *testing.T, r *Resources) []byte {
	t.Helper()
	group := func(msgs ...proto.Message) []json.RawMessage {
		out := []json.RawMessage{}
		for _, m := range msgs {
			b, err := protojson.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, b)
		}
		return out
	}
	var ls, rs, cs, es []proto.Message
	for _, x := range r.Listeners {
		ls = append(ls, x)
	}
	for _, x := range r.Routes {
		rs = append(rs, x)
	}
	for _, x := range r.Clusters {
		cs = append(cs, x)
	}
	for _, x := range r.Endpoints {
		es = append(es, x)
	}
	doc, err := json.Marshal(map[string][]json.RawMessage{
		"listeners": group(ls...), "routes": group(rs...), "clusters": group(cs...), "endpoints": group(es...),
	})
	if err != nil {
		t.Fatal(err)
	}
	y, err := yaml.JSONToYAML(doc)
	if err != nil {
		t.Fatal(err)
	}
	return y
}

func TestGolden(t *testing.T) {
	for _, dir := range golden.Cases(t, "testdata") {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			golden.Compare(t, filepath.Join(dir, "golden.yaml"), render(t, generate(t, dir)))
		})
	}
}

// TestValidate checks every generated resource of every case against Envoy's constraints.
func TestValidate(t *testing.T) {
	for _, dir := range golden.Cases(t, "testdata") {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			res := all(generate(t, dir))
			if len(res) == 0 {
				t.Fatal("no resources generated")
			}
			for _, m := range res {
				v, ok := m.(interface{ ValidateAll() error })
				if !ok {
					t.Fatalf("%T has no ValidateAll", m)
				}
				if err := v.ValidateAll(); err != nil {
					t.Errorf("%T invalid: %v", m, err)
				}
			}
		})
	}
}

// TestDeterministic guards the golden files and the snapshot versions, both of which rely on
// the same input producing byte-identical output.
func TestDeterministic(t *testing.T) {
	for _, dir := range golden.Cases(t, "testdata") {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			a, b := all(generate(t, dir)), all(generate(t, dir))
			if len(a) != len(b) {
				t.Fatalf("%d vs %d resources", len(a), len(b))
			}
			for i := range a {
				ma, _ := proto.MarshalOptions{Deterministic: true}.Marshal(a[i])
				mb, _ := proto.MarshalOptions{Deterministic: true}.Marshal(b[i])
				if !bytes.Equal(ma, mb) {
					t.Errorf("resource %d differs between runs", i)
				}
			}
		})
	}
}
