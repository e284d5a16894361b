package kube

import (
	"testing"

	"go.opentelemetry.io/otel/attribute"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	sharedkube "sailplane.dev/shared/kube"
	"sailplane.dev/shared/telemetry/telemetrytest"
)

// TestMetrics: Service and Pod events count in istiod's pilot_k8s_reg_events{type, event}, and
// the watches failing while the API server is unreachable in sailplane_kube_watch_errors_total.
func TestMetrics(t *testing.T) {
	k := sharedKube(t)
	proxy := newCutProxy(t, k.Host())
	cfg := k.RestConfig()
	cfg.Host = proxy.url()
	cs := clientFor(t, k.RestConfig())
	m := telemetrytest.New(t)
	startController(t, Config{ClusterID: "c1"}, Deps{Kube: cfg, MeterProvider: m.Provider()})
	ns := newNamespace(t, cs, "metrics")

	events := func(typ, event string) float64 {
		return m.Value("pilot_k8s_reg_events", "type", typ, "event", event)
	}
	adds, updates, deletes, podAdds := events("Services", "add"), events("Services", "update"), events("Services", "delete"), events("Pods", "add")
	svc := createService(t, cs, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: ns},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}})
	m.WaitValue(adds+1, "pilot_k8s_reg_events", "type", "Services", "event", "add")
	svc.Labels = map[string]string{"changed": "yes"}
	if _, err := cs.CoreV1().Services(ns).Update(ctxFor(t), svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	m.WaitValue(updates+1, "pilot_k8s_reg_events", "type", "Services", "event", "update")
	if err := cs.CoreV1().Services(ns).Delete(ctxFor(t), "api", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	m.WaitValue(deletes+1, "pilot_k8s_reg_events", "type", "Services", "event", "delete")
	createPod(t, cs, podSpec{ns: ns, name: "a", ip: "198.18.5.1", ready: true})
	m.WaitValue(podAdds+1, "pilot_k8s_reg_events", "type", "Pods", "event", "add")

	if n := m.Value("sailplane_kube_watch_errors_total"); n != 0 {
		t.Errorf("%v watch errors before the API server became unreachable", n)
	}
	proxy.cut()
	waitUntil(t, timeout, "failed watches counted", func() bool {
		return m.Value("sailplane_kube_watch_errors_total", "cluster", "c1") > 0
	})
	t.Logf("watch errors by resource: services %v, pods %v",
		m.Value("sailplane_kube_watch_errors_total", "resource", "services"), m.Value("sailplane_kube_watch_errors_total", "resource", "pods"))
}

// TestWatchErrorStatus: a list the API server refuses (an identity without RBAC rights) counts
// as a watch error of its resource; a request that is no list or watch does not.
func TestWatchErrorStatus(t *testing.T) {
	cfg := rest.AnonymousClientConfig(sharedKube(t).RestConfig())
	m := telemetrytest.New(t)
	sharedkube.CountWatchErrors(cfg, m.Provider(), attribute.String("cluster", "c1"))
	cs := clientFor(t, cfg)
	if _, err := cs.CoreV1().Pods("").List(ctxFor(t), metav1.ListOptions{Limit: 10}); err == nil {
		t.Fatal("an anonymous list of every pod was allowed")
	}
	if _, err := cs.CoreV1().Nodes().Get(ctxFor(t), "any", metav1.GetOptions{}); err == nil {
		t.Fatal("an anonymous get of a node was allowed")
	}
	if n := m.Value("sailplane_kube_watch_errors_total", "resource", "pods", "cluster", "c1"); n != 1 {
		t.Errorf("sailplane_kube_watch_errors_total{resource=pods} = %v for one refused list, want 1", n)
	}
	if n, ok := m.Scrape().Value("sailplane_kube_watch_errors_total", "resource", "nodes"); ok {
		t.Errorf("a refused get counted as %v watch errors", n)
	}
}
