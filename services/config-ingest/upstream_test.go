package configingest_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sailplane.dev/shared/bus/bustest"

	"google.golang.org/protobuf/types/known/structpb"
	networking "istio.io/api/networking/v1alpha3"

	configingest "sailplane.dev/services/config-ingest"
	"sailplane.dev/services/config-ingest/internal/upstream"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/spiffe"
	"sailplane.dev/shared/testlog"
	"sailplane.dev/shared/workloadcert"
)

// ingest is a config-ingest of its own folder, serving its bus over gRPC on loopback, as a
// config-ingest binary does.
type ingest struct {
	t     testing.TB
	root  string // etc/sailplane/mesh.yaml, etc/sailplane/conf/, var/lib/sailplane under it
	addr  string // the bus address, kept across restarts
	svc   *configingest.Service
	store *bus.Store
	msgs  *testlog.Messages
	stop  func()
	// sec protects its bus (plaintext when zero); identity is its workload certificate.
	sec      bus.Security
	identity workloadcert.Source
	// Tests run it with a short debounce and reconnect backoff and a debug log; benchmarks
	// set debounce 0 and dial nil for the production defaults, and a quieter log.
	debounce time.Duration
	dial     []bus.DialOption
	logLevel slog.Level
	// publish, when set, wraps the bus store as the service's Publisher.
	publish func(bus.Publisher) bus.Publisher
	// syncTimeout is UpstreamSyncTimeout, 30 s when zero.
	syncTimeout time.Duration
}

func newIngest(t testing.TB, mesh string) *ingest {
	t.Helper()
	in := &ingest{t: t, root: t.TempDir(), debounce: 20 * time.Millisecond, logLevel: slog.LevelDebug,
		dial: []bus.DialOption{bus.WithBackoff(20*time.Millisecond, 200*time.Millisecond)}}
	write(t, in.meshFile(), mesh)
	if err := os.MkdirAll(in.conf(), 0o755); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	in.addr = lis.Addr().String()
	lis.Close()
	return in
}

func (in *ingest) meshFile() string { return filepath.Join(in.root, "etc/sailplane/mesh.yaml") }
func (in *ingest) conf() string     { return filepath.Join(in.root, "etc/sailplane/conf") }
func (in *ingest) source() string   { return "xds://" + in.addr }

// plaintext is the configSources entry reading in's bus without TLS.
func (in *ingest) plaintext() string {
	return "- address: " + in.source() + "\n  tlsSettings: {mode: DISABLE}\n"
}

// start runs the service until stop (or the test's end); waitReady says whether to wait for
// its first state.
func (in *ingest) start(waitReady bool) {
	t := in.t
	t.Helper()
	log, msgs := testlog.NewRecording(t, in.logLevel)
	in.msgs = msgs
	in.store = bus.NewStore(bus.WithLogger(log.With("component", "bus")))
	var pub bus.Publisher = in.store
	if in.publish != nil {
		pub = in.publish(in.store)
	}
	svc, err := configingest.New(configingest.Config{
		MeshFile: in.meshFile(), StateDir: filepath.Join(in.root, "var/lib/sailplane"), Debounce: in.debounce,
		UpstreamSyncTimeout: cmp.Or(in.syncTimeout, 30*time.Second),
	}, configingest.Deps{Logger: log, Publisher: pub, Identity: in.identity, UpstreamDialOptions: in.dial})
	if err != nil {
		t.Fatal(err)
	}
	in.svc = svc
	in.store.SyncAfter(svc.Ready(), configingest.PublishedTypes()...)
	srv, err := bus.ServeGRPC(in.store, in.addr, log, in.sec)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	svcDone, srvDone := make(chan error, 1), make(chan error, 1)
	go func() { svcDone <- svc.Run(ctx) }()
	go func() { srvDone <- srv.Run(ctx) }()
	stopped := false
	in.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-svcDone; err != nil {
			t.Errorf("Run: %v", err)
		}
		if err := <-srvDone; err != nil {
			t.Errorf("bus server: %v", err)
		}
	}
	t.Cleanup(in.stop)
	if waitReady {
		select {
		case <-svc.Ready():
		case err := <-svcDone:
			t.Fatalf("Run returned before ready: %v", err)
		case <-time.After(30 * time.Second):
			t.Fatal("not ready")
		}
	}
}

