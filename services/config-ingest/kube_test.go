package configingest_test

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	configingest "sailplane.dev/services/config-ingest"
	"sailplane.dev/services/config-ingest/internal/kubesource"
	"sailplane.dev/shared/config"
	"sailplane.dev/shared/kube"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/telemetry/telemetrytest"
	"sailplane.dev/shared/testlog"
	"sailplane.dev/shared/testwait"
	"sailplane.dev/tools/testenv"
)

// One API server for the Kubernetes tests (each starts in a few seconds): tests keep apart by
// using their own namespaces, including their own control plane namespace, so their mesh
// ConfigMaps and Leases do not meet. TestMain stops it.
var shared struct {
	once sync.Once
	kube *testenv.Kube
	err  error
}

func sharedKube(t *testing.T) *testenv.Kube {
	t.Helper()
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		shared.kube, shared.err = testenv.StartKube(ctx, testenv.WithLogger(slog.New(slog.DiscardHandler)), testenv.WithGatewayAPICRDs())
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.kube
}

func stopSharedKube() {
	if shared.kube != nil {
		shared.kube.Stop()
	}
}

type kenv struct {
	t     *testing.T
	k     *testenv.Kube
	kube  kubernetes.Interface
	istio istioclient.Interface
	cp    string // the control plane namespace
	id    string // suffix making this test's names unique on the shared API server
}

func newKenv(t *testing.T, k *testenv.Kube) *kenv {
	t.Helper()
	e := &kenv{t: t, k: k, id: strings.ToLower(rand.Text()[:6])}
	var err error
	if e.kube, err = kubernetes.NewForConfig(k.RestConfig()); err != nil {
		t.Fatal(err)
	}
	if e.istio, err = istioclient.NewForConfig(k.RestConfig()); err != nil {
		t.Fatal(err)
	}
	e.cp = e.ns("cp", nil)
	return e
}

func (e *kenv) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	e.t.Cleanup(cancel)
	return ctx
}

// ns creates a namespace named prefix-<id> and returns its name.
func (e *kenv) ns(prefix string, labels map[string]string) string {
	e.t.Helper()
	name := prefix + "-" + e.id
	_, err := e.kube.CoreV1().Namespaces().Create(e.ctx(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return name
}

type kingest struct {
	svc     *configingest.Service
	rec     *recorder
	logs    *testlog.Messages
	metrics *telemetrytest.Metrics
	stop    func() // cancels Run and waits for it
}

// start runs a Kubernetes-mode Service with short leader election timings.
func (e *kenv) start(podName string, edit func(*configingest.Config)) *kingest {
	e.t.Helper()
	cfg := configingest.Config{
		Kube: e.k.RestConfig(), Namespace: e.cp, PodName: podName,
		LeaseDuration: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 200 * time.Millisecond,
	}
	if edit != nil {
		edit(&cfg)
	}
	log, logs := testlog.NewRecording(e.t, slog.LevelDebug)
	log = log.With("pod", podName)
	rec := newRecorder()
	metrics := telemetrytest.New(e.t)
	svc, err := configingest.New(cfg, configingest.Deps{Logger: log, Publisher: rec, MeterProvider: metrics.Provider()})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				e.t.Errorf("Run: %v", err)
			}
		})
	}
	e.t.Cleanup(stop)
	select {
	case <-svc.Ready():
	case err := <-done:
		e.t.Fatalf("Run returned before ready: %v", err)
	case <-time.After(30 * time.Second):
		e.t.Fatal("not ready")
	}
	return &kingest{svc: svc, rec: rec, logs: logs, metrics: metrics, stop: stop}
}

// waitFor polls cond until it holds, failing t after 30s (leader failover and API server
// restarts take seconds).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitWithin(t, what, 30*time.Second, cond)
}

// afterOutage bounds how long changes take to arrive once the API server is back from an
// outage: the probe's backoff (1 s at most) and one list of everything, with room for a
// loaded machine.
const afterOutage = 10 * time.Second

func waitWithin(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	testwait.Until(t, d, what, cond)
}

func vsSpec(host string, weight int32) *networking.VirtualService {
	return &networking.VirtualService{
		Hosts: []string{host},
		Http: []*networking.HTTPRoute{{Route: []*networking.HTTPRouteDestination{{
			Destination: &networking.Destination{Host: host}, Weight: weight,
		}}}},
	}
}

