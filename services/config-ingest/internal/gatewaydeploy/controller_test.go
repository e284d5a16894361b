package gatewaydeploy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"sailplane.dev/shared/kube"
	"sailplane.dev/shared/testlog"
	"sailplane.dev/shared/testwait"
	"sailplane.dev/tools/testenv"
)

const wait = 30 * time.Second

type env struct {
	t    testing.TB
	rest *rest.Config
	kube kubernetes.Interface
	gw   gwclient.Interface
	dyn  dynamic.Interface
}

// harness is one running Controller, with what it reconciled.
type harness struct {
	c      *Controller
	leader atomic.Bool
	// outside is a namespace out of the mesh until inMesh is set.
	inMesh atomic.Bool
	mu     sync.Mutex
	done   map[types.NamespacedName]int // reconciles, by Gateway
	// applied, when set, is told of each Gateway reconciled without error.
	applied func(types.NamespacedName)
}

func newEnv(t testing.TB) *env {
	k := testenv.KubeForTest(t, testenv.WithGatewayAPICRDs())
	cfg := k.RestConfig()
	e := &env{t: t, rest: cfg, kube: kubernetes.NewForConfigOrDie(cfg), gw: gwclient.NewForConfigOrDie(cfg), dyn: dynamic.NewForConfigOrDie(cfg)}
	for _, ns := range []string{"istio-system"} {
		e.namespace(ns)
	}
	return e
}

func (e *env) namespace(name string) {
	e.t.Helper()
	if _, err := e.kube.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		e.t.Fatal(err)
	}
}

// start runs a Controller until the test ends.
func (e *env) start(leader bool) *harness {
	e.t.Helper()
	h := &harness{done: map[types.NamespacedName]int{}}
	h.leader.Store(leader)
	c, err := New(kube.WithRateLimits(e.rest), Config{Namespace: "istio-system", Leader: h.leader.Load,
		Selected: func(ns string) bool { return ns != "outside" || h.inMesh.Load() }, Logger: testlog.New(e.t, slog.LevelDebug)})
	if err != nil {
		e.t.Fatal(err)
	}
	c.reconciled = func(k types.NamespacedName, err error) {
		if err != nil {
			e.t.Logf("reconcile %s: %v", k, err)
		}
		h.mu.Lock()
		h.done[k]++
		fn := h.applied
		h.mu.Unlock()
		if fn != nil && err == nil {
			fn(k)
		}
	}
	h.c = c
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("Run: %v", err)
		}
	})
	testwait.Until(e.t, wait, "the controller's caches synced", func() bool {
		return !slices.ContainsFunc(c.synced, func(f cache.InformerSynced) bool { return !f() })
	})
	return h
}

func (h *harness) count(ns, name string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.done[types.NamespacedName{Namespace: ns, Name: name}]
}

// settle waits until the Gateway was reconciled after n, and nothing more is queued for it.
func (h *harness) settle(t *testing.T, ns, name string, n int) {
	t.Helper()
	testwait.Until(t, wait, "reconciled "+ns+"/"+name, func() bool { return h.count(ns, name) > n && h.c.queue.Len() == 0 })
}

func gateway(ns, name, class string, ports ...int32) *gwv1.Gateway {
	gw := &gwv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       gwv1.GatewaySpec{GatewayClassName: gwv1.ObjectName(class)},
	}
	for _, p := range ports {
		gw.Spec.Listeners = append(gw.Spec.Listeners, gwv1.Listener{Name: gwv1.SectionName(fmt.Sprintf("http-%d", p)), Port: gwv1.PortNumber(p), Protocol: gwv1.HTTPProtocolType})
	}
	return gw
}