// vs returns the VirtualService served under ns/name: its first route's hosts, "" when none.
func (in *ingest) vs(name string) string {
	for _, e := range in.store.List(schema.VirtualService.TypeURL) {
		if e.Name == name {
			vs := e.Body.(*networking.VirtualService)
			return vs.GetHttp()[0].GetRoute()[0].GetDestination().GetHost()
		}
	}
	return ""
}

func virtualService(name, host string) string { return virtualServiceIn("default", name, host) }

func virtualServiceIn(ns, name, host string) string {
	return `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: ` + name + `, namespace: ` + ns + `}
spec:
  hosts: [echo]
  http:
  - route:
    - destination: {host: ` + host + `}
`
}

func conflicts(svc *configingest.Service) []*upstream.ConflictError {
	var out []*upstream.ConflictError
	for _, p := range svc.Problems() {
		if ce, ok := errors.AsType[*upstream.ConflictError](p); ok {
			out = append(out, ce)
		}
	}
	return out
}

// Another Sailplane's config-ingest as an xds:// config source, in plaintext over loopback: its
// resources are served beside the local ones, a local one wins a conflict (reported once, on the
// upstream's copy), an edit upstream arrives, and a deletion upstream deletes.
func TestUpstreamSailplane(t *testing.T) {
	up := newIngest(t, "rootNamespace: istio-system\n")
	write(t, filepath.Join(up.conf(), "vs.yaml"), virtualService("remote", "from-upstream")+"---\n"+virtualService("both", "upstream-copy"))
	up.start(true)

	down := newIngest(t, "configSources:\n- address: fs://conf\n"+up.plaintext())
	write(t, filepath.Join(down.conf(), "vs.yaml"), virtualService("both", "local-copy"))
	down.start(true)

	// The first state already has the upstream's resources: Ready waited for its first full state.
	if got := down.vs("default/remote"); got != "from-upstream" {
		t.Fatalf("upstream VirtualService at the first state: %q", got)
	}
	if got := down.vs("default/both"); got != "local-copy" {
		t.Fatalf("conflict served %q, want the local copy", got)
	}
	cs := conflicts(down.svc)
	if len(cs) != 1 || cs[0].Name != "default/both" || cs[0].Source != up.source() || cs[0].Winner != upstream.Local {
		t.Fatalf("conflicts = %v, want default/both from the upstream", cs)
	}

	// An edit upstream (and a new resource) arrives; the conflict is not reported again.
	edited := time.Now()
	write(t, filepath.Join(up.conf(), "vs.yaml"), virtualService("remote", "edited")+"---\n"+virtualService("both", "upstream-copy-2")+"---\n"+virtualService("new", "new"))
	eventually(t, "the upstream's edit served", func() bool { return down.vs("default/remote") == "edited" && down.vs("default/new") == "new" })
	t.Logf("an edit of the upstream's file reached the downstream's bus in %s (the upstream's 20 ms debounce included)", time.Since(edited).Round(time.Millisecond))
	if got := down.vs("default/both"); got != "local-copy" {
		t.Fatalf("conflict served %q after the upstream's edit, want the local copy", got)
	}
	if n := down.msgs.Count("config conflict"); n != 1 {
		t.Fatalf("conflict logged %d times, want once", n)
	}

	// The local copy goes: the upstream's is served, and the conflict is gone.
	write(t, filepath.Join(down.conf(), "vs.yaml"), "# nothing\n")
	eventually(t, "the upstream's copy served", func() bool { return down.vs("default/both") == "upstream-copy-2" && len(conflicts(down.svc)) == 0 })

	// A deletion upstream deletes downstream.
	write(t, filepath.Join(up.conf(), "vs.yaml"), virtualService("remote", "edited")+"---\n"+virtualService("both", "upstream-copy-2"))
	eventually(t, "the upstream's deletion served", func() bool { return down.vs("default/new") == "" })
	if len(down.svc.Problems()) != 0 {
		t.Fatalf("problems: %v", down.svc.Problems())
	}
}