func (e *kenv) createVS(ns, name string, spec *networking.VirtualService) {
	e.t.Helper()
	vs := &networkingv1.VirtualService{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": name}}}
	proto.Merge(&vs.Spec, spec)
	if _, err := e.istio.NetworkingV1().VirtualServices(ns).Create(e.ctx(), vs, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// updateVS replaces the spec, retrying on conflicts with the status writer.
func (e *kenv) updateVS(ns, name string, spec *networking.VirtualService) {
	e.t.Helper()
	for {
		vs, err := e.istio.NetworkingV1().VirtualServices(ns).Get(e.ctx(), name, metav1.GetOptions{})
		if err != nil {
			e.t.Fatal(err)
		}
		vs.Spec.Reset()
		proto.Merge(&vs.Spec, spec)
		_, err = e.istio.NetworkingV1().VirtualServices(ns).Update(e.ctx(), vs, metav1.UpdateOptions{})
		if err == nil {
			return
		}
		if !strings.Contains(err.Error(), "the object has been modified") {
			e.t.Fatal(err)
		}
	}
}

func (e *kenv) vsStatus(ns, name string) (codes []string, conditionMessage string) {
	e.t.Helper()
	vs, err := e.istio.NetworkingV1().VirtualServices(ns).Get(e.ctx(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, m := range vs.Status.GetValidationMessages() {
		codes = append(codes, m.GetType().GetCode()+"/"+m.GetLevel().String())
	}
	for _, c := range vs.Status.GetConditions() {
		if c.GetType() == "Accepted" && c.GetStatus() == "False" {
			conditionMessage = c.GetMessage()
		}
	}
	return codes, conditionMessage
}

func (r *recorder) body(k schema.Kind, name string) proto.Message {
	if res := r.get(k, name); res != nil {
		return res.Body
	}
	return nil
}

func (r *recorder) calls() (replaced, deletes int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.replaced {
		replaced += n
	}
	for _, n := range r.deletes {
		deletes += n
	}
	return replaced, deletes
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestKubeConfigPublished(t *testing.T) {
	e := newKenv(t, sharedKube(t))
	ctx := e.ctx()
	nsA, nsB := e.ns("a", nil), e.ns("b", nil)
	dr := &networking.DestinationRule{Host: "reviews", TrafficPolicy: &networking.TrafficPolicy{
		ConnectionPool: &networking.ConnectionPoolSettings{Tcp: &networking.ConnectionPoolSettings_TCPSettings{MaxConnections: 7}}}}
	gw := &networking.Gateway{Selector: map[string]string{"istio": "ingressgateway"}, Servers: []*networking.Server{{
		Port: &networking.Port{Number: 80, Name: "http", Protocol: "HTTP"}, Hosts: []string{"*/example.com"}}}}
	se := &networking.ServiceEntry{Hosts: []string{"api.example.com"}, Resolution: networking.ServiceEntry_DNS,
		Ports: []*networking.ServicePort{{Number: 443, Name: "https", Protocol: "TLS"}}}
	for _, ns := range []string{nsA, nsB} {
		e.createVS(ns, "reviews", vsSpec("reviews."+ns+".svc.cluster.local", 0))
		d := &networkingv1.DestinationRule{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "reviews"}}
		proto.Merge(&d.Spec, dr)
		g := &networkingv1.Gateway{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gw"}}
		proto.Merge(&g.Spec, gw)
		s := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "api"}}
		proto.Merge(&s.Spec, se)
		if _, err := e.istio.NetworkingV1().DestinationRules(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.istio.NetworkingV1().Gateways(ns).Create(ctx, g, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.istio.NetworkingV1().ServiceEntries(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	in := e.start("pod-0", nil)
	rec := in.rec
	for _, ns := range []string{nsA, nsB} {
		for _, c := range []struct {
			kind schema.Kind
			name string
			want proto.Message
		}{
			{schema.VirtualService, "reviews", vsSpec("reviews."+ns+".svc.cluster.local", 0)},
			{schema.DestinationRule, "reviews", dr},
			{schema.Gateway, "gw", gw},
			{schema.ServiceEntry, "api", se},
		} {
			if got := rec.body(c.kind, ns+"/"+c.name); !proto.Equal(got, c.want) {
				t.Errorf("%s %s/%s: got %v, want %v", c.kind.Kind, ns, c.name, got, c.want)
			}
		}
	}
	if res := rec.get(schema.VirtualService, nsA+"/reviews"); res == nil || res.Labels["app"] != "reviews" {
		t.Errorf("labels not published: %+v", res)
	}
	if rec.get(schema.MeshConfig, "mesh") == nil {
		t.Error("no mesh config published")
	}

	// A new resource, an update and a delete propagate, each counted as istiod counts them.
	events := func(kind, event string) float64 {
		return in.metrics.Value("pilot_k8s_cfg_events", "type", kind, "event", event)
	}
	adds, updates, deletes := events("VirtualService", "add"), events("VirtualService", "update"), events("Gateway", "delete")
	e.createVS(nsA, "ratings", vsSpec("ratings", 0))
	waitFor(t, "new VirtualService", func() bool { return rec.get(schema.VirtualService, nsA+"/ratings") != nil })
	e.updateVS(nsB, "reviews", vsSpec("reviews-v2", 0))
	waitFor(t, "updated VirtualService", func() bool {
		return proto.Equal(rec.body(schema.VirtualService, nsB+"/reviews"), vsSpec("reviews-v2", 0))
	})
	if err := e.istio.NetworkingV1().Gateways(nsA).Delete(ctx, "gw", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "deleted Gateway", func() bool { return rec.get(schema.Gateway, nsA+"/gw") == nil })
	if n := events("VirtualService", "add") - adds; n != 1 {
		t.Errorf("pilot_k8s_cfg_events{type=VirtualService,event=add} moved by %v for one creation, want 1", n)
	}
	if n := events("VirtualService", "update") - updates; n < 1 {
		t.Errorf("pilot_k8s_cfg_events{type=VirtualService,event=update} moved by %v for an update, want at least 1", n)
	}
	if n := events("Gateway", "delete") - deletes; n != 1 {
		t.Errorf("pilot_k8s_cfg_events{type=Gateway,event=delete} moved by %v for one deletion, want 1", n)
	}
	if rec.get(schema.Gateway, nsB+"/gw") == nil {
		t.Error("the other namespace's Gateway was deleted too")
	}
}

func TestKubeInvalidStatus(t *testing.T) {
	e := newKenv(t, sharedKube(t))
	ns := e.ns("inv", nil)
	// Weight -150: the CRD accepts any int32, Istio's validation no negative weight.
	e.createVS(ns, "bad", vsSpec("bad", -150))
	e.createVS(ns, "good", vsSpec("good", 100))
	in := e.start("pod-0", nil)
	rec := in.rec

	if rec.get(schema.VirtualService, ns+"/bad") != nil {
		t.Error("invalid VirtualService published")
	}
	if rec.get(schema.VirtualService, ns+"/good") == nil {
		t.Error("valid VirtualService not published")
	}
	const field = "spec.http[0].route[0].weight"
	waitFor(t, "validation status", func() bool {
		codes, msg := e.vsStatus(ns, "bad")
		return slices.Equal(codes, []string{"IST0106/ERROR"}) && strings.HasPrefix(msg, field+": ")
	})
	var ce *config.Error
	found := false
	for _, p := range in.svc.Problems() {
		if errors.As(p, &ce) && ce.Namespace == ns && ce.Name == "bad" && ce.Field == field {
			found = true
		}
	}
	if !found {
		t.Errorf("problems %v lack the invalid VirtualService", in.svc.Problems())
	}
	if codes, msg := e.vsStatus(ns, "good"); len(codes) != 0 || msg != "" {
		t.Errorf("valid VirtualService has status %v %q", codes, msg)
	}

	// Fixing it publishes it and clears the status.
	e.updateVS(ns, "bad", vsSpec("bad", 100))
	waitFor(t, "fixed VirtualService published", func() bool { return rec.get(schema.VirtualService, ns+"/bad") != nil })
	waitFor(t, "status cleared", func() bool {
		codes, msg := e.vsStatus(ns, "bad")
		return len(codes) == 0 && msg == ""
	})

	// Breaking a valid one keeps its last valid version published.
	e.updateVS(ns, "good", vsSpec("good-v2", -1))
	waitFor(t, "validation status", func() bool {
		_, msg := e.vsStatus(ns, "good")
		return strings.HasPrefix(msg, field+": ")
	})
	if got := rec.body(schema.VirtualService, ns+"/good"); !proto.Equal(got, vsSpec("good", 100)) {
		t.Errorf("last valid version not kept: %v", got)
	}
}

// A restart with the same state folder still serves the last valid version of a resource that
// became invalid in the API server; one recreated (another UID) or fixed meanwhile loses it.
func TestKubeStateDirKeepsLastValid(t *testing.T) {
	e := newKenv(t, sharedKube(t))
	ns := e.ns("state", nil)
	stateDir := t.TempDir()
	withState := func(c *configingest.Config) { c.StateDir = stateDir }
	e.createVS(ns, "kept", vsSpec("kept", 100))
	e.createVS(ns, "recreated", vsSpec("recreated", 100))
	e.createVS(ns, "fixed", vsSpec("fixed", 100))
	in := e.start("pod-0", withState)
	for _, name := range []string{"kept", "recreated", "fixed"} {
		if in.rec.get(schema.VirtualService, ns+"/"+name) == nil {
			t.Fatalf("%s not published", name)
		}
		// Weight -150: the CRD accepts it, Istio's validation does not.
		e.updateVS(ns, name, vsSpec(name+"-v2", -150))
	}
	waitFor(t, "three invalid VirtualServices", func() bool {
		n := 0
		for _, p := range in.svc.Problems() {
			if ce := (*config.Error)(nil); errors.As(p, &ce) && ce.Namespace == ns {
				n++
			}
		}
		return n == 3
	})
	e.updateVS(ns, "fixed", vsSpec("fixed-v3", 100))
	waitFor(t, "fixed VirtualService published", func() bool {
		return proto.Equal(in.rec.body(schema.VirtualService, ns+"/fixed"), vsSpec("fixed-v3", 100))
	})
	in.stop()

	// While config-ingest is down: "recreated" gets another UID, "fixed" breaks again.
	if err := e.istio.NetworkingV1().VirtualServices(ns).Delete(e.ctx(), "recreated", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.createVS(ns, "recreated", vsSpec("recreated-v2", -150))
	e.updateVS(ns, "fixed", vsSpec("fixed-v4", -150))

	without := e.start("pod-1", nil)
	if got := without.rec.body(schema.VirtualService, ns+"/kept"); got != nil {
		t.Errorf("without the state folder, the invalid VirtualService is published: %v", got)
	}
	without.stop()

	again := e.start("pod-2", withState)
	if got := again.rec.body(schema.VirtualService, ns+"/kept"); !proto.Equal(got, vsSpec("kept", 100)) {
		t.Errorf("after the restart, kept = %v, want its last valid version", got)
	}
	for _, name := range []string{"recreated", "fixed"} {
		if got := again.rec.body(schema.VirtualService, ns+"/"+name); got != nil {
			t.Errorf("after the restart, %s = %v, want nothing: its saved version was dropped", name, got)
		}
	}
	if n := again.logs.Count("saved Kubernetes config state restored"); n != 1 {
		t.Errorf("restore logged %d times, want once", n)
	}
	again.stop()

	// The saved state now holds only "kept": "recreated" had another UID.
	data, err := os.ReadFile(filepath.Join(stateDir, kubesource.StateFile))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"name": "kept"`) || strings.Contains(string(data), `"name": "recreated"`) || strings.Contains(string(data), `"name": "fixed"`) {
		t.Errorf("saved state:\n%s\nwant only kept", data)
	}
}

func (e *kenv) setMesh(mesh string) {
	e.t.Helper()
	e.setMeshData(map[string]string{"mesh": mesh})
}

// setMeshData sets the istio ConfigMap's data.
func (e *kenv) setMeshData(data map[string]string) {
	e.t.Helper()
	cms := e.kube.CoreV1().ConfigMaps(e.cp)
	cm, err := cms.Get(e.ctx(), "istio", metav1.GetOptions{})
	if err != nil {
		_, err = cms.Create(e.ctx(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "istio"}, Data: data}, metav1.CreateOptions{})
	} else {
		cm.Data = data
		_, err = cms.Update(e.ctx(), cm, metav1.UpdateOptions{})
	}
	if err != nil {
		e.t.Fatal(err)
	}
}

func TestKubeDiscoverySelectors(t *testing.T) {
	e := newKenv(t, sharedKube(t))
	in, out := e.ns("in", map[string]string{"mesh-" + e.id: "yes"}), e.ns("out", nil)
	e.setMesh("discoverySelectors:\n- matchLabels: {mesh-" + e.id + ": \"yes\"}\n")
	e.createVS(in, "r", vsSpec("r", 0))
	e.createVS(out, "r", vsSpec("r", 0))
	e.createVS(e.cp, "r", vsSpec("r", 0))
	ing := e.start("pod-0", nil)
	rec := ing.rec

	if rec.get(schema.VirtualService, in+"/r") == nil {
		t.Error("selected namespace's config not published")
	}
	if rec.get(schema.VirtualService, e.cp+"/r") == nil {
		t.Error("control plane namespace's config not published")
	}
	if rec.get(schema.VirtualService, out+"/r") != nil {
		t.Error("unselected namespace's config published")
	}

	// Labeling a namespace brings its config in; unlabeling one takes it out.
	label := func(ns string, labels map[string]string) {
		n, err := e.kube.CoreV1().Namespaces().Get(e.ctx(), ns, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Labels = labels
		if _, err := e.kube.CoreV1().Namespaces().Update(e.ctx(), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	label(out, map[string]string{"mesh-" + e.id: "yes"})
	waitFor(t, "relabeled namespace's config", func() bool { return rec.get(schema.VirtualService, out+"/r") != nil })
	label(in, nil)
	waitFor(t, "unlabeled namespace's config removed", func() bool { return rec.get(schema.VirtualService, in+"/r") == nil })

	// Dropping the selectors selects everything again.
	e.setMesh("trustDomain: example.org\n")
	waitFor(t, "all namespaces", func() bool { return rec.get(schema.VirtualService, in+"/r") != nil })
}

// The namespaces the discoverySelectors admit are published with their labels (and nothing
// else), followed as labels change, for the xds-server's Gateway API translation to match
// listeners' allowedRoutes selectors as the status writer does.
func TestKubeNamespacesPublished(t *testing.T) {
	e := newKenv(t, sharedKube(t))
	sel := "mesh-" + e.id
	in, out := e.ns("in", map[string]string{sel: "yes", "team": "web"}), e.ns("out", nil)
	e.setMesh("discoverySelectors:\n- matchLabels: {" + sel + ": \"yes\"}\n")
	ing := e.start("pod-0", nil)
	rec := ing.rec
	labels := func(name string) (map[string]string, bool) {
		b, ok := rec.body(schema.Namespace, name).(*discoveryv1.Namespace)
		if !ok {
			return nil, false
		}
		if b.GetName() != name {
			t.Errorf("namespace %s published as %q", name, b.GetName())
		}
		return b.GetLabels(), true
	}
	want := map[string]string{"kubernetes.io/metadata.name": in, sel: "yes", "team": "web"}
	if got, ok := labels(in); !ok || !maps.Equal(got, want) {
		t.Errorf("selected namespace published with labels %v (%v), want %v", got, ok, want)
	}
	if _, ok := labels(e.cp); !ok {
		t.Error("control plane namespace not published")
	}
	if _, ok := labels(out); ok {
		t.Error("unselected namespace published")
	}

	relabel := func(ns string, edit func(map[string]string)) {
		n, err := e.kube.CoreV1().Namespaces().Get(e.ctx(), ns, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		edit(n.Labels)
		if _, err := e.kube.CoreV1().Namespaces().Update(e.ctx(), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	relabel(in, func(l map[string]string) { delete(l, "team") })
	waitFor(t, "label removal published", func() bool {
		got, ok := labels(in)
		return ok && got["team"] == "" && got[sel] == "yes"
	})
	relabel(out, func(l map[string]string) { l[sel] = "yes" })
	waitFor(t, "newly selected namespace published", func() bool { _, ok := labels(out); return ok })
	relabel(in, func(l map[string]string) { delete(l, sel) })
	waitFor(t, "unselected namespace removed", func() bool { _, ok := labels(in); return !ok })

	// Without selectors, every namespace is in the mesh.
	e.setMesh("trustDomain: example.org\n")
	waitFor(t, "all namespaces published", func() bool { _, ok := labels(in); return ok })
}

func TestKubeMeshConfigMap(t *testing.T) {
	e := newKenv(t, sharedKube(t))
	e.setMesh("trustDomain: one.example\n")
	in := e.start("pod-0", nil)
	rec := in.rec
	trust := func() string {
		if m, ok := rec.body(schema.MeshConfig, "mesh").(*meshv1alpha1.MeshConfig); ok {
			return m.GetTrustDomain()
		}
		return ""
	}
	if got := trust(); got != "one.example" {
		t.Fatalf("trust domain %q", got)
	}
	if m := rec.body(schema.MeshConfig, "mesh").(*meshv1alpha1.MeshConfig); m.GetDefaultConfig().GetProxyAdminPort() != 15000 {
		t.Error("defaults not applied under the ConfigMap's mesh config")
	}

	e.setMesh("trustDomain: two.example\n")
	waitFor(t, "changed mesh config", func() bool { return trust() == "two.example" })

	e.setMesh("trustDomain: three.example\nnotAField: 1\n")
	waitFor(t, "mesh ConfigMap problem", func() bool {
		for _, p := range in.svc.Problems() {
			if errors.Is(p, configingest.ErrMeshConfigMap) && strings.Contains(p.Error(), e.cp+"/istio") &&
				strings.Contains(p.Error(), "notAField") {
				return true
			}
		}
		return false
	})
	if got := trust(); got != "two.example" {
		t.Errorf("broken mesh config replaced the last good one: trust domain %q", got)
	}

	e.setMesh("trustDomain: four.example\n")
	waitFor(t, "fixed mesh config", func() bool {
		return trust() == "four.example" && !slices.ContainsFunc(in.svc.Problems(), func(err error) bool { return errors.Is(err, configingest.ErrMeshConfigMap) })
	})
}

// TestKubeMeshNetworks: the istio ConfigMap's meshNetworks key is published as MeshNetworks; a
// broken one is reported, naming the key and field, and the last good one kept; removing the
// key removes it.
func TestKubeMeshNetworks(t *testing.T) {
	e := newKenv(t, sharedKube(t))
	e.setMeshData(map[string]string{"mesh": "", "meshNetworks": "networks:\n  net2:\n    endpoints: [{fromRegistry: cluster2}]\n    gateways: [{address: 198.18.2.1, port: 15443}]\n"})
	in := e.start("pod-0", nil)
	rec := in.rec
	registry := func() string {
		if m, ok := rec.body(schema.MeshNetworks, "mesh-networks").(*meshv1alpha1.MeshNetworks); ok {
			return m.GetNetworks()["net2"].GetEndpoints()[0].GetFromRegistry()
		}
		return ""
	}
	if got := registry(); got != "cluster2" {
		t.Fatalf("meshNetworks fromRegistry %q, want cluster2", got)
	}

	e.setMeshData(map[string]string{"meshNetworks": "networks:\n  net2:\n    endpoints: [{fromCidr: 10.2.0.0}]\n"})
	waitFor(t, "meshNetworks problem", func() bool {
		for _, p := range in.svc.Problems() {
			if errors.Is(p, configingest.ErrMeshConfigMap) && strings.Contains(p.Error(), `"meshNetworks"`) &&
				strings.Contains(p.Error(), "networks.net2.endpoints[0].fromCidr") {
				return true
			}
		}
		return false
	})
	if got := registry(); got != "cluster2" {
		t.Errorf("broken meshNetworks replaced the last good one: fromRegistry %q", got)
	}

	e.setMeshData(map[string]string{"mesh": ""})
	waitFor(t, "meshNetworks removed", func() bool {
		return rec.get(schema.MeshNetworks, "mesh-networks") == nil &&
			!slices.ContainsFunc(in.svc.Problems(), func(err error) bool { return errors.Is(err, configingest.ErrMeshConfigMap) })
	})
}

func TestKubeStatusLeaderElection(t *testing.T) {
	e := newKenv(t, sharedKube(t))
	ns := e.ns("le", nil)
	a := e.start("pod-a", nil)
	b := e.start("pod-b", nil)
	ins := map[string]*kingest{"pod-a": a, "pod-b": b}

	holder := func() string {
		l, err := e.kube.CoordinationV1().Leases(e.cp).Get(e.ctx(), configingest.StatusLease, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	var leader string
	waitFor(t, "a leader", func() bool {
		leader = holder()
		return leader != "" && ins[leader] != nil && ins[leader].svc.StatusLeader()
	})
	follower := "pod-a"
	if leader == "pod-a" {
		follower = "pod-b"
	}
	if ins[follower].svc.StatusLeader() {
		t.Fatal("both replicas lead")
	}

	e.createVS(ns, "bad1", vsSpec("bad1", -150))
	waitFor(t, "status written by the leader", func() bool { _, msg := e.vsStatus(ns, "bad1"); return msg != "" })
	// Every replica publishes (neither publishes the invalid one).
	e.createVS(ns, "ok", vsSpec("ok", 0))
	for _, in := range ins {
		waitFor(t, "published by every replica", func() bool { return in.rec.get(schema.VirtualService, ns+"/ok") != nil })
	}

	ins[leader].stop()
	waitFor(t, "the follower takes over", func() bool { return holder() == follower && ins[follower].svc.StatusLeader() })
	e.createVS(ns, "bad2", vsSpec("bad2", -150))
	waitFor(t, "status written by the new leader", func() bool { _, msg := e.vsStatus(ns, "bad2"); return msg != "" })
}

func TestKubeAPIServerRestart(t *testing.T) {
	k := testenv.KubeForTest(t)
	e := newKenv(t, k)
	ns := e.ns("rs", nil)
	e.createVS(ns, "one", vsSpec("one", 0))
	e.createVS(ns, "two", vsSpec("two", 0))
	// Counts config-ingest's requests that got no answer.
	var failed atomic.Int64
	in := e.start("pod-0", func(c *configingest.Config) {
		c.Kube.Wrap(func(rt http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(r *http.Request) (*http.Response, error) {
				resp, err := rt.RoundTrip(r)
				if err != nil {
					failed.Add(1)
				}
				return resp, err
			})
		})
	})
	rec := in.rec
	replaced, deletes := rec.calls()

	k.StopAPIServer()
	// Down "for a while": until config-ingest reports it, then a few more failed retries.
	kubeProblem := func() bool {
		return slices.ContainsFunc(in.svc.Problems(), func(err error) bool { return errors.Is(err, configingest.ErrKubernetes) })
	}
	waitFor(t, "API server problem reported", kubeProblem)
	waitFor(t, "failed watches counted", func() bool {
		return in.metrics.Value("sailplane_kube_watch_errors_total", "resource", "virtualservices") > 0
	})
	seen := failed.Load()
	waitFor(t, "failed retries", func() bool { return failed.Load() >= seen+5 })
	if r, d := rec.calls(); r != replaced || d != deletes {
		t.Fatalf("published state dropped while the API server was down: replaces %d->%d, deletes %d->%d", replaced, r, deletes, d)
	}
	if err := k.StartAPIServer(e.ctx()); err != nil {
		t.Fatal(err)
	}

	// The informers are restarted as soon as a probe gets an answer, instead of waiting out
	// client-go's backoff (up to a minute after an outage this long): changes arrive within a
	// second or two of the API server's return, and never later than this.
	restarted := time.Now()
	e.createVS(ns, "three", vsSpec("three", 0))
	e.updateVS(ns, "one", vsSpec("one-v2", 0))
	waitWithin(t, "changes after restart", afterOutage, func() bool {
		return rec.get(schema.VirtualService, ns+"/three") != nil &&
			proto.Equal(rec.body(schema.VirtualService, ns+"/one"), vsSpec("one-v2", 0))
	})
	t.Logf("changes made after the API server returned were published in %v", time.Since(restarted).Round(time.Millisecond))
	if rec.get(schema.VirtualService, ns+"/two") == nil {
		t.Error("unchanged VirtualService lost over the restart")
	}
	if r, d := rec.calls(); r != replaced || d != deletes {
		t.Errorf("published state dropped over the restart: replaces %d->%d, deletes %d->%d", replaced, r, deletes, d)
	}
	waitFor(t, "API server problem cleared", func() bool { return !kubeProblem() })
	if n := in.logs.Count("API server reachable again, resynced in"); n != 1 {
		t.Errorf("the recovery was logged %d times, want once", n)
	}
}

func TestKubeMeshFile(t *testing.T) {
	e := newKenv(t, sharedKube(t))
	e.setMesh("trustDomain: configmap.example\n")
	path := filepath.Join(t.TempDir(), "mesh.yaml")
	write(t, path, "trustDomain: file.example\n")
	in := e.start("pod-0", func(c *configingest.Config) { c.MeshFile = path; c.Debounce = 20 * time.Millisecond })
	trust := func() string {
		m, _ := in.rec.body(schema.MeshConfig, "mesh").(*meshv1alpha1.MeshConfig)
		return m.GetTrustDomain()
	}
	if got := trust(); got != "file.example" {
		t.Fatalf("trust domain %q, want the file's", got)
	}
	write(t, path, "trustDomain: file2.example\n")
	waitFor(t, "mesh file change", func() bool { return trust() == "file2.example" })
}

// TestKubeMeshNetworksFile: with a mesh file, meshNetworks come from the "meshNetworks" file
// beside it (as the istio ConfigMap mounts), published at start and on every change.
func TestKubeMeshNetworksFile(t *testing.T) {
	e := newKenv(t, sharedKube(t))
	dir := t.TempDir()
	path := filepath.Join(dir, "mesh")
	write(t, path, "{}\n")
	nets := filepath.Join(dir, "meshNetworks")
	write(t, nets, "networks: {net2: {endpoints: [{fromRegistry: cluster2}]}}\n")
	in := e.start("pod-0", func(c *configingest.Config) { c.MeshFile = path; c.Debounce = 20 * time.Millisecond })
	registry := func() string {
		m, _ := in.rec.body(schema.MeshNetworks, "mesh-networks").(*meshv1alpha1.MeshNetworks)
		return m.GetNetworks()["net2"].GetEndpoints()[0].GetFromRegistry()
	}
	if got := registry(); got != "cluster2" {
		t.Fatalf("fromRegistry %q at start, want cluster2", got)
	}
	write(t, nets, "networks: {net2: {endpoints: [{fromRegistry: cluster3}]}}\n")
	waitFor(t, "meshNetworks file change", func() bool { return registry() == "cluster3" })
	write(t, nets, "networks: {net2: {gateways: [{address: 198.18.0.1}]}}\n")
	waitFor(t, "meshNetworks file problem", func() bool {
		return slices.ContainsFunc(in.svc.Problems(), func(err error) bool {
			return strings.Contains(err.Error(), nets) && strings.Contains(err.Error(), "networks.net2.gateways[0].port")
		})
	})
	if got := registry(); got != "cluster3" {
		t.Errorf("broken meshNetworks file replaced the last good one: %q", got)
	}
}

func TestResolveSource(t *testing.T) {
	k := sharedKube(t)
	// No cluster around: no in-cluster environment, $KUBECONFIG or ~/.kube/config.
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBECONFIG", "")
	t.Setenv("HOME", t.TempDir())
	for _, c := range []struct {
		mode, kubeconfig string
		wantKube         bool
		wantErr          error
		wantDesc         string
	}{
		{mode: "files", kubeconfig: k.KubeconfigPath(), wantDesc: "files"},
		{mode: "auto", wantDesc: "files (no Kubernetes cluster found)"},
		{mode: "", wantDesc: "files (no Kubernetes cluster found)"},
		{mode: "auto", kubeconfig: k.KubeconfigPath(), wantKube: true, wantDesc: k.KubeconfigPath()},
		{mode: "kubernetes", kubeconfig: k.KubeconfigPath(), wantKube: true, wantDesc: "kubernetes"},
		{mode: "kubernetes", wantErr: kube.ErrNoCluster},
		{mode: "consul", wantErr: configingest.ErrSourceMode},
	} {
		t.Run(c.mode+"/"+filepath.Base(c.kubeconfig), func(t *testing.T) {
			cfg, desc, err := configingest.ResolveSource(c.mode, c.kubeconfig)
			if c.wantErr != nil {
				if !errors.Is(err, c.wantErr) {
					t.Fatalf("error %v, want %v", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (cfg != nil) != c.wantKube || !strings.Contains(desc, c.wantDesc) {
				t.Errorf("got %v %q, want kube %v, %q", cfg != nil, desc, c.wantKube, c.wantDesc)
			}
		})
	}
	// A missing explicit kubeconfig is an error, not a fallback to files.
	if _, _, err := configingest.ResolveSource("auto", filepath.Join(t.TempDir(), "none")); err == nil {
		t.Error("missing explicit kubeconfig accepted")
	}
}