func (e *env) create(gw *gwv1.Gateway) *gwv1.Gateway {
	e.t.Helper()
	got, err := e.gw.GatewayV1().Gateways(gw.Namespace).Create(context.Background(), gw, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return got
}

func (e *env) edit(ns, name string, fn func(*gwv1.Gateway)) {
	e.t.Helper()
	gw, err := e.gw.GatewayV1().Gateways(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	fn(gw)
	if _, err := e.gw.GatewayV1().Gateways(ns).Update(context.Background(), gw, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

var gvrs = map[string]schema.GroupVersionResource{}

func init() {
	for _, k := range kinds {
		gvrs[k.kind] = k.gvr
	}
}

// get returns the object, nil if it does not exist.
func (e *env) get(kind, ns, name string) *unstructured.Unstructured {
	e.t.Helper()
	u, err := e.dyn.Resource(gvrs[kind]).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return u
}

func (e *env) service(ns, name string) *corev1.Service {
	e.t.Helper()
	s, err := e.kube.CoreV1().Services(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

// versions are the resourceVersions of the Gateway's objects that exist, by kind.
func (e *env) versions(ns, name string) map[string]string {
	out := map[string]string{}
	for _, k := range kinds {
		if u := e.get(k.kind, ns, name); u != nil {
			out[k.kind] = u.GetResourceVersion()
		}
	}
	return out
}

func ports(s *corev1.Service) []string {
	var out []string
	for _, p := range s.Spec.Ports {
		out = append(out, fmt.Sprintf("%s/%d/%s", p.Name, p.Port, *p.AppProtocol))
	}
	return out
}

func TestController(t *testing.T) {
	e := newEnv(t)
	h := e.start(true)
	e.namespace("apps")

	t.Run("deploys", func(t *testing.T) {
		gw := e.create(gateway("apps", "web", "istio", 80, 8080))
		testwait.Until(t, wait, "ServiceAccount, Deployment and Service", func() bool {
			return e.get("ServiceAccount", "apps", "web-istio") != nil && e.get("Deployment", "apps", "web-istio") != nil && e.get("Service", "apps", "web-istio") != nil
		})
		for _, kind := range []string{"ServiceAccount", "Deployment", "Service"} {
			u := e.get(kind, "apps", "web-istio")
			refs := u.GetOwnerReferences()
			if len(refs) != 1 || refs[0].UID != gw.UID || refs[0].Kind != "Gateway" || refs[0].APIVersion != "gateway.networking.k8s.io/v1" || refs[0].Name != "web" {
				t.Errorf("%s ownerReferences = %+v, want the Gateway (uid %s)", kind, refs, gw.UID)
			}
			l := u.GetLabels()
			if l[GatewayNameLabel] != "web" || l[GatewayClassLabel] != "istio" || l[ManagedLabel] != ManagedValue {
				t.Errorf("%s labels = %v", kind, l)
			}
			if !slices.ContainsFunc(u.GetManagedFields(), func(m metav1.ManagedFieldsEntry) bool {
				return m.Manager == FieldManager && m.Operation == metav1.ManagedFieldsOperationApply
			}) {
				t.Errorf("%s not applied by %s: %+v", kind, FieldManager, u.GetManagedFields())
			}
		}
		svc := e.service("apps", "web-istio")
		if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
			t.Errorf("Service type %s, want LoadBalancer", svc.Spec.Type)
		}
		if got, want := ports(svc), []string{"status-port/15021/tcp", "http-80/80/http", "http-8080/8080/http"}; !slices.Equal(got, want) {
			t.Errorf("Service ports %v, want %v", got, want)
		}
		dep, err := e.kube.AppsV1().Deployments("apps").Get(context.Background(), "web-istio", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pt := dep.Spec.Template
		if pt.Annotations[InjectTemplatesAnnotation] != "gateway" || pt.Labels[InjectLabel] != "true" || pt.Labels[GatewayNameLabel] != "web" || pt.Spec.ServiceAccountName != "web-istio" {
			t.Errorf("pod template asks for no gateway injection: %+v", pt.ObjectMeta)
		}
		if e.get("HorizontalPodAutoscaler", "apps", "web-istio") != nil || e.get("PodDisruptionBudget", "apps", "web-istio") != nil {
			t.Error("HPA or PDB without a customization asking for them")
		}
	})

	t.Run("idempotent", func(t *testing.T) {
		h.settle(t, "apps", "web", 0)
		before := e.versions("apps", "web-istio")
		n, applies := h.count("apps", "web"), h.c.applies.Load()
		h.c.Elected() // everything re-checked, as after a leader change
		h.settle(t, "apps", "web", n)
		if after := e.versions("apps", "web-istio"); !maps.Equal(before, after) {
			t.Errorf("re-checking wrote: resourceVersions %v, then %v", before, after)
		}
		if got := h.c.applies.Load() - applies; got != 0 {
			t.Errorf("re-checking unchanged objects sent %d apply requests, want none", got)
		}
		// Even applied again (a new leader has no memory of what it applied), the API server
		// sees the same intent: nothing is written.
		h.c.mu.Lock()
		clear(h.c.applied)
		h.c.mu.Unlock()
		n = h.count("apps", "web")
		h.c.Elected()
		h.settle(t, "apps", "web", n)
		if after := e.versions("apps", "web-istio"); !maps.Equal(before, after) {
			t.Errorf("applying the same objects again wrote: resourceVersions %v, then %v", before, after)
		}
	})

	t.Run("edit", func(t *testing.T) {
		e.edit("apps", "web", func(gw *gwv1.Gateway) {
			gw.Spec.Listeners = append(gw.Spec.Listeners, gwv1.Listener{Name: "tls", Port: 8443, Protocol: gwv1.TLSProtocolType, TLS: &gwv1.ListenerTLSConfig{Mode: ptr(gwv1.TLSModePassthrough)}})
			gw.Spec.Infrastructure = &gwv1.GatewayInfrastructure{Labels: map[gwv1.LabelKey]gwv1.LabelValue{"team": "payments"}, Annotations: map[gwv1.AnnotationKey]gwv1.AnnotationValue{"cost-center": "42"}}
			gw.Annotations = map[string]string{ServiceTypeAnnotation: "ClusterIP"}
		})
		testwait.Until(t, wait, "the new port", func() bool { return slices.Contains(ports(e.service("apps", "web-istio")), "tls/8443/tls") })
		testwait.For(t, wait, "infrastructure labels and annotations everywhere", func() error {
			for _, kind := range []string{"ServiceAccount", "Deployment", "Service"} {
				u := e.get(kind, "apps", "web-istio")
				if u.GetLabels()["team"] != "payments" || u.GetAnnotations()["cost-center"] != "42" {
					return fmt.Errorf("%s: labels %v annotations %v", kind, u.GetLabels(), u.GetAnnotations())
				}
			}
			return nil
		})
		if svc := e.service("apps", "web-istio"); svc.Spec.Type != corev1.ServiceTypeClusterIP {
			t.Errorf("Service type %s, want ClusterIP (annotation)", svc.Spec.Type)
		}
		dep, _ := e.kube.AppsV1().Deployments("apps").Get(context.Background(), "web-istio", metav1.GetOptions{})
		if dep.Spec.Template.Labels["team"] != "payments" {
			t.Errorf("pod labels %v lack the infrastructure label", dep.Spec.Template.Labels)
		}
	})

	t.Run("parametersRef", func(t *testing.T) {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "web-options", Namespace: "apps"}, Data: map[string]string{
			KeyDeployment: "spec:\n  replicas: 3\n",
			KeyHPA:        "spec:\n  minReplicas: 2\n  maxReplicas: 4\n",
			KeyPDB:        "spec:\n  minAvailable: 1\n",
		}}
		if _, err := e.kube.CoreV1().ConfigMaps("apps").Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		e.edit("apps", "web", func(gw *gwv1.Gateway) {
			gw.Spec.Infrastructure.ParametersRef = &gwv1.LocalParametersReference{Group: "", Kind: "ConfigMap", Name: "web-options"}
		})
		testwait.Until(t, wait, "HPA, PDB and 3 replicas", func() bool {
			dep, err := e.kube.AppsV1().Deployments("apps").Get(context.Background(), "web-istio", metav1.GetOptions{})
			return err == nil && dep.Spec.Replicas != nil && *dep.Spec.Replicas == 3 &&
				e.get("HorizontalPodAutoscaler", "apps", "web-istio") != nil && e.get("PodDisruptionBudget", "apps", "web-istio") != nil
		})
		// The ConfigMap no longer asks for an HPA: the controller removes it (garbage
		// collection would not: the Gateway still exists).
		cm.Data = map[string]string{KeyDeployment: "spec:\n  replicas: 3\n", KeyPDB: "spec:\n  minAvailable: 1\n"}
		if _, err := e.kube.CoreV1().ConfigMaps("apps").Update(context.Background(), cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		testwait.Until(t, wait, "HPA removed", func() bool { return e.get("HorizontalPodAutoscaler", "apps", "web-istio") == nil })
		if e.get("PodDisruptionBudget", "apps", "web-istio") == nil {
			t.Error("PDB removed too")
		}
		// A bad customization: reported, and what runs is left as it is.
		before := e.versions("apps", "web-istio")
		cm.Data = map[string]string{"deploymnet": "spec: {}\n"}
		if _, err := e.kube.CoreV1().ConfigMaps("apps").Update(context.Background(), cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		testwait.Until(t, wait, "the problem reported", func() bool {
			return errors.Is(h.c.Problem("apps", "web"), ErrInvalidParameters) && strings.Contains(h.c.Problem("apps", "web").Error(), `"deploymnet"`)
		})
		if after := e.versions("apps", "web-istio"); !maps.Equal(before, after) {
			t.Errorf("an invalid customization changed the objects: %v, then %v", before, after)
		}
		if err := e.kube.CoreV1().ConfigMaps("apps").Delete(context.Background(), "web-options", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testwait.Until(t, wait, "the missing ConfigMap reported", func() bool {
			err := h.c.Problem("apps", "web")
			return err != nil && strings.Contains(err.Error(), "ConfigMap apps/web-options not found")
		})
		e.edit("apps", "web", func(gw *gwv1.Gateway) { gw.Spec.Infrastructure.ParametersRef = nil })
		testwait.Until(t, wait, "PDB removed with the parametersRef", func() bool {
			return h.c.Problem("apps", "web") == nil && e.get("PodDisruptionBudget", "apps", "web-istio") == nil
		})
	})

	t.Run("class defaults", func(t *testing.T) {
		// A ConfigMap of the control plane's namespace labelled for the class customizes every
		// Gateway of the class; removed, its objects go.
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "istio-gateway-defaults", Namespace: "istio-system", Labels: map[string]string{ClassDefaultsLabel: "istio"}},
			Data:       map[string]string{KeyPDB: "spec:\n  maxUnavailable: 1\n"},
		}
		if _, err := e.kube.CoreV1().ConfigMaps("istio-system").Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		testwait.Until(t, wait, "the class's PDB", func() bool { return e.get("PodDisruptionBudget", "apps", "web-istio") != nil })
		if err := e.kube.CoreV1().ConfigMaps("istio-system").Delete(context.Background(), cm.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testwait.Until(t, wait, "the class's PDB removed", func() bool { return e.get("PodDisruptionBudget", "apps", "web-istio") == nil })
	})

	t.Run("manual", func(t *testing.T) {
		hostname := gwv1.HostnameAddressType
		gw := gateway("apps", "manual", "istio", 80)
		gw.Spec.Addresses = []gwv1.GatewaySpecAddress{{Type: &hostname, Value: "ingress.istio-system.svc.cluster.local"}}
		n := h.count("apps", "manual")
		e.create(gw)
		h.settle(t, "apps", "manual", n)
		if v := e.versions("apps", "manual-istio"); len(v) != 0 {
			t.Errorf("manual mode deployed %v", v)
		}
		// A deployed Gateway turned manual no longer needs its objects.
		e.edit("apps", "web", func(gw *gwv1.Gateway) {
			gw.Spec.Addresses = []gwv1.GatewaySpecAddress{{Type: &hostname, Value: "ingress.istio-system.svc.cluster.local"}}
		})
		testwait.Until(t, wait, "objects of the Gateway turned manual removed", func() bool { return len(e.versions("apps", "web-istio")) == 0 })
	})

	t.Run("other class", func(t *testing.T) {
		class := &gwv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: "other"}, Spec: gwv1.GatewayClassSpec{ControllerName: "example.com/other"}}
		if _, err := e.gw.GatewayV1().GatewayClasses().Create(context.Background(), class, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		mine := &gwv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: "sailplane"}, Spec: gwv1.GatewayClassSpec{ControllerName: "sailplane.dev/gateway-controller"}}
		if _, err := e.gw.GatewayV1().GatewayClasses().Create(context.Background(), mine, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		n := h.count("apps", "theirs")
		e.create(gateway("apps", "theirs", "other", 80))
		e.create(gateway("apps", "alias", "sailplane", 80))
		testwait.Until(t, wait, "the alias class's Gateway deployed", func() bool { return e.get("Deployment", "apps", "alias-sailplane") != nil })
		h.settle(t, "apps", "theirs", n)
		if v := e.versions("apps", "theirs-other"); len(v) != 0 {
			t.Errorf("another controller's Gateway got %v", v)
		}
	})

	t.Run("user's object left alone", func(t *testing.T) {
		mine := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "taken-istio", Namespace: "apps"}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "mine", Port: 1}}}}
		if _, err := e.kube.CoreV1().Services("apps").Create(context.Background(), mine, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		e.create(gateway("apps", "taken", "istio", 80))
		testwait.Until(t, wait, "the Deployment", func() bool { return e.get("Deployment", "apps", "taken-istio") != nil })
		h.settle(t, "apps", "taken", 0)
		svc := e.service("apps", "taken-istio")
		if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 1 || svc.Labels[ManagedLabel] != "" {
			t.Errorf("the user's Service was changed: %+v", svc)
		}
	})

	t.Run("listenersets", func(t *testing.T) {
		e.namespace("team-a")
		gw := gateway("apps", "shared", "istio", 80)
		sel := gwv1.NamespacesFromSelector
		gw.Spec.AllowedListeners = &gwv1.AllowedListeners{Namespaces: &gwv1.ListenerNamespaces{From: &sel, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"shared-gateway": "yes"}}}}
		e.create(gw)
		ns := gwv1.Namespace("apps")
		ls := &gwv1.ListenerSet{
			ObjectMeta: metav1.ObjectMeta{Name: "team-a", Namespace: "team-a"},
			Spec: gwv1.ListenerSetSpec{ParentRef: gwv1.ParentGatewayReference{Name: "shared", Namespace: &ns},
				Listeners: []gwv1.ListenerEntry{{Name: "pg", Port: 5432, Protocol: gwv1.TCPProtocolType}}},
		}
		if _, err := e.gw.GatewayV1().ListenerSets("team-a").Create(context.Background(), ls, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		testwait.Until(t, wait, "the Gateway's Service", func() bool { return e.get("Service", "apps", "shared-istio") != nil })
		n := h.count("apps", "shared")
		h.c.Elected()
		h.settle(t, "apps", "shared", n)
		if got := ports(e.service("apps", "shared-istio")); slices.Contains(got, "pg/5432/tcp") {
			t.Fatalf("a ListenerSet of a namespace the Gateway does not select added its port: %v", got)
		}
		nsObj, err := e.kube.CoreV1().Namespaces().Get(context.Background(), "team-a", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		nsObj.Labels["shared-gateway"] = "yes"
		if _, err := e.kube.CoreV1().Namespaces().Update(context.Background(), nsObj, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		testwait.Until(t, wait, "the selected namespace's ListenerSet port", func() bool {
			return slices.Contains(ports(e.service("apps", "shared-istio")), "pg/5432/tcp")
		})
		if err := e.gw.GatewayV1().ListenerSets("team-a").Delete(context.Background(), "team-a", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testwait.Until(t, wait, "the deleted ListenerSet's port removed", func() bool {
			return !slices.Contains(ports(e.service("apps", "shared-istio")), "pg/5432/tcp")
		})
	})

	t.Run("deleted", func(t *testing.T) {
		if err := e.gw.GatewayV1().Gateways("apps").Delete(context.Background(), "alias", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testwait.Until(t, wait, "the deleted Gateway's objects removed", func() bool { return len(e.versions("apps", "alias-sailplane")) == 0 })
	})
}

// TestNotLeader: a replica that is not the leader writes nothing; once elected, it deploys.
func TestNotLeader(t *testing.T) {
	e := newEnv(t)
	e.namespace("apps")
	h := e.start(false)
	e.create(gateway("apps", "web", "istio", 80))
	h.settle(t, "apps", "web", 0)
	if v := e.versions("apps", "web-istio"); len(v) != 0 {
		t.Fatalf("a non-leader deployed %v", v)
	}
	h.leader.Store(true)
	h.c.Elected()
	testwait.Until(t, wait, "deployed once elected", func() bool { return len(e.versions("apps", "web-istio")) == 3 })
}

// TestNotSelected: a Gateway of a namespace the discoverySelectors leave out is left alone.
func TestNotSelected(t *testing.T) {
	e := newEnv(t)
	e.namespace("outside")
	h := e.start(true)
	e.create(gateway("outside", "web", "istio", 80))
	h.settle(t, "outside", "web", 0)
	if v := e.versions("outside", "web-istio"); len(v) != 0 {
		t.Fatalf("a Gateway out of the mesh was deployed: %v", v)
	}
	h.inMesh.Store(true)
	h.c.Elected() // as config-ingest's OnSelection does
	testwait.Until(t, wait, "deployed once in the mesh", func() bool { return len(e.versions("outside", "web-istio")) == 3 })
}

// TestReadiness: Programmed needs an address and a ready replica; a LoadBalancer Service
// without an ingress address says so.
func TestReadiness(t *testing.T) {
	gw := gateway("apps", "web", "istio", 80)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web-istio", Namespace: "apps"}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ClusterIPs: []string{"198.18.0.5"}}}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web-istio", Namespace: "apps"}}
	for _, tc := range []struct {
		name     string
		svc      *corev1.Service
		ready    int32
		ingress  []corev1.LoadBalancerIngress
		want     bool
		contains string
		addrs    []string
	}{
		{name: "not created", contains: "not created yet"},
		{name: "no ready replica", svc: svc, contains: "no ready replica"},
		{name: "pending load balancer", svc: svc, ready: 1, contains: `address pending for hostname "web-istio.apps.svc.cluster.local"`},
		{name: "load balancer", svc: svc, ready: 1, ingress: []corev1.LoadBalancerIngress{{IP: "198.18.1.1"}, {Hostname: "lb.example.com"}}, want: true, addrs: []string{"198.18.1.1", "lb.example.com"}},
		{name: "cluster IP", svc: &corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIPs: []string{"198.18.0.5"}}}, ready: 1, want: true, addrs: []string{"198.18.0.5"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s *corev1.Service
			var d *appsv1.Deployment
			if tc.svc != nil {
				s = tc.svc.DeepCopy()
				s.Status.LoadBalancer.Ingress = tc.ingress
				d = dep.DeepCopy()
				d.Status.ReadyReplicas = tc.ready
			}
			r := Assess(gw, s, d, "cluster.local")
			if r.Programmed != tc.want || !strings.Contains(r.Message, tc.contains) {
				t.Errorf("got %+v, want programmed %v and a message with %q", r, tc.want, tc.contains)
			}
			if !tc.want && r.Reason != gwv1.GatewayReasonAddressNotAssigned {
				t.Errorf("reason %s, want AddressNotAssigned", r.Reason)
			}
			var got []string
			for _, a := range r.Addresses {
				got = append(got, a.Value)
			}
			if tc.want && !slices.Equal(got, tc.addrs) {
				t.Errorf("addresses %v, want %v", got, tc.addrs)
			}
		})
	}
}

