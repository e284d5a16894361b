package configingest_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	configingest "sailplane.dev/services/config-ingest"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/config"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/telemetry/telemetrytest"
	"sailplane.dev/shared/testlog"
	"sailplane.dev/shared/testwait"
)

func TestMain(m *testing.M) {
	code := m.Run()
	// The API server shared by the Kubernetes tests goes first, closing client connections.
	stopSharedKube()
	if code == 0 {
		// klog starts its flush daemon in init; client-go imports klog.
		if err := goleak.Find(goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// recorder is a bus.Publisher that keeps the state it was given and counts the calls.
type recorder struct {
	mu       sync.Mutex
	state    map[string]map[string]*bus.Resource
	replaced map[string]int
	upserts  map[string]int // resources upserted, per type
	deletes  map[string]int
}

var _ bus.Publisher = (*recorder)(nil)

func newRecorder() *recorder {
	return &recorder{state: map[string]map[string]*bus.Resource{}, replaced: map[string]int{}, upserts: map[string]int{}, deletes: map[string]int{}}
}

func (r *recorder) typ(typeURL string) map[string]*bus.Resource {
	if r.state[typeURL] == nil {
		r.state[typeURL] = map[string]*bus.Resource{}
	}
	return r.state[typeURL]
}

func (r *recorder) Upsert(typeURL string, rs ...*bus.Resource) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, x := range rs {
		r.typ(typeURL)[x.Name] = x
	}
	r.upserts[typeURL] += len(rs)
	return nil
}

func (r *recorder) Delete(typeURL string, names ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range names {
		delete(r.typ(typeURL), n)
	}
	r.deletes[typeURL] += len(names)
}

func (r *recorder) Replace(typeURL string, rs []*bus.Resource) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.state[typeURL] = map[string]*bus.Resource{}
	for _, x := range rs {
		r.typ(typeURL)[x.Name] = x
	}
	r.replaced[typeURL]++
	return nil
}

func (r *recorder) get(k schema.Kind, name string) *bus.Resource {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state[k.TypeURL][name]
}

func (r *recorder) count(k schema.Kind) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.state[k.TypeURL])
}

func (r *recorder) upserted(k schema.Kind) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.upserts[k.TypeURL]
}

