package gatewaystatus

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"sailplane.dev/shared/gatewayapi"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/telemetry/telemetrytest"
	"sailplane.dev/shared/testlog"
	"sailplane.dev/shared/testwait"
	"sailplane.dev/tools/testenv"
)

const waitTimeout = 30 * time.Second

var sharedKube struct {
	once sync.Once
	kube *testenv.Kube
	err  error
}

// kubeWithGatewayAPI is one API server for this package's tests, with the Gateway API CRDs;
// tests keep apart by namespace and by the GatewayClass they create.
func kubeWithGatewayAPI(t testing.TB) *testenv.Kube {
	t.Helper()
	sharedKube.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		sharedKube.kube, sharedKube.err = testenv.StartKube(ctx, testenv.WithLogger(slog.New(slog.DiscardHandler)), testenv.WithGatewayAPICRDs())
	})
	if sharedKube.err != nil {
		t.Fatal(sharedKube.err)
	}
	return sharedKube.kube
}

func TestMain(m *testing.M) {
	code := m.Run()
	if sharedKube.kube != nil && sharedKube.err == nil {
		sharedKube.kube.Stop()
	}
	if code == 0 {
		// klog starts its flush daemon in init; client-go imports klog.
		if err := goleak.Find(goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// fakeTranslate is a small stand-in for gatewayapi.Translate: it accepts the classes naming
// ours, their Gateways, and the routes' parentRefs to those Gateways, with ResolvedRefs from
// the Services it is given; message is appended to every Accepted condition's message (to
// tell two writers apart).
func fakeTranslate(message string) func(gatewayapi.Input) gatewayapi.Output {
	return func(in gatewayapi.Input) gatewayapi.Output {
		var out gatewayapi.Output
		classes := map[string]bool{}
		for _, c := range in.GatewayClasses {
			if !Ours(c.Spec.ControllerName) {
				continue
			}
			classes[c.Name] = true
			out.Status = append(out.Status, gatewayapi.Status{Kind: schema.GatewayClass, Name: c.Name, Generation: c.Generation,
				Value: &gwv1.GatewayClassStatus{Conditions: []metav1.Condition{
					{Type: "Accepted", Status: "True", Reason: "Accepted", Message: "Handled by Sailplane" + message, ObservedGeneration: c.Generation}}}})
		}
		gateways := map[types.NamespacedName]bool{}
		for _, g := range in.Gateways {
			if !classes[string(g.Spec.GatewayClassName)] {
				continue
			}
			gateways[types.NamespacedName{Namespace: g.Namespace, Name: g.Name}] = true
			st := &gwv1.GatewayStatus{Conditions: []metav1.Condition{
				{Type: "Accepted", Status: "True", Reason: "Accepted", Message: "ok" + message, ObservedGeneration: g.Generation},
				{Type: "Programmed", Status: "True", Reason: "Programmed", ObservedGeneration: g.Generation}}}
			for _, l := range g.Spec.Listeners {
				st.Listeners = append(st.Listeners, gwv1.ListenerStatus{Name: l.Name, SupportedKinds: []gwv1.RouteGroupKind{{Kind: "HTTPRoute"}},
					Conditions: []metav1.Condition{{Type: "Accepted", Status: "True", Reason: "Accepted", ObservedGeneration: g.Generation}}})
			}
			out.Status = append(out.Status, gatewayapi.Status{Kind: schema.KubernetesGateway, Namespace: g.Namespace, Name: g.Name, Generation: g.Generation, Value: st})
		}
		for _, r := range in.HTTPRoutes {
			st := &gwv1.HTTPRouteStatus{}
			for _, p := range r.Spec.ParentRefs {
				ns := r.Namespace
				if p.Namespace != nil {
					ns = string(*p.Namespace)
				}
				if !gateways[types.NamespacedName{Namespace: ns, Name: string(p.Name)}] {
					continue
				}
				resolved := metav1.Condition{Type: "ResolvedRefs", Status: "True", Reason: "ResolvedRefs", ObservedGeneration: r.Generation}
				for _, rule := range r.Spec.Rules {
					for _, b := range rule.BackendRefs {
						if _, ok := in.Services.Service(string(b.Name)+"."+r.Namespace+".svc."+in.DomainSuffix, r.Namespace); !ok {
							resolved.Status, resolved.Reason, resolved.Message = "False", "BackendNotFound", "backend "+string(b.Name)+" not found"
						}
					}
				}
				st.Parents = append(st.Parents, gwv1.RouteParentStatus{ParentRef: p, ControllerName: gatewayapi.ControllerName, Conditions: []metav1.Condition{
					{Type: "Accepted", Status: "True", Reason: "Accepted", Message: "ok" + message, ObservedGeneration: r.Generation}, resolved}})
			}
			if len(st.Parents) > 0 {
				out.Status = append(out.Status, gatewayapi.Status{Kind: schema.HTTPRoute, Namespace: r.Namespace, Name: r.Name, Generation: r.Generation, Value: st})
			}
		}
		return out
	}
}

// env is one test's namespace, class, clients, and a count of the status writes (PUT …/status)
// each writer sends.
type env struct {
	t     testing.TB
	k     *testenv.Kube
	kube  kubernetes.Interface
	gw    gwclient.Interface
	ns    string
	class string
}

func newEnv(t testing.TB) *env {
	t.Helper()
	k := kubeWithGatewayAPI(t)
	e := &env{t: t, k: k}
	var err error
	if e.kube, err = kubernetes.NewForConfig(k.RestConfig()); err != nil {
		t.Fatal(err)
	}
	if e.gw, err = gwclient.NewForConfig(k.RestConfig()); err != nil {
		t.Fatal(err)
	}
	id := strings.ToLower(rand.Text()[:6])
	e.ns, e.class = "gw-"+id, "sailplane-"+id
	if _, err := e.kube.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.gw.GatewayV1().GatewayClasses().Create(t.Context(), &gwv1.GatewayClass{
		ObjectMeta: metav1.ObjectMeta{Name: e.class},
		Spec:       gwv1.GatewayClassSpec{ControllerName: gatewayapi.ControllerName},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = e.gw.GatewayV1().GatewayClasses().Delete(ctx, e.class, metav1.DeleteOptions{})
		_ = e.kube.CoreV1().Namespaces().Delete(ctx, e.ns, metav1.DeleteOptions{})
	})
	return e
}

// writer is one running Writer and what it sent.
type writer struct {
	*Writer
	leading atomic.Bool
	metrics *telemetrytest.Metrics
	mu      sync.Mutex
	puts    map[string]int // status PUTs by object: namespace/name, or name if cluster-scoped
}

// putsOf counts the status writes of the object named name in the test's namespace, or of
// the cluster-scoped one when there is none there.
func (w *writer) putsOf(e *env, name string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.puts[e.ns+"/"+name] + w.puts[name]
}

// SetLeader makes the writer lead or follow, as the Lease would.
func (w *writer) SetLeader(leading bool) {
	if !w.leading.Swap(leading) && leading {
		w.Elected()
	}
}

func (w *writer) allPuts() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, c := range w.puts {
		n += c
	}
	return n
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// start runs a Writer until the test ends; wrap, when set, sees each status PUT first.
func (e *env) start(cfg Config, leader bool, wrap func(req *http.Request, next http.RoundTripper) (*http.Response, error)) *writer {
	e.t.Helper()
	w := &writer{metrics: telemetrytest.New(e.t), puts: map[string]int{}}
	rc := rest.CopyConfig(e.k.RestConfig())
	rc.Wrap(func(next http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if req.Method == http.MethodPut && strings.HasSuffix(req.URL.Path, "/status") {
				parts := strings.Split(req.URL.Path, "/")
				obj := parts[len(parts)-2]
				if len(parts) > 6 && parts[len(parts)-5] == "namespaces" {
					obj = parts[len(parts)-4] + "/" + obj
				}
				w.mu.Lock()
				w.puts[obj]++
				w.mu.Unlock()
				if wrap != nil {
					return wrap(req, next)
				}
			}
			return next.RoundTrip(req)
		})
	})
	cfg.Logger = testlog.New(e.t, slog.LevelDebug)
	cfg.MeterProvider = w.metrics.Provider()
	cfg.Leader = w.leading.Load
	var err error
	if w.Writer, err = New(rc, cfg); err != nil {
		e.t.Fatal(err)
	}
	w.SetLeader(leader)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Error(err)
		}
	})
	return w
}

