package endpointwatcher

import (
	"context"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/endpoint-watcher/internal/bustest"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/telemetry/telemetrytest"
	"sailplane.dev/tools/testenv"
)

const kubeTimeout = 30 * time.Second

// One API server for the package (each takes seconds to start), stopped in TestMain.
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
		shared.kube, shared.err = testenv.StartKube(ctx,
			testenv.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.kube
}

func kubeClient(t *testing.T, cfg *rest.Config) kubernetes.Interface {
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

func waitEndpoints(t *testing.T, rec *bustest.Recorder, name string, want *discoveryv1.Endpoints) {
	t.Helper()
	rec.WaitForState(t, kubeTimeout, func(st map[string]map[string]*bus.Resource) bool {
		r, ok := st[schema.Endpoints.TypeURL][name]
		return ok && proto.Equal(r.Body, want)
	})
}

// TestCrossRegistry: a ServiceEntry's workloadSelector selects Pods, and a Kubernetes
// Service's selector selects WorkloadEntries, as in istiod; what one registry's change brings
// about in the other is published in that change's trace.
func TestCrossRegistry(t *testing.T) {
	exporter, tracer := telemetrytest.RecordSpans(t)
	k := sharedKube(t)
	cs := kubeClient(t, k.RestConfig())
	ctx := context.Background()
	nsObj, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "cross-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns := nsObj.Name
	// The injector's tlsMode label must reach the bus: xds-server marks mTLS endpoints by it.
	podLabels := map[string]string{"app": "legacy", "security.istio.io/tlsMode": "istio"}
	pod, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "legacy-1", Namespace: ns, Labels: podLabels},
		Spec:       corev1.PodSpec{ServiceAccountName: "legacy-sa", Containers: []corev1.Container{{Name: "app", Image: "app"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	setReady := func(ready corev1.ConditionStatus) {
		t.Helper()
		pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "198.18.5.1",
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: ready}}}
		if pod, err = cs.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setReady(corev1.ConditionTrue)
	if _, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "frontend", Namespace: ns},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "vm"}, ClusterIP: corev1.ClusterIPNone,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	se := parse(t, `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: legacy, namespace: `+ns+`}
spec:
  hosts: [legacy.example.com]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{name: http, number: 80, protocol: HTTP}]
  workloadSelector: {labels: {app: legacy}}
`)
	we := func(name, addr string) bus.Change {
		return parse(t, `
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: `+name+`, namespace: `+ns+`}
spec: {address: `+addr+`, labels: {app: vm, security.istio.io/tlsMode: istio}, serviceAccount: vm-sa}
`)
	}
	src := newFakeSource(se, we("vm-1", "198.18.6.1"))
	close(src.release)
	rec := bustest.NewRecorder()
	w := startWith(t, Config{ClusterID: "c1", Kube: k.RestConfig()}, src, rec)
	select {
	case <-w.Ready():
	case <-time.After(kubeTimeout):
		t.Fatal("Ready not closed")
	}

	seName := ns + "/legacy.example.com"
	podEP := func(h discoveryv1.Health) *discoveryv1.Endpoints {
		return &discoveryv1.Endpoints{Hostname: "legacy.example.com", Namespace: ns, Endpoints: []*discoveryv1.Endpoint{{
			Address: "198.18.5.1", Ports: map[string]uint32{"http": 80}, Labels: podLabels,
			ServiceAccount: "legacy-sa", Health: h, ClusterId: "c1", Workload: "legacy-1",
		}}}
	}
	waitEndpoints(t, rec, seName, podEP(discoveryv1.Health_HEALTHY))

	svcHost := "frontend." + ns + ".svc.cluster.local"
	weEP := func(name, addr string) *discoveryv1.Endpoint {
		return &discoveryv1.Endpoint{Address: addr, Ports: map[string]uint32{"http": 8080},
			Labels: map[string]string{"app": "vm", "security.istio.io/tlsMode": "istio"}, ServiceAccount: "vm-sa",
			ClusterId: "c1", Workload: name}
	}
	waitEndpoints(t, rec, ns+"/"+svcHost, &discoveryv1.Endpoints{Hostname: svcHost, Namespace: ns,
		Endpoints: []*discoveryv1.Endpoint{weEP("vm-1", "198.18.6.1")}})

	t.Run("pod readiness reaches the ServiceEntry", func(t *testing.T) {
		setReady(corev1.ConditionFalse)
		waitEndpoints(t, rec, seName, podEP(discoveryv1.Health_UNHEALTHY))
		sc := rec.State(schema.Endpoints.TypeURL)[seName].Trace
		var root sdktrace.ReadOnlySpan
		for _, s := range exporter.GetSpans().Snapshots() {
			if s.Name() == "endpoints.change" && s.SpanContext().TraceID() == sc.TraceID() {
				root = s
			}
		}
		if root == nil {
			t.Fatalf("the ServiceEntry's endpoints carry trace %v, of no endpoints.change", sc)
		}
		got := map[string]string{}
		for _, a := range root.Attributes() {
			got[string(a.Key)] = a.Value.Emit()
		}
		if got["sailplane.kind"] != "Pod" || got["sailplane.name"] != ns+"/legacy-1" || got["sailplane.event"] != "update" {
			t.Errorf("the ServiceEntry's endpoints carry the trace of %v, want the Pod's update", got)
		}
	})
	t.Run("new WorkloadEntry reaches the Service", func(t *testing.T) {
		_, change := tracer.Start(context.Background(), "bus.deliver")
		defer change.End()
		c := we("vm-2", "198.18.6.2")
		c.Trace = change.SpanContext()
		src.send(t, c)
		waitEndpoints(t, rec, ns+"/"+svcHost, &discoveryv1.Endpoints{Hostname: svcHost, Namespace: ns,
			Endpoints: []*discoveryv1.Endpoint{weEP("vm-1", "198.18.6.1"), weEP("vm-2", "198.18.6.2")}})
		if sc := rec.State(schema.Endpoints.TypeURL)[ns+"/"+svcHost].Trace; !sc.Equal(change.SpanContext()) {
			t.Errorf("the Service's endpoints carry trace %v, want the WorkloadEntry change's %v", sc, change.SpanContext())
		}
	})
	t.Run("removed WorkloadEntry leaves the Service", func(t *testing.T) {
		src.send(t, bus.Change{TypeURL: schema.WorkloadEntry.TypeURL, Removed: []string{ns + "/vm-1"}})
		waitEndpoints(t, rec, ns+"/"+svcHost, &discoveryv1.Endpoints{Hostname: svcHost, Namespace: ns,
			Endpoints: []*discoveryv1.Endpoint{weEP("vm-2", "198.18.6.2")}})
	})
	t.Run("deleted pod leaves the ServiceEntry", func(t *testing.T) {
		if err := cs.CoreV1().Pods(ns).Delete(ctx, "legacy-1", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
		waitEndpoints(t, rec, seName, &discoveryv1.Endpoints{Hostname: "legacy.example.com", Namespace: ns})
	})
}