func write(t testing.TB, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	// Write-then-rename, so the service never reads a half-written file (which would be a
	// legitimate, but here unwanted, malformed-file problem).
	tmp := filepath.Join(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testwait.Until(t, 10*time.Second, what, cond)
}

type env struct {
	t    *testing.T
	dir  string // the config folder
	mesh string // the mesh file
	rec  *recorder
	svc  *configingest.Service
	// metrics is what the service reports.
	metrics *telemetrytest.Metrics
}

// start runs a Service over dir/conf with the mesh file dir/mesh.yaml (written by setup first).
func start(t *testing.T, setup func(e *env)) *env {
	t.Helper()
	root := t.TempDir()
	e := &env{t: t, dir: filepath.Join(root, "conf"), mesh: filepath.Join(root, "mesh.yaml"), rec: newRecorder(), metrics: telemetrytest.New(t)}
	if err := os.MkdirAll(e.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, e.mesh, "rootNamespace: istio-system\nconfigSources:\n- address: fs://conf\n")
	if setup != nil {
		setup(e)
	}
	log := testlog.New(t, slog.LevelDebug)
	svc, err := configingest.New(configingest.Config{MeshFile: e.mesh, Debounce: 20 * time.Millisecond},
		configingest.Deps{Logger: log, Publisher: e.rec, MeterProvider: e.metrics.Provider()})
	if err != nil {
		t.Fatal(err)
	}
	e.svc = svc
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case <-svc.Ready():
	case err := <-done:
		t.Fatalf("Run returned before ready: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("not ready")
	}
	return e
}

func (e *env) write(rel, content string) {
	e.t.Helper()
	write(e.t, filepath.Join(e.dir, rel), content)
}

func (e *env) vs(name string) *networking.VirtualService {
	r := e.rec.get(schema.VirtualService, name)
	if r == nil {
		return nil
	}
	return r.Body.(*networking.VirtualService)
}

// problem finds a current problem whose message contains every part.
func (e *env) problem(parts ...string) error { return findProblem(e.svc, nil, parts...) }

// findProblem finds a current problem of svc that is target (any when nil) and whose message
// contains every part.
func findProblem(svc *configingest.Service, target error, parts ...string) error {
	for _, p := range svc.Problems() {
		if target != nil && !errors.Is(p, target) {
			continue
		}
		ok := true
		for _, s := range parts {
			ok = ok && strings.Contains(p.Error(), s)
		}
		if ok {
			return p
		}
	}
	return nil
}

func vsDoc(name, host string, weight int) string {
	return `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: ` + name + `
spec:
  hosts: [` + host + `]
  http:
  - route:
    - destination: {host: ` + host + `}
      weight: ` + itoa(weight) + `
`
}

func itoa(i int) string {
	if i < 0 {
		return "-" + itoa(-i)
	}
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}

const drDoc = `apiVersion: networking.istio.io/v1beta1
kind: DestinationRule
metadata: {name: reviews, namespace: bookinfo}
spec:
  host: reviews
  subsets:
  - name: v1
    labels: {version: v1}
`

const seDoc = `apiVersion: networking.istio.io/v1alpha3
kind: ServiceEntry
metadata: {name: api, namespace: egress}
spec:
  hosts: [api.example.com]
  ports: [{number: 443, name: https, protocol: TLS}]
  resolution: DNS
`

func TestInitialLoad(t *testing.T) {
	e := start(t, func(e *env) {
		e.write("a.yaml", vsDoc("reviews", "reviews", 100)+"---\n"+drDoc)
		e.write("sub/deeper/b.yml", "# egress\n---\n"+seDoc)
		e.write("notes.txt", "not: config")
		e.write(".hidden/c.yaml", vsDoc("hidden", "hidden", 100))
	})
	for _, k := range append(schema.IstioConfig, schema.MeshConfig) {
		if e.rec.replaced[k.TypeURL] != 1 {
			t.Errorf("%s replaced %d times, want 1", k.TypeURL, e.rec.replaced[k.TypeURL])
		}
	}
	if e.vs("default/reviews") == nil || e.rec.get(schema.DestinationRule, "bookinfo/reviews") == nil ||
		e.rec.get(schema.ServiceEntry, "egress/api") == nil || e.rec.count(schema.VirtualService) != 1 {
		t.Fatalf("state = %v", e.rec.state)
	}
	m := e.rec.get(schema.MeshConfig, "mesh")
	if m == nil || m.Body.(*meshv1alpha1.MeshConfig).RootNamespace != "istio-system" {
		t.Fatalf("mesh = %v", m)
	}
	if p := e.svc.Problems(); len(p) != 0 {
		t.Fatalf("problems: %v", p)
	}
}

func TestEditDeleteAndNewFolders(t *testing.T) {
	e := start(t, func(e *env) {
		e.write("a.yaml", vsDoc("reviews", "reviews", 100)+"---\n"+drDoc)
		e.write("sub/b.yaml", seDoc)
	})
	drUpserts := e.rec.upserted(schema.DestinationRule)

	// Editing one resource republishes only that one.
	e.write("a.yaml", vsDoc("reviews", "reviews2", 100)+"---\n"+drDoc)
	eventually(t, "edit", func() bool {
		vs := e.vs("default/reviews")
		return vs != nil && vs.Hosts[0] == "reviews2"
	})
	if got := e.rec.upserted(schema.DestinationRule); got != drUpserts {
		t.Errorf("unchanged DestinationRule republished (%d upserts)", got-drUpserts)
	}

	// A new nested folder is watched.
	e.write("new/deep/c.yaml", vsDoc("ratings", "ratings", 100))
	eventually(t, "new folder", func() bool { return e.vs("default/ratings") != nil })
	e.write("new/deep/c.yaml", vsDoc("ratings", "ratings2", 100))
	eventually(t, "edit in new folder", func() bool {
		vs := e.vs("default/ratings")
		return vs != nil && vs.Hosts[0] == "ratings2"
	})

	// Deleting a file deletes its resources, and only them.
	if err := os.Remove(filepath.Join(e.dir, "sub", "b.yaml")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "delete", func() bool { return e.rec.get(schema.ServiceEntry, "egress/api") == nil })
	if e.vs("default/reviews") == nil {
		t.Fatal("unrelated resource deleted")
	}
	// Removing a whole folder too.
	if err := os.RemoveAll(filepath.Join(e.dir, "new")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "folder delete", func() bool { return e.vs("default/ratings") == nil })
	// A resource removed from a file goes away, its neighbour stays.
	e.write("a.yaml", drDoc)
	eventually(t, "document removed", func() bool { return e.vs("default/reviews") == nil })
	if e.rec.get(schema.DestinationRule, "bookinfo/reviews") == nil {
		t.Fatal("DestinationRule lost")
	}
}

func TestMalformedFileKeepsResources(t *testing.T) {
	e := start(t, func(e *env) {
		e.write("a.yaml", vsDoc("reviews", "reviews", 100)+"---\n"+drDoc)
	})
	// Document 2 becomes unreadable; document 1 changes. The DestinationRule (which document 2
	// held) must stay, the VirtualService must update.
	e.write("a.yaml", vsDoc("reviews", "reviews2", 100)+"---\nkind: DestinationRule\nmetadata: [oops\n")
	eventually(t, "malformed reported", func() bool { return e.problem("a.yaml", "document 2", "malformed YAML") != nil })
	eventually(t, "good document updated", func() bool { return e.vs("default/reviews").Hosts[0] == "reviews2" })
	if e.rec.get(schema.DestinationRule, "bookinfo/reviews") == nil {
		t.Fatal("malformed file lost its DestinationRule")
	}
	var ce *config.Error
	if !errors.As(e.problem("document 2"), &ce) || ce.Doc != 2 || !strings.HasSuffix(ce.File, "a.yaml") {
		t.Fatalf("problem = %#v", ce)
	}
	// Fixed: problems clear, and now the DestinationRule really is gone from the file.
	e.write("a.yaml", vsDoc("reviews", "reviews2", 100))
	eventually(t, "fixed", func() bool {
		return len(e.svc.Problems()) == 0 && e.rec.get(schema.DestinationRule, "bookinfo/reviews") == nil
	})
}

func TestInvalidKeepsLastValid(t *testing.T) {
	e := start(t, func(e *env) {
		e.write("a.yaml", vsDoc("reviews", "reviews", 100))
	})
	e.write("a.yaml", vsDoc("reviews", "changed", -150)+"---\n"+vsDoc("fresh", "fresh", -1))
	eventually(t, "invalid reported", func() bool {
		return e.problem("VirtualService default/reviews", "spec.http[0].route[0].weight", "must not be negative") != nil &&
			e.problem("VirtualService default/fresh", "spec.http[0].route[0].weight") != nil
	})
	if vs := e.vs("default/reviews"); vs == nil || vs.Hosts[0] != "reviews" {
		t.Fatalf("last valid version not kept: %v", vs)
	}
	if e.vs("default/fresh") != nil {
		t.Fatal("invalid resource published")
	}
	var ce *config.Error
	if !errors.As(e.problem("default/reviews"), &ce) || ce.Field != "spec.http[0].route[0].weight" || ce.Doc != 1 {
		t.Fatalf("problem = %#v", ce)
	}
	// A schema error (unknown field) keeps the last valid version too.
	e.write("a.yaml", strings.Replace(vsDoc("reviews", "changed", 100), "destination:", "destinaton:", 1))
	eventually(t, "schema error", func() bool { return e.problem("default/reviews", "destinaton", "unknown field") != nil })
	if vs := e.vs("default/reviews"); vs == nil || vs.Hosts[0] != "reviews" {
		t.Fatalf("last valid version not kept: %v", vs)
	}
	e.write("a.yaml", vsDoc("reviews", "fixed", 100))
	eventually(t, "fixed", func() bool { return e.vs("default/reviews").Hosts[0] == "fixed" && len(e.svc.Problems()) == 0 })
}

func TestAPIVersions(t *testing.T) {
	e := start(t, func(e *env) {
		var docs []string
		for _, v := range []string{"v1alpha3", "v1beta1", "v1"} {
			docs = append(docs, strings.Replace(vsDoc("vs-"+v, "h-"+v, 100), "networking.istio.io/v1", "networking.istio.io/"+v, 1))
		}
		e.write("versions.yaml", strings.Join(docs, "---\n"))
	})
	for _, v := range []string{"v1alpha3", "v1beta1", "v1"} {
		if e.vs("default/vs-"+v) == nil {
			t.Errorf("%s not accepted: %v", v, e.svc.Problems())
		}
	}
}

func TestMeshConfigReload(t *testing.T) {
	e := start(t, nil)
	rootNS := func() string {
		r := e.rec.get(schema.MeshConfig, "mesh")
		if r == nil {
			return ""
		}
		return r.Body.(*meshv1alpha1.MeshConfig).RootNamespace
	}
	if rootNS() != "istio-system" {
		t.Fatal(rootNS())
	}
	write(t, e.mesh, "rootNamespace: sailplane\nconfigSources:\n- address: fs://conf\n")
	eventually(t, "mesh reload", func() bool { return rootNS() == "sailplane" })
	write(t, e.mesh, "rootNamespace: [broken\n")
	eventually(t, "mesh problem", func() bool { return e.problem("mesh.yaml", "malformed") != nil })
	if rootNS() != "sailplane" {
		t.Fatal("broken mesh file replaced the config")
	}
	// configSources now point elsewhere: the folders follow.
	other := filepath.Join(filepath.Dir(e.mesh), "other")
	write(t, filepath.Join(other, "x.yaml"), vsDoc("other", "other", 100))
	e.write("a.yaml", vsDoc("reviews", "reviews", 100))
	eventually(t, "first folder", func() bool { return e.vs("default/reviews") != nil })
	// A source that cannot be read (k8s:// is not supported in files mode) is unknown: what
	// the previous folder published stays until every source can be read.
	write(t, e.mesh, "rootNamespace: sailplane\nconfigSources:\n- address: fs://other\n- address: k8s://\n")
	eventually(t, "unsupported source reported", func() bool { return e.problem("k8s://", "not supported") != nil })
	eventually(t, "new folder read", func() bool { return e.vs("default/other") != nil })
	if e.vs("default/reviews") == nil {
		t.Fatal("the previous folder's resources were dropped while a source cannot be read")
	}
	if e.problem("malformed") != nil {
		t.Fatal("stale mesh problem")
	}
	write(t, e.mesh, "rootNamespace: sailplane\nconfigSources:\n- address: fs://other\n")
	eventually(t, "folders switched", func() bool { return e.vs("default/other") != nil && e.vs("default/reviews") == nil })
	if e.problem("k8s://") != nil {
		t.Fatal("stale unsupported-source problem")
	}
}

// TestMeshNetworksFile: files mode publishes the meshNetworks file beside the mesh file and
// follows its changes; a broken one is a problem naming the file and field, the last good
// one staying; removing the file removes them.
func TestMeshNetworksFile(t *testing.T) {
	e := start(t, nil)
	path := filepath.Join(filepath.Dir(e.mesh), "meshNetworks")
	registry := func() string {
		r := e.rec.get(schema.MeshNetworks, "mesh-networks")
		if r == nil {
			return ""
		}
		return r.Body.(*meshv1alpha1.MeshNetworks).GetNetworks()["net2"].GetEndpoints()[0].GetFromRegistry()
	}
	if r := e.rec.get(schema.MeshNetworks, "mesh-networks"); r != nil {
		t.Fatalf("meshNetworks without a file: %v", r)
	}
	write(t, path, "networks: {net2: {endpoints: [{fromRegistry: cluster2}]}}\n")
	eventually(t, "meshNetworks file", func() bool { return registry() == "cluster2" })
	write(t, path, "networks: {net2: {endpoints: [{fromCidr: 10.0.0.0/99}]}}\n")
	eventually(t, "meshNetworks problem", func() bool { return e.problem("meshNetworks", "networks.net2.endpoints[0].fromCidr") != nil })
	if registry() != "cluster2" {
		t.Fatal("broken meshNetworks file replaced the last good one")
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	eventually(t, "meshNetworks removed", func() bool {
		return e.rec.get(schema.MeshNetworks, "mesh-networks") == nil && e.problem("networks.net2") == nil
	})
}

func TestDuplicates(t *testing.T) {
	e := start(t, func(e *env) {
		e.write("a.yaml", vsDoc("reviews", "from-a", 100))
		e.write("b.yaml", vsDoc("reviews", "from-b", 100))
	})
	if vs := e.vs("default/reviews"); vs == nil || vs.Hosts[0] != "from-a" {
		t.Fatalf("first file must win: %v", vs)
	}
	p := e.problem("b.yaml", "a.yaml", "default/reviews")
	if !errors.Is(p, configingest.ErrDuplicate) {
		t.Fatalf("problems = %v", e.svc.Problems())
	}
	if err := os.Remove(filepath.Join(e.dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b takes over", func() bool {
		vs := e.vs("default/reviews")
		return vs != nil && vs.Hosts[0] == "from-b" && len(e.svc.Problems()) == 0
	})
}

func TestConfigDirsOverride(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "x.yaml"), vsDoc("x", "x", 100))
	rec := newRecorder()
	svc, err := configingest.New(configingest.Config{ConfigDirs: []string{dir, filepath.Join(dir, "missing")}},
		configingest.Deps{Logger: testlog.New(t, slog.LevelInfo), Publisher: rec})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	<-svc.Ready()
	if rec.get(schema.VirtualService, "default/x") == nil || rec.get(schema.MeshConfig, "mesh") == nil {
		t.Errorf("state = %v", rec.state)
	}
	if len(svc.Problems()) != 1 || !strings.Contains(svc.Problems()[0].Error(), "missing") {
		t.Errorf("problems = %v", svc.Problems())
	}
	// The missing folder appears later: it is picked up.
	write(t, filepath.Join(dir, "missing", "y.yaml"), vsDoc("yy", "yy", 100))
	eventually(t, "late folder", func() bool { return rec.get(schema.VirtualService, "default/yy") != nil })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestNewRequiresPublisher(t *testing.T) {
	if _, err := configingest.New(configingest.Config{}, configingest.Deps{}); err == nil {
		t.Fatal("want error")
	}
}
