package kube

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/endpoint-watcher/internal/bustest"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/testlog"
	"sailplane.dev/tools/testenv"
)

const timeout = 30 * time.Second

// One API server for the package's tests (each takes seconds to start); tests isolate
// themselves by namespace. Remote-cluster tests start their own extra ones.
var shared struct {
	once sync.Once
	kube *testenv.Kube
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.kube != nil {
		shared.kube.Stop()
	}
	if code == 0 {
		// klog starts its flush daemon in init (client-go imports klog): process-global.
		if err := goleak.Find(goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func sharedKube(t testing.TB) *testenv.Kube {
	t.Helper()
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		shared.kube, shared.err = testenv.StartKube(ctx,
			testenv.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.kube
}

func testLogger(t testing.TB) *slog.Logger {
	return testlog.New(t, slog.LevelDebug)
}

// clientFor returns a clientset whose connections are closed at cleanup.
func clientFor(t testing.TB, cfg *rest.Config) kubernetes.Interface {
	t.Helper()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hc.CloseIdleConnections)
	cs, err := kubernetes.NewForConfigAndClient(cfg, hc)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func ctxFor(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func newNamespace(t testing.TB, cs kubernetes.Interface, prefix string) string {
	t.Helper()
	ns, err := cs.CoreV1().Namespaces().Create(ctxFor(t), &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

func createNamespace(t testing.TB, cs kubernetes.Interface, name string) {
	t.Helper()
	_, err := cs.CoreV1().Namespaces().Create(ctxFor(t), &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

// startController runs a Controller until the test ends and waits until it is ready.
func startController(t testing.TB, cfg Config, deps Deps) (*Controller, *bustest.Recorder) {
	t.Helper()
	rec := bustest.NewRecorder()
	if deps.Publisher == nil {
		deps.Publisher = rec
	}
	if deps.Logger == nil {
		deps.Logger = testLogger(t)
	}
	c, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case <-c.Ready():
	case err := <-done:
		t.Fatalf("Run returned before Ready: %v", err)
	case <-time.After(timeout):
		t.Fatal("controller not ready")
	}
	return c, rec
}

func createService(t testing.TB, cs kubernetes.Interface, svc *corev1.Service) *corev1.Service {
	t.Helper()
	out, err := cs.CoreV1().Services(svc.Namespace).Create(ctxFor(t), svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

type podSpec struct {
	ns, name, sa, node, ip string
	labels                 map[string]string
	ready                  bool
}

// createPod creates a Pod and sets the status a kubelet would have: IP and Ready condition.
func createPod(t testing.TB, cs kubernetes.Interface, p podSpec) {
	t.Helper()
	ctx := ctxFor(t)
	pod, err := cs.CoreV1().Pods(p.ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: p.ns, Labels: p.labels},
		Spec: corev1.PodSpec{ServiceAccountName: p.sa, NodeName: p.node,
			Containers: []corev1.Container{{Name: "app", Image: "app"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ready := corev1.ConditionFalse
	if p.ready {
		ready = corev1.ConditionTrue
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: p.ip, PodIPs: []corev1.PodIP{{IP: p.ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: ready}}}
	if _, err := cs.CoreV1().Pods(p.ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func createNode(t testing.TB, cs kubernetes.Interface, name string, labels map[string]string) {
	t.Helper()
	_, err := cs.CoreV1().Nodes().Create(ctxFor(t), &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

func ptr[T any](v T) *T { return &v }

func slicePort(name string, port int32) discovery.EndpointPort {
	return discovery.EndpointPort{Name: ptr(name), Port: ptr(port), Protocol: ptr(corev1.ProtocolTCP)}
}

// sliceEndpoint is an EndpointSlice endpoint for a Pod (pod may be empty).
func sliceEP(addr, pod, node string, ready, serving, terminating bool) discovery.Endpoint {
	e := discovery.Endpoint{Addresses: []string{addr},
		Conditions: discovery.EndpointConditions{Ready: ptr(ready), Serving: ptr(serving), Terminating: ptr(terminating)}}
	if pod != "" {
		e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Name: pod}
	}
	if node != "" {
		e.NodeName = ptr(node)
	}
	return e
}

func newSlice(ns, name, svc string, ports []discovery.EndpointPort, eps ...discovery.Endpoint) *discovery.EndpointSlice {
	return &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{discovery.LabelServiceName: svc}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       ports,
		Endpoints:   eps,
	}
}

func createSlice(t testing.TB, cs kubernetes.Interface, s *discovery.EndpointSlice) *discovery.EndpointSlice {
	t.Helper()
	out, err := cs.DiscoveryV1().EndpointSlices(s.Namespace).Create(ctxFor(t), s, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func updateSlice(t testing.TB, cs kubernetes.Interface, s *discovery.EndpointSlice) *discovery.EndpointSlice {
	t.Helper()
	out, err := cs.DiscoveryV1().EndpointSlices(s.Namespace).Update(ctxFor(t), s, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// waitFor waits until the resource of typeURL named name satisfies check (nil: is absent).
func waitFor[T proto.Message](t testing.TB, rec *bustest.Recorder, typeURL, name string, check func(T) bool) {
	t.Helper()
	rec.WaitForState(t, timeout, func(st map[string]map[string]*bus.Resource) bool {
		r, ok := st[typeURL][name]
		if check == nil {
			return !ok
		}
		if !ok {
			return false
		}
		b, ok := r.Body.(T)
		return ok && check(b)
	})
}

// waitEqual waits until the resource equals want.
func waitEqual[T proto.Message](t testing.TB, rec *bustest.Recorder, typeURL, name string, want T) {
	t.Helper()
	rec.WaitForState(t, timeout, func(st map[string]map[string]*bus.Resource) bool {
		r, ok := st[typeURL][name]
		return ok && proto.Equal(r.Body, want)
	})
}

func waitService(t testing.TB, rec *bustest.Recorder, name string, want *discoveryv1.Service) {
	t.Helper()
	waitEqual(t, rec, schema.Service.TypeURL, name, want)
}

func waitEndpoints(t testing.TB, rec *bustest.Recorder, name string, want *discoveryv1.Endpoints) {
	t.Helper()
	waitEqual(t, rec, schema.Endpoints.TypeURL, name, want)
}

func text(m proto.Message) string { return prototext.Format(m) }

var slogDiscard = slog.New(slog.DiscardHandler)