func (e *env) gateway(name string) {
	e.t.Helper()
	_, err := e.gw.GatewayV1().Gateways(e.ns).Create(e.t.Context(), &gwv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: gwv1.GatewaySpec{GatewayClassName: gwv1.ObjectName(e.class),
			Listeners: []gwv1.Listener{{Name: "http", Port: 80, Protocol: gwv1.HTTPProtocolType}}},
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
}

func routeSpec(gateway, backend string, path string) gwv1.HTTPRouteSpec {
	port := gwv1.PortNumber(80)
	return gwv1.HTTPRouteSpec{
		CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{{Name: gwv1.ObjectName(gateway)}}},
		Rules: []gwv1.HTTPRouteRule{{
			Matches:     []gwv1.HTTPRouteMatch{{Path: &gwv1.HTTPPathMatch{Value: &path}}},
			BackendRefs: []gwv1.HTTPBackendRef{{BackendRef: gwv1.BackendRef{BackendObjectReference: gwv1.BackendObjectReference{Name: gwv1.ObjectName(backend), Port: &port}}}},
		}},
	}
}

func (e *env) route(name string, labels map[string]string, spec gwv1.HTTPRouteSpec) *gwv1.HTTPRoute {
	e.t.Helper()
	r, err := e.gw.GatewayV1().HTTPRoutes(e.ns).Create(e.t.Context(), &gwv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: spec,
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

func (e *env) getRoute(name string) *gwv1.HTTPRoute {
	e.t.Helper()
	r, err := e.gw.GatewayV1().HTTPRoutes(e.ns).Get(e.t.Context(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

// editRoute changes a route's spec (a new generation), retrying on conflict.
func (e *env) editRoute(name string, edit func(*gwv1.HTTPRoute)) *gwv1.HTTPRoute {
	e.t.Helper()
	for {
		r := e.getRoute(name)
		edit(r)
		out, err := e.gw.GatewayV1().HTTPRoutes(e.ns).Update(e.t.Context(), r, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			e.t.Fatal(err)
		}
		return out
	}
}

// ourParent is the route's parent entry of our controller, if any.
func ourParent(r *gwv1.HTTPRoute) (gwv1.RouteParentStatus, bool) {
	for _, p := range r.Status.Parents {
		if p.ControllerName == gatewayapi.ControllerName {
			return p, true
		}
	}
	return gwv1.RouteParentStatus{}, false
}

func condOf(p gwv1.RouteParentStatus, typ string) metav1.Condition {
	c, _ := findCondition(p.Conditions, typ)
	return c
}

// waitRoute waits until the route's status of ours satisfies ok.
func (e *env) waitRoute(name, what string, ok func(gwv1.RouteParentStatus) bool) *gwv1.HTTPRoute {
	e.t.Helper()
	var r *gwv1.HTTPRoute
	testwait.Until(e.t, waitTimeout, "HTTPRoute "+name+": "+what, func() bool {
		r = e.getRoute(name)
		p, found := ourParent(r)
		return found && ok(p)
	})
	return r
}

func TestWriterStatus(t *testing.T) {
	e := newEnv(t)
	w := e.start(Config{Translate: fakeTranslate("")}, true, nil)
	e.gateway("gw")
	e.route("web", nil, routeSpec("gw", "backend", "/"))

	e.waitRoute("web", "accepted, backend not found", func(p gwv1.RouteParentStatus) bool {
		a, r := condOf(p, "Accepted"), condOf(p, "ResolvedRefs")
		return a.Status == "True" && r.Status == "False" && r.Reason == "BackendNotFound" && a.ObservedGeneration == 1 && !a.LastTransitionTime.IsZero()
	})
	testwait.Until(t, waitTimeout, "Gateway and GatewayClass status", func() bool {
		g, err := e.gw.GatewayV1().Gateways(e.ns).Get(t.Context(), "gw", metav1.GetOptions{})
		if err != nil || len(g.Status.Listeners) != 1 {
			return false
		}
		c, err := e.gw.GatewayV1().GatewayClasses().Get(t.Context(), e.class, metav1.GetOptions{})
		return err == nil && len(c.Status.Conditions) == 1 && c.Status.Conditions[0].Message == "Handled by Sailplane"
	})

	// The Service appears: Translate's input has it, the route's refs resolve.
	if _, err := e.kube.CoreV1().Services(e.ns).Create(t.Context(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "backend"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitRoute("web", "backend resolved", func(p gwv1.RouteParentStatus) bool { return condOf(p, "ResolvedRefs").Status == "True" })
	w.metrics.WaitValue(2, "sailplane_gateway_status_writes_total", "kind", "HTTPRoute", "result", "written")
	if n := w.putsOf(e, "web"); n != 2 {
		t.Errorf("HTTPRoute written %d times, want 2 (one per status change)", n)
	}
}

// A burst of N changes to a route becomes one status write.
func TestWriterCoalescesBurst(t *testing.T) {
	e := newEnv(t)
	// Long enough a quiet period that the burst, on a loaded machine, is one batch.
	w := e.start(Config{Translate: fakeTranslate(""), Debounce: 2 * time.Second, MaxDelay: time.Minute}, true, nil)
	e.gateway("gw")
	e.route("web", nil, routeSpec("gw", "backend", "/"))
	e.waitRoute("web", "generation 1", func(p gwv1.RouteParentStatus) bool { return condOf(p, "Accepted").ObservedGeneration == 1 })
	before := w.putsOf(e, "web")

	const burst = 20
	var last *gwv1.HTTPRoute
	for i := range burst {
		last = e.editRoute("web", func(r *gwv1.HTTPRoute) { *r.Spec.Rules[0].Matches[0].Path.Value = fmt.Sprintf("/v%d", i) })
	}
	e.waitRoute("web", "the burst's last generation", func(p gwv1.RouteParentStatus) bool {
		return condOf(p, "Accepted").ObservedGeneration == last.Generation
	})
	if n := w.putsOf(e, "web") - before; n != 1 {
		t.Errorf("a burst of %d changes wrote the status %d times, want 1", burst, n)
	}
}

// A status already carried is not written again: by a new leader (after a failover or a
// restart), nor after changes that leave the status as it is; transition times are kept.
func TestWriterNoRewriteAndTransitionTime(t *testing.T) {
	e := newEnv(t)
	var clock atomic.Pointer[time.Time]
	first := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	clock.Store(&first)
	now := func() time.Time { return *clock.Load() }
	w := e.start(Config{Translate: fakeTranslate(""), Now: now}, true, nil)
	e.gateway("gw")
	e.route("web", nil, routeSpec("gw", "backend", "/"))
	r := e.waitRoute("web", "written", func(p gwv1.RouteParentStatus) bool { return condOf(p, "Accepted").ObservedGeneration == 1 })
	rv := r.ResourceVersion
	if got := condOf(mustOurs(t, r), "Accepted").LastTransitionTime.Time; !got.Equal(first) {
		t.Fatalf("lastTransitionTime %v, want the writer's clock %v", got, first)
	}
	// Let every object's first write land before counting.
	testwait.For(t, waitTimeout, "GatewayClass, Gateway and HTTPRoute written once", func() error {
		if w.putsOf(e, e.class) == 1 && w.putsOf(e, "gw") == 1 && w.putsOf(e, "web") == 1 {
			return nil
		}
		return fmt.Errorf("writes: class %d, gateway %d, route %d", w.putsOf(e, e.class), w.putsOf(e, "gw"), w.putsOf(e, "web"))
	})

	// A second replica taking over, and this one stepping down and up again, check every
	// object and write none.
	skipped := func(w *writer) float64 {
		return w.metrics.Value("sailplane_gateway_status_writes_total", "kind", "HTTPRoute", "result", "skipped")
	}
	checked := func(w *writer, base float64, what string) {
		t.Helper()
		testwait.Until(t, waitTimeout, what, func() bool { return skipped(w) > base })
	}
	w2 := e.start(Config{Translate: fakeTranslate(""), Now: now}, true, nil)
	checked(w2, 0, "the new leader checked the routes")
	base := skipped(w)
	w.SetLeader(false)
	w.SetLeader(true)
	checked(w, base, "the re-elected leader checked the routes")
	// A label change recomputes the status, the same.
	base = skipped(w)
	e.editRoute("web", func(r *gwv1.HTTPRoute) { r.Labels = map[string]string{"touched": "yes"} })
	checked(w, base, "the relabelled route checked")
	if n := w2.putsOf(e, e.class) + w2.putsOf(e, "gw") + w2.putsOf(e, "web"); n != 0 {
		t.Errorf("the second writer wrote %d statuses, all already carried", n)
	}
	if got := e.getRoute("web"); got.Status.Parents[0].Conditions[0].ObservedGeneration != 1 || w.putsOf(e, "web") != 1 {
		t.Errorf("the route's status was rewritten (%d writes, resourceVersion %s → %s)", w.putsOf(e, "web"), rv, got.ResourceVersion)
	}
	w2.SetLeader(false)

	// A new generation: observedGeneration changes, Accepted's transition time stays, and the
	// condition that changed (the backend now resolves) takes the new time.
	later := first.Add(time.Hour)
	clock.Store(&later)
	if _, err := e.kube.CoreV1().Services(e.ns).Create(t.Context(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "backend"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.editRoute("web", func(r *gwv1.HTTPRoute) { *r.Spec.Rules[0].Matches[0].Path.Value = "/v2" })
	r = e.waitRoute("web", "generation 2, resolved", func(p gwv1.RouteParentStatus) bool {
		return condOf(p, "Accepted").ObservedGeneration == 2 && condOf(p, "ResolvedRefs").Status == "True"
	})
	p := mustOurs(t, r)
	if got := condOf(p, "Accepted").LastTransitionTime.Time; !got.Equal(first) {
		t.Errorf("Accepted's lastTransitionTime %v, want it kept at %v", got, first)
	}
	if got := condOf(p, "ResolvedRefs").LastTransitionTime.Time; !got.Equal(later) {
		t.Errorf("ResolvedRefs's lastTransitionTime %v, want the transition's %v", got, later)
	}
}

func mustOurs(t *testing.T, r *gwv1.HTTPRoute) gwv1.RouteParentStatus {
	t.Helper()
	p, ok := ourParent(r)
	if !ok {
		t.Fatalf("HTTPRoute %s has no parent of ours: %+v", r.Name, r.Status)
	}
	return p
}

// Other controllers' parents stay; ours for a parent no longer referenced goes.
func TestWriterKeepsOtherControllers(t *testing.T) {
	e := newEnv(t)
	e.gateway("gw")
	r := e.route("web", nil, routeSpec("gw", "backend", "/"))
	other := gwv1.RouteParentStatus{ParentRef: gwv1.ParentReference{Name: "theirs"}, ControllerName: "example.com/other",
		Conditions: []metav1.Condition{{Type: "Accepted", Status: "True", Reason: "Accepted", ObservedGeneration: 1, LastTransitionTime: metav1.NewTime(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))}}}
	stale := gwv1.RouteParentStatus{ParentRef: gwv1.ParentReference{Name: "gone"}, ControllerName: gatewayapi.ControllerName,
		Conditions: []metav1.Condition{{Type: "Accepted", Status: "True", Reason: "Accepted", ObservedGeneration: 1, LastTransitionTime: metav1.Now()}}}
	r.Status.Parents = []gwv1.RouteParentStatus{other, stale}
	if _, err := e.gw.GatewayV1().HTTPRoutes(e.ns).UpdateStatus(t.Context(), r, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	e.start(Config{Translate: fakeTranslate("")}, true, nil)
	testwait.For(t, waitTimeout, "ours replaced, theirs kept", func() error {
		got := e.getRoute("web").Status.Parents
		if len(got) == 2 && sameEntry(got[0], other) && got[1].ParentRef.Name == "gw" && got[1].ControllerName == gatewayapi.ControllerName {
			return nil
		}
		return fmt.Errorf("parents %+v", got)
	})

	// The route stops referencing our Gateway: our entry goes, theirs stays.
	e.editRoute("web", func(r *gwv1.HTTPRoute) { r.Spec.ParentRefs = []gwv1.ParentReference{{Name: "theirs"}} })
	testwait.Until(t, waitTimeout, "ours removed, theirs kept", func() bool {
		got := e.getRoute("web").Status.Parents
		return len(got) == 1 && sameEntry(got[0], other)
	})
}

// sameEntry compares route parent entries but for the defaults the API server fills in.
func sameEntry(a, b gwv1.RouteParentStatus) bool {
	return SameParent(a.ParentRef, b.ParentRef, "") && a.ControllerName == b.ControllerName && Equal(a.Conditions, b.Conditions)
}

// A replica that is not the leader never writes, even when it would write something else;
// once it leads, it does.
func TestWriterNonLeaderNeverWrites(t *testing.T) {
	e := newEnv(t)
	leader := e.start(Config{Translate: fakeTranslate("")}, true, nil)
	follower := e.start(Config{Translate: fakeTranslate(" (follower)")}, false, nil)
	e.gateway("gw")
	for i := range 5 {
		e.route(fmt.Sprintf("web-%d", i), nil, routeSpec("gw", "backend", "/"))
	}
	for i := range 5 {
		e.waitRoute(fmt.Sprintf("web-%d", i), "the leader's status", func(p gwv1.RouteParentStatus) bool { return condOf(p, "Accepted").Message == "ok" })
	}
	e.editRoute("web-0", func(r *gwv1.HTTPRoute) { *r.Spec.Rules[0].Matches[0].Path.Value = "/v2" })
	e.waitRoute("web-0", "the leader's status of generation 2", func(p gwv1.RouteParentStatus) bool {
		return condOf(p, "Accepted").ObservedGeneration == 2 && condOf(p, "Accepted").Message == "ok"
	})
	// The follower saw everything (its computed status has the routes) and wrote nothing.
	testwait.Until(t, waitTimeout, "the follower computed generation 2", func() bool {
		for _, s := range follower.Statuses() {
			if s.Name == "web-0" {
				return s.Status.(*gwv1.HTTPRouteStatus).Parents[0].Conditions[0].ObservedGeneration == 2
			}
		}
		return false
	})
	if n := follower.allPuts(); n != 0 {
		t.Fatalf("the follower wrote %d statuses", n)
	}
	if v := follower.metrics.Value("sailplane_gateway_status_writes_total", "result", "written"); v != 0 {
		t.Fatalf("the follower counted %v writes", v)
	}

	// Hand over: the new leader writes its own status.
	leader.SetLeader(false)
	follower.SetLeader(true)
	e.waitRoute("web-3", "the new leader's status", func(p gwv1.RouteParentStatus) bool { return condOf(p, "Accepted").Message == "ok (follower)" })
}

// A write on a stale resourceVersion (someone changed the object meanwhile) is a conflict,
// retried from a fresh read.
func TestWriterRetriesConflict(t *testing.T) {
	e := newEnv(t)
	e.gateway("gw")
	e.route("web", nil, routeSpec("gw", "backend", "/"))
	var conflicts atomic.Int32
	var once sync.Once
	e.start(Config{Translate: fakeTranslate("")}, true, func(req *http.Request, next http.RoundTripper) (*http.Response, error) {
		if strings.Contains(req.URL.Path, "/httproutes/web/") {
			// Change the route between the writer's read and its write.
			once.Do(func() {
				r := e.getRoute("web")
				r.Labels = map[string]string{"changed": "meanwhile"}
				if _, err := e.gw.GatewayV1().HTTPRoutes(e.ns).Update(context.Background(), r, metav1.UpdateOptions{}); err != nil {
					e.t.Error(err)
				}
			})
		}
		resp, err := next.RoundTrip(req)
		if err == nil && resp.StatusCode == http.StatusConflict {
			conflicts.Add(1)
		}
		return resp, err
	})
	r := e.waitRoute("web", "written", func(p gwv1.RouteParentStatus) bool { return condOf(p, "Accepted").Status == "True" })
	if conflicts.Load() == 0 {
		t.Error("no write met a conflict: the test did not test")
	}
	if r.Labels["changed"] != "meanwhile" {
		t.Errorf("the concurrent change was lost: labels %v", r.Labels)
	}
}

// Objects of another revision (labelled istio.io/rev, or in a namespace so labelled) are left
// to it.
func TestWriterRevision(t *testing.T) {
	e := newEnv(t)
	e.gateway("gw")
	e.route("canary-route", map[string]string{RevisionLabel: "canary"}, routeSpec("gw", "backend", "/"))
	e.route("default-route", nil, routeSpec("gw", "backend", "/"))
	def := e.start(Config{Translate: fakeTranslate("")}, true, nil)
	canary := e.start(Config{Translate: fakeTranslate(" (canary)"), Revision: "canary"}, true, nil)
	e.waitRoute("default-route", "the default revision's status", func(p gwv1.RouteParentStatus) bool { return condOf(p, "Accepted").Message == "ok" })
	e.waitRoute("canary-route", "the canary revision's status", func(p gwv1.RouteParentStatus) bool {
		return condOf(p, "Accepted").Message == "ok (canary)"
	})
	if def.putsOf(e, "canary-route") != 0 || canary.putsOf(e, "default-route") != 0 {
		t.Errorf("a revision wrote another's route: default wrote canary-route %d times, canary wrote default-route %d times",
			def.putsOf(e, "canary-route"), canary.putsOf(e, "default-route"))
	}
	// A namespace labelled for the canary makes its unlabelled objects the canary's.
	if _, err := e.kube.CoreV1().Namespaces().Patch(t.Context(), e.ns, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"istio.io/rev":"canary"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	e.route("late-route", nil, routeSpec("gw", "backend", "/"))
	e.waitRoute("late-route", "the canary revision's status", func(p gwv1.RouteParentStatus) bool {
		return condOf(p, "Accepted").Message == "ok (canary)"
	})
	if def.putsOf(e, "late-route") != 0 {
		t.Errorf("the default revision wrote a route of the canary's namespace")
	}
}

// TestWriterRecreated: a route deleted and made again with the same spec, within one
// recomputation, gets its status (the wanted status did not change; the object did).
func TestWriterRecreated(t *testing.T) {
	e := newEnv(t)
	e.start(Config{Translate: fakeTranslate(""), Debounce: 2 * time.Second, MaxDelay: time.Minute}, true, nil)
	e.gateway("gw")
	e.route("web", nil, routeSpec("gw", "backend", "/"))
	e.waitRoute("web", "accepted", func(p gwv1.RouteParentStatus) bool { return condOf(p, "Accepted").Status == "True" })
	if err := e.gw.GatewayV1().HTTPRoutes(e.ns).Delete(t.Context(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	again := e.route("web", nil, routeSpec("gw", "backend", "/"))
	e.waitRoute("web", "the new object accepted", func(p gwv1.RouteParentStatus) bool { return condOf(p, "Accepted").Status == "True" })
	if r := e.getRoute("web"); r.UID != again.UID {
		t.Fatalf("route replaced again (uid %s, want %s)", r.UID, again.UID)
	}
}