// An upstream that goes away keeps what it sent; one that comes back with changes made while it
// was away brings them, deletions included, after reconnecting by itself.
func TestUpstreamDisconnect(t *testing.T) {
	up := newIngest(t, "rootNamespace: istio-system\n")
	write(t, filepath.Join(up.conf(), "vs.yaml"), virtualService("stays", "a")+"---\n"+virtualService("goes", "b"))
	up.start(true)
	down := newIngest(t, "configSources:\n- address: fs://conf\n"+up.plaintext())
	down.start(true)
	if down.vs("default/stays") != "a" || down.vs("default/goes") != "b" {
		t.Fatal("upstream state not served")
	}

	up.stop()
	eventually(t, "the downstream saw its upstream go", func() bool { return down.msgs.Count("peer unreachable or stream failed") > 0 })
	retries := down.msgs.Count("peer unreachable or stream failed")
	eventually(t, "the downstream retried", func() bool { return down.msgs.Count("peer unreachable or stream failed") > retries })
	if down.vs("default/stays") != "a" || down.vs("default/goes") != "b" {
		t.Fatal("an upstream that disconnected lost what it sent")
	}

	write(t, filepath.Join(up.conf(), "vs.yaml"), virtualService("stays", "a2"))
	up.start(true)
	eventually(t, "the upstream's changes while away served", func() bool {
		return down.vs("default/stays") == "a2" && down.vs("default/goes") == ""
	})
}

// A downstream restarted while its upstream is down serves what the upstream last sent (saved
// in its state folder) and is ready without waiting; the resources the upstream deleted
// meanwhile go only once its first full state arrives.
func TestUpstreamRestart(t *testing.T) {
	up := newIngest(t, "rootNamespace: istio-system\n")
	write(t, filepath.Join(up.conf(), "vs.yaml"), virtualService("stays", "a")+"---\n"+virtualService("goes", "b"))
	up.start(true)
	down := newIngest(t, "configSources:\n- address: fs://conf\n"+up.plaintext())
	down.start(true)
	eventually(t, "the upstream state saved", func() bool {
		data, _ := os.ReadFile(filepath.Join(down.root, "var/lib/sailplane", upstream.StateFile))
		return strings.Contains(string(data), "default/goes")
	})
	down.stop()
	up.stop()
	write(t, filepath.Join(up.conf(), "vs.yaml"), virtualService("stays", "a2"))

	down.start(true) // ready at once: the upstream's saved state stands in
	if down.vs("default/stays") != "a" || down.vs("default/goes") != "b" {
		t.Fatalf("after a restart with the upstream down: stays %q, goes %q; want the saved state", down.vs("default/stays"), down.vs("default/goes"))
	}
	notSynced := func() bool {
		return slices.ContainsFunc(down.svc.Problems(), func(err error) bool {
			se, ok := errors.AsType[*upstream.SourceError](err)
			return ok && se.Address == up.source() && errors.Is(err, upstream.ErrNotSynced)
		})
	}
	if !notSynced() {
		t.Fatalf("problems = %v, want the upstream reported not synced", down.svc.Problems())
	}
	up.start(true)
	eventually(t, "the upstream's first full state replaces the saved one", func() bool {
		return down.vs("default/stays") == "a2" && down.vs("default/goes") == "" && !notSynced()
	})
}