// BenchmarkCreateToApplied measures the time from a Gateway's creation (the API server's answer)
// to its ServiceAccount, Deployment and Service applied, one Gateway at a time.
func BenchmarkCreateToApplied(b *testing.B) {
	e := newEnv(b)
	e.namespace("bench")
	h := e.start(true)
	done := make(chan types.NamespacedName, 1024)
	h.mu.Lock()
	h.applied = func(k types.NamespacedName) { done <- k }
	h.mu.Unlock()
	seen := map[types.NamespacedName]bool{}
	i := 0
	for b.Loop() {
		name := fmt.Sprintf("gw-%d", i)
		i++
		e.create(gateway("bench", name, "istio", 80, 443))
		key := types.NamespacedName{Namespace: "bench", Name: name}
		for !seen[key] {
			select {
			case k := <-done:
				seen[k] = true
			case <-time.After(wait):
				b.Fatalf("%s not applied within %v", key, wait)
			}
		}
	}
	if v := e.versions("bench", "gw-0-istio"); len(v) != 3 {
		b.Fatalf("gw-0's objects: %v", v)
	}
}

// BenchmarkBurst50 measures 50 Gateways created at once until all their objects are applied.
func BenchmarkBurst50(b *testing.B) {
	e := newEnv(b)
	h := e.start(true)
	done := make(chan types.NamespacedName, 1024)
	h.mu.Lock()
	h.applied = func(k types.NamespacedName) { done <- k }
	h.mu.Unlock()
	round := 0
	for b.Loop() {
		ns := fmt.Sprintf("burst-%d", round)
		round++
		e.namespace(ns)
		want := map[types.NamespacedName]bool{}
		for i := range 50 {
			name := fmt.Sprintf("gw-%d", i)
			gw := gateway(ns, name, "istio", 80, 443)
			// Not LoadBalancer: 50 Gateways' node ports would fill the API server's range.
			gw.Annotations = map[string]string{ServiceTypeAnnotation: "ClusterIP"}
			e.create(gw)
			want[types.NamespacedName{Namespace: ns, Name: name}] = true
		}
		for len(want) > 0 {
			select {
			case k := <-done:
				delete(want, k)
			case <-time.After(wait):
				b.Fatalf("%d Gateways not applied within %v", len(want), wait)
			}
		}
	}
}

