package xdssim

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	// Clusters of the snapshots configure the c-ares resolver; the JSON reader must know it.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/network/dns_resolver/cares/v3"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"

	"sailplane.dev/tools/xdsdiff"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// requestCase is one entry of testdata/<case>/requests.yaml.
type requestCase struct {
	Name    string  `json:"name"`
	Proxy   string  `json:"proxy"` // <proxy>.xds.json in the case folder
	Request Request `json:"request"`
}

// outcome is one entry of golden.yaml: the result, or the failure.
type outcome struct {
	Name   string  `json:"name"`
	Result *Result `json:"result,omitempty"`
	Error  *failed `json:"error,omitempty"`
}

type failed struct {
	Kind    string `json:"kind"`
	Status  int    `json:"status,omitempty"`
	Flag    string `json:"flag,omitempty"`
	Message string `json:"message"`
	// At is how far the simulation got: listener, filter chain, virtual host, route, cluster.
	At string `json:"at,omitempty"`
}

func progress(r *Result) string {
	if r == nil {
		return ""
	}
	var parts []string
	for _, p := range []string{r.Listener, r.FilterChain, r.VirtualHost, r.Route, r.Cluster} {
		if p != "" {
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, " > ")
}

var sentinels = []error{ErrNoListener, ErrNoFilterChain, ErrTLSMismatch, ErrNoVirtualHost, ErrNoRoute,
	ErrClusterNotFound, ErrNoHealthyUpstream, ErrUnsupported, ErrInvalid}

func kindOf(err error) string {
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	return "other"
}

// TestGolden runs testdata/<case>/requests.yaml against the case's snapshots (written by
// services/xds-server/internal/cmd/dumpxds from envoygen's own golden inputs) and compares
// the outcomes with golden.yaml; UPDATE_GOLDEN=1 rewrites it.
func TestGolden(t *testing.T) {
	cases, err := filepath.Glob("testdata/*/requests.yaml")
	if err != nil || len(cases) == 0 {
		t.Fatalf("no cases: %v", err)
	}
	for _, reqFile := range cases {
		dir := filepath.Dir(reqFile)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			data, err := os.ReadFile(reqFile)
			if err != nil {
				t.Fatal(err)
			}
			var reqs []requestCase
			if err := yaml.UnmarshalStrict(data, &reqs); err != nil {
				t.Fatalf("%s: %v", reqFile, err)
			}
			sims := map[string]*Simulator{}
			var got []outcome
			for _, rc := range reqs {
				sim := sims[rc.Proxy]
				if sim == nil {
					if sim, err = New(readSnapshot(t, filepath.Join(dir, rc.Proxy+".xds.json"))); err != nil {
						t.Fatal(err)
					}
					sims[rc.Proxy] = sim
				}
				o := outcome{Name: rc.Name}
				res, err := sim.Simulate(rc.Request)
				if err != nil {
					var e *Error
					if !errors.As(err, &e) {
						t.Fatalf("%s: error %v is not an *Error", rc.Name, err)
					}
					o.Error = &failed{Kind: kindOf(err), Status: e.Status, Flag: e.Flag, Message: err.Error(), At: progress(e.Result)}
				} else {
					o.Result = res
				}
				got = append(got, o)
			}
			out, err := yaml.Marshal(got)
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join(dir, "golden.yaml")
			if os.Getenv("UPDATE_GOLDEN") != "" {
				if err := os.WriteFile(golden, out, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (UPDATE_GOLDEN=1 writes it)", err)
			}
			if !bytes.Equal(out, want) {
				t.Errorf("%s differs (UPDATE_GOLDEN=1 rewrites it):\n%s", golden, lineDiff(string(want), string(out)))
			}
		})
	}
}

func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := 0; i < max(len(w), len(g)); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			b.WriteString("line " + itoa(i+1) + ":\n  want: " + wl + "\n  got:  " + gl + "\n")
		}
	}
	return b.String()
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

func readSnapshot(t testing.TB, path string) xdsdiff.Snapshot {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var byType map[string][]json.RawMessage
	if err := json.Unmarshal(data, &byType); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	s := xdsdiff.Snapshot{}
	for _, url := range slices.Sorted(maps.Keys(byType)) {
		for i, r := range byType[url] {
			a := &anypb.Any{}
			if err := protojson.Unmarshal(r, a); err != nil {
				t.Fatalf("%s: %s #%d: %v", path, url, i, err)
			}
			s[url] = append(s[url], a)
		}
	}
	return s
}