// Several upstreams: a resource defined by two is served from the one listed first, and
// reordering configSources switches it. Removing an upstream withdraws what only it defined.
func TestUpstreamOrder(t *testing.T) {
	first, second := newIngest(t, "rootNamespace: istio-system\n"), newIngest(t, "rootNamespace: istio-system\n")
	write(t, filepath.Join(first.conf(), "vs.yaml"), virtualService("dup", "first")+"---\n"+virtualService("only-first", "x"))
	write(t, filepath.Join(second.conf(), "vs.yaml"), virtualService("dup", "second"))
	first.start(true)
	second.start(true)
	down := newIngest(t, "configSources:\n"+first.plaintext()+second.plaintext())
	down.start(true)
	if got := down.vs("default/dup"); got != "first" {
		t.Fatalf("served %q, want the first upstream's", got)
	}
	if cs := conflicts(down.svc); len(cs) != 1 || cs[0].Source != second.source() || cs[0].Winner != first.source() {
		t.Fatalf("conflicts = %v", cs)
	}

	write(t, down.meshFile(), "configSources:\n"+second.plaintext()+first.plaintext())
	eventually(t, "the second upstream's copy served after reordering", func() bool {
		cs := conflicts(down.svc)
		return down.vs("default/dup") == "second" && len(cs) == 1 && cs[0].Source == first.source()
	})

	write(t, down.meshFile(), "configSources:\n"+second.plaintext())
	eventually(t, "the removed upstream's resources withdrawn", func() bool {
		return down.vs("default/only-first") == "" && down.vs("default/dup") == "second" && len(conflicts(down.svc)) == 0
	})
}