// A Gateway labelled (or in a namespace labelled) istio.io/rev for another revision is left to
// it, as istiod's TagWatcher.IsMine; unlabelled, it is the default revision's.
func TestOtherRevision(t *testing.T) {
	e := newEnv(t)
	if _, err := e.kube.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: "canary-ns", Labels: map[string]string{"istio.io/rev": "canary"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.namespace("plain")
	h := e.start(true)
	e.create(gateway("canary-ns", "web", "istio", 80))
	labelled := gateway("plain", "web", "istio", 80)
	labelled.Labels = map[string]string{"istio.io/rev": "canary"}
	e.create(labelled)
	h.settle(t, "canary-ns", "web", 0)
	h.settle(t, "plain", "web", 0)
	for _, ns := range []string{"canary-ns", "plain"} {
		if v := e.versions(ns, "web-istio"); len(v) != 0 {
			t.Errorf("the default revision deployed the canary's Gateway %s/web: %v", ns, v)
		}
	}
	e.edit("plain", "web", func(gw *gwv1.Gateway) { delete(gw.Labels, "istio.io/rev") })
	testwait.Until(t, wait, "deployed once unlabelled", func() bool { return len(e.versions("plain", "web-istio")) == 3 })

	// Relabelling the namespace hands its Gateway over at once (informers do not resync).
	ns, err := e.kube.CoreV1().Namespaces().Get(context.Background(), "canary-ns", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	delete(ns.Labels, "istio.io/rev")
	if _, err := e.kube.CoreV1().Namespaces().Update(context.Background(), ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, wait, "deployed once its namespace is unlabelled", func() bool { return len(e.versions("canary-ns", "web-istio")) == 3 })
}