// An upstream without tlsSettings is read over mutual TLS with the service's workload
// certificate (ISTIO_MUTUAL): the upstream's bus authenticates the downstream's identity, and
// the downstream accepts the upstream's certificate only if it chains to the mesh's roots and
// names the expected identity (here a SPIFFE ID of the control plane's namespace, or
// tlsSettings.subjectAltNames). A server that is not accepted is never read.
func TestUpstreamMutualTLS(t *testing.T) {
	auth, err := pki.NewSelfSigned(pki.ECDSAP256, "test", 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	id := func(ns, sa string) spiffe.ID {
		return spiffe.ID{TrustDomain: "cluster.local", Namespace: ns, ServiceAccount: sa}
	}
	downID := id("istio-system", "config-ingest-downstream")

	up := newIngest(t, "rootNamespace: istio-system\n")
	up.identity = bustest.SignIdentity(t, auth, id("istio-system", "config-ingest"))
	up.sec = bus.Security{Identity: up.identity, Peers: []spiffe.ID{downID}}
	write(t, filepath.Join(up.conf(), "vs.yaml"), virtualService("remote", "over-mtls"))
	up.start(true)

	down := newIngest(t, "configSources:\n- address: "+up.source()+"\n")
	down.identity = bustest.SignIdentity(t, auth, downID)
	down.start(true)
	if got := down.vs("default/remote"); got != "over-mtls" {
		t.Fatalf("upstream over mTLS: served %q", got)
	}

	// The same upstream, asked to name another identity: refused at the handshake, so nothing
	// it sends is taken; the refusal is logged with the reason.
	other := newIngest(t, "configSources:\n- address: "+up.source()+"\n  tlsSettings:\n    mode: ISTIO_MUTUAL\n    subjectAltNames: [spiffe://cluster.local/ns/istio-system/sa/istiod]\n")
	other.identity = bustest.SignIdentity(t, auth, downID)
	other.start(false)
	eventually(t, "the unexpected server identity refused", func() bool { return other.msgs.Count("peer unreachable or stream failed") > 1 })
	if got := other.vs("default/remote"); got != "" {
		t.Fatalf("a server whose identity is not the expected one was read: %q", got)
	}

	// A downstream of another mesh (another root) does not accept the upstream either.
	foreign, err := pki.NewSelfSigned(pki.ECDSAP256, "other", 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	stranger := newIngest(t, "configSources:\n- address: "+up.source()+"\n")
	stranger.identity = bustest.SignIdentity(t, foreign, downID)
	stranger.start(false)
	eventually(t, "the server of another root refused", func() bool { return stranger.msgs.Count("peer unreachable or stream failed") > 1 })
	if got := stranger.vs("default/remote"); got != "" {
		t.Fatalf("a server chaining to another root was read: %q", got)
	}
}

// An upstream is read over TLS unless plaintext is asked for: without a workload certificate,
// an entry without tlsSettings is refused and reported, never dialled in plaintext.
func TestUpstreamTLSRequired(t *testing.T) {
	up := newIngest(t, "rootNamespace: istio-system\n")
	write(t, filepath.Join(up.conf(), "vs.yaml"), virtualService("remote", "x"))
	up.start(true)
	down := newIngest(t, "configSources:\n- address: "+up.source()+"\n")
	down.start(true)
	var se *upstream.SourceError
	found := false
	for _, p := range down.svc.Problems() {
		if errors.As(p, &se) && se.Address == up.source() && errors.Is(p, upstream.ErrTLS) {
			found = true
		}
	}
	if !found {
		t.Fatalf("problems = %v, want the source refused for TLS", down.svc.Problems())
	}
	if down.vs("default/remote") != "" {
		t.Fatal("an upstream asking for TLS was read in plaintext")
	}
}

// An upstream that is not a config-ingest: a bus carrying istiod-style synthetic ServiceEntries
// (skipped: the registry has those services) and an invalid resource (reported with the
// source's address; its last valid version stays served).
func TestUpstreamSyntheticAndInvalid(t *testing.T) {
	store := bus.NewStore()
	log := testlog.New(t, slog.LevelDebug)
	se := func(name, host string) *bus.Resource {
		return &bus.Resource{Name: name, Body: &networking.ServiceEntry{Hosts: []string{host}, Ports: []*networking.ServicePort{{Number: 80, Name: "http", Protocol: "HTTP"}}, Resolution: networking.ServiceEntry_DNS}}
	}
	vs := func(host string) *bus.Resource {
		return &bus.Resource{Name: "default/checked", Body: &networking.VirtualService{Hosts: []string{"echo"}, Http: []*networking.HTTPRoute{{Route: []*networking.HTTPRouteDestination{{Destination: &networking.Destination{Host: host}}}}}}}
	}
	if err := store.Upsert(schema.ServiceEntry.TypeURL, se("default/synthetic-kubernetes", "kubernetes.default.svc.cluster.local"), se("default/external", "example.com")); err != nil {
		t.Fatal(err)
	}
	if err := store.Upsert(schema.VirtualService.TypeURL, vs("good")); err != nil {
		t.Fatal(err)
	}
	// Gateway API kinds are held to their CRD's schema, as a file's are.
	route := func(name string, spec map[string]any) *bus.Resource {
		body, err := structpb.NewStruct(spec)
		if err != nil {
			t.Fatal(err)
		}
		return &bus.Resource{Name: name, Body: body}
	}
	if err := store.Upsert(schema.HTTPRoute.TypeURL,
		route("default/ok", map[string]any{"parentRefs": []any{map[string]any{"name": "gw"}}}),
		route("default/bogus", map[string]any{"parentRefs": []any{map[string]any{"name": "gw"}}, "notAField": 1})); err != nil {
		t.Fatal(err)
	}
	addr := bustest.Serve(t, store, log, bus.Security{})

	down := newIngest(t, fmt.Sprintf("configSources:\n- address: xds://%s\n  tlsSettings: {mode: DISABLE}\n", addr))
	down.start(true)
	names := func() []string {
		var out []string
		for _, e := range down.store.List(schema.ServiceEntry.TypeURL) {
			out = append(out, e.Name)
		}
		return out
	}
	if got := names(); len(got) != 1 || got[0] != "default/external" {
		t.Fatalf("ServiceEntries served: %v, want only default/external (no synthetic one)", got)
	}
	if down.vs("default/checked") != "good" {
		t.Fatal("upstream VirtualService not served")
	}
	var routes []string
	for _, e := range down.store.List(schema.HTTPRoute.TypeURL) {
		routes = append(routes, e.Name)
	}
	if len(routes) != 1 || routes[0] != "default/ok" {
		t.Fatalf("HTTPRoutes served: %v, want only default/ok", routes)
	}
	if !slices.ContainsFunc(down.svc.Problems(), func(err error) bool {
		return strings.Contains(err.Error(), "default/bogus") && strings.Contains(err.Error(), "notAField")
	}) {
		t.Fatalf("problems = %v, want the HTTPRoute's unknown field", down.svc.Problems())
	}

	// An invalid version (a destination without host) keeps the valid one, reported.
	if err := store.Upsert(schema.VirtualService.TypeURL, vs("")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the invalid upstream resource reported", func() bool {
		for _, p := range down.svc.Problems() {
			if strings.HasPrefix(p.Error(), "xds://"+addr) && strings.Contains(p.Error(), "default/checked") {
				return true
			}
		}
		return false
	})
	if down.vs("default/checked") != "good" {
		t.Fatal("the last valid version of an invalid upstream resource is not served")
	}
}

// Kubernetes mode: the istio ConfigMap's configSources name the upstream; a resource of the API
// server wins over the upstream's copy, the upstream's others are served, and a change of the
// mesh config that drops the upstream withdraws them.
func TestKubeUpstream(t *testing.T) {
	e := newKenv(t, sharedKube(t))
	ns := e.ns("app", nil)
	up := newIngest(t, "rootNamespace: istio-system\n")
	write(t, filepath.Join(up.conf(), "vs.yaml"), virtualServiceIn(ns, "remote", "from-upstream")+"---\n"+virtualServiceIn(ns, "both", "upstream-copy"))
	up.start(true)
	e.createVS(ns, "both", vsSpec("local-copy", 0))
	e.setMesh("configSources:\n" + up.plaintext())
	in := e.start("pod-0", nil)
	host := func(name string) string {
		if vs, ok := in.rec.body(schema.VirtualService, ns+"/"+name).(*networking.VirtualService); ok {
			return vs.GetHttp()[0].GetRoute()[0].GetDestination().GetHost()
		}
		return ""
	}
	if host("remote") != "from-upstream" || host("both") != "local-copy" {
		t.Fatalf("first state: remote %q, both %q; want the upstream's and the API server's", host("remote"), host("both"))
	}
	if cs := conflicts(in.svc); len(cs) != 1 || cs[0].Name != ns+"/both" || cs[0].Source != up.source() {
		t.Fatalf("conflicts = %v", cs)
	}
	e.setMesh("trustDomain: cluster.local\n")
	waitFor(t, "the upstream withdrawn with its configSources entry", func() bool {
		return host("remote") == "" && host("both") == "local-copy" && len(conflicts(in.svc)) == 0
	})
}

// Two config-ingests reading each other: each serves the other's resources, each reports the
// cycle (its own resources coming back) instead of serving them back, and a resource deleted at
// its origin disappears from both.
func TestUpstreamCycle(t *testing.T) {
	a := newIngest(t, "")
	b := newIngest(t, "")
	write(t, a.meshFile(), "configSources:\n- address: fs://conf\n"+b.plaintext())
	write(t, b.meshFile(), "configSources:\n- address: fs://conf\n"+a.plaintext())
	write(t, filepath.Join(a.conf(), "vs.yaml"), virtualService("from-a", "a"))
	write(t, filepath.Join(b.conf(), "vs.yaml"), virtualService("from-b", "b"))
	// Each one's first state waits for the other's: in a cycle, only the sync timeout ends it.
	a.syncTimeout, b.syncTimeout = 500*time.Millisecond, 500*time.Millisecond
	a.start(false)
	b.start(true)

	cycles := func(in *ingest) []*upstream.CycleError {
		var out []*upstream.CycleError
		for _, p := range in.svc.Problems() {
			if ce, ok := errors.AsType[*upstream.CycleError](p); ok {
				out = append(out, ce)
			}
		}
		return out
	}
	eventually(t, "both served by both, the cycle reported", func() bool {
		return a.vs("default/from-b") == "b" && b.vs("default/from-a") == "a" && len(cycles(a)) == 1 && len(cycles(b)) == 1
	})
	if c := cycles(a)[0]; c.Name != "default/from-a" || c.Source != b.source() {
		t.Fatalf("a's cycle = %v, want its own default/from-a coming back from %s", c, b.source())
	}
	if len(conflicts(a.svc)) != 0 {
		t.Fatalf("conflicts: %v", conflicts(a.svc))
	}

	write(t, filepath.Join(a.conf(), "vs.yaml"), "# nothing\n")
	eventually(t, "the deletion at the origin served by both", func() bool {
		return a.vs("default/from-a") == "" && b.vs("default/from-a") == "" && len(cycles(a)) == 0
	})
	if n := a.msgs.Count("config source cycle"); n != 1 {
		t.Fatalf("cycle logged %d times, want once", n)
	}
}
