package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"testing"

	"github.com/hashicorp/consul/api"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/connectivity"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	endpointwatcher "sailplane.dev/services/endpoint-watcher"
	xdsserver "sailplane.dev/services/xds-server"
	"sailplane.dev/shared/grpctest"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/telemetry/telemetrytest"
	"sailplane.dev/shared/testwait"
	"sailplane.dev/shared/xdstype"
	"sailplane.dev/tools/testenv"
)

// TestTracingKubernetesEndpoints follows one EndpointSlice change (a Service scaled from one
// endpoint to two) on a real API server through hyper's in-process wiring (endpoint-watcher, the
// in-memory bus, xds-server) to a real gRPC xDS client's ACK of the new endpoints: one trace
// from the watch event to the ACK.
func TestTracingKubernetesEndpoints(t *testing.T) {
	exporter, _ := telemetrytest.RecordSpans(t)
	k := testenv.KubeForTest(t)
	cs, err := kubernetes.NewForConfig(k.RestConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "demo"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Services("demo").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: "demo"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: 7070, TargetPort: intstr.FromInt32(7070)}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The API server refuses loopback addresses: the endpoints are in the benchmarking range
	// (outside the e2e test hosts' 198.18.0.0/24); the client only needs to receive and ACK
	// them, and its dialer (loopbackOnly) never sends them a packet.
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "echo-1", Namespace: "demo", Labels: map[string]string{discoveryv1.LabelServiceName: "echo"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("grpc"), Port: ptr(int32(7070))}},
		Endpoints:   []discoveryv1.Endpoint{readyEndpoint("198.19.7.1")},
	}
	if slice, err = cs.DiscoveryV1().EndpointSlices("demo").Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	_, srv, addr := startInProcess(t, t.TempDir(), &endpointwatcher.Config{Kube: k.RestConfig()})
	client := dialXDS(t, addr, "xds:///echo.demo.svc.cluster.local:7070")
	client.Connect()
	waitEndpointsAcked(t, srv)

	// The scale-up.
	slice.Endpoints = append(slice.Endpoints, readyEndpoint("198.19.7.2"))
	if _, err := cs.DiscoveryV1().EndpointSlices("demo").Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	checkEndpointTrace(t, exporter, map[string]string{"sailplane.registry": "kubernetes", "sailplane.kind": "EndpointSlice",
		"sailplane.event": "update", "sailplane.name": "demo/echo-1", "sailplane.cluster": endpointwatcher.DefaultClusterID})

	// A burst: each new slice is a change of its own, traced to a push, its own or one that
	// merges several and links to each.
	var burst []string
	for i := range 5 {
		s := slice.DeepCopy()
		s.ObjectMeta = metav1.ObjectMeta{Name: fmt.Sprintf("echo-burst-%d", i), Namespace: "demo", Labels: slice.Labels}
		s.Endpoints = []discoveryv1.Endpoint{readyEndpoint(fmt.Sprintf("198.19.8.%d", i+1))}
		if _, err := cs.DiscoveryV1().EndpointSlices("demo").Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		burst = append(burst, "demo/"+s.Name)
	}
	checkBurstTraces(t, exporter, burst)
}

// checkBurstTraces waits until the changes of the EndpointSlices named reach a push that the
// client ACKed: a change's xds.debounce is the parent of the xds.push, or linked from it when
// the push merged several changes. A change whose event published nothing new has no trace
// (the watcher may handle several slices' events in one update on a loaded machine): those
// that have one must each reach an ACKed push, and the burst must have at least one.
func checkBurstTraces(t *testing.T, exporter *tracetest.InMemoryExporter, slices []string) {
	t.Helper()
	testwait.For(t, waitFor, "the burst's changes to reach ACKed pushes", func() error {
		spans := exporter.GetSpans().Snapshots()
		pushes := map[trace.SpanID]sdktrace.ReadOnlySpan{} // by the debounce span they continue or link
		for _, s := range spans {
			if s.Name() != "xds.push" || attr(s, "sailplane.acked") != "1" {
				continue
			}
			pushes[s.Parent().SpanID()] = s
			for _, l := range s.Links() {
				pushes[l.SpanContext.SpanID()] = s
			}
		}
		traced, merged := 0, map[trace.SpanID]bool{}
		for _, name := range slices {
			var changed bool
			var push sdktrace.ReadOnlySpan
			for _, s := range spans {
				if s.Name() == "endpoints.change" && attr(s, "sailplane.name") == name {
					changed = true
				}
				if s.Name() != "xds.debounce" {
					continue
				}
				if root := rootOf(spans, s); root.Name() == "endpoints.change" && attr(root, "sailplane.name") == name && pushes[s.SpanContext().SpanID()] != nil {
					push = pushes[s.SpanContext().SpanID()]
				}
			}
			if !changed {
				continue
			}
			if push == nil {
				return fmt.Errorf("the change of %s reached no ACKed push yet", name)
			}
			traced++
			merged[push.SpanContext().SpanID()] = true
		}
		if traced == 0 {
			return errors.New("no change of the burst traced yet")
		}
		t.Logf("%d of %d changes traced, reaching %d pushes", traced, len(slices), len(merged))
		return nil
	})
}

// TestTracingConsulEndpoints is TestTracingKubernetesEndpoints for a Consul service: a second
// instance registered in a real Consul agent, traced from the blocking query's answer to the
// ACK of a client that calls the first instance throughout.
func TestTracingConsulEndpoints(t *testing.T) {
	exporter, _ := telemetrytest.RecordSpans(t)
	c := testenv.ConsulForTest(t)
	consul, err := api.NewClient(&api.Config{Address: c.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	backend := grpctest.HealthBackend(t)
	register := func(id, addr string) {
		t.Helper()
		if err := consul.Agent().ServiceRegister(&api.AgentServiceRegistration{
			ID: id, Name: "echo", Address: addr, Port: backend.Port, Meta: map[string]string{"protocol": "grpc"},
		}); err != nil {
			t.Fatal(err)
		}
	}
	register("echo-1", "127.0.0.1")

	_, srv, addr := startInProcess(t, t.TempDir(), &endpointwatcher.Config{Consul: &endpointwatcher.ConsulConfig{Address: c.Addr()}})
	client := dialXDS(t, addr, fmt.Sprintf("xds:///echo.service.consul:%d", backend.Port))
	client.Connect()
	testwait.Until(t, waitFor, "the xDS client to connect", func() bool {
		return client.GetState() == connectivity.Ready
	})
	waitEndpointsAcked(t, srv)

	// A second instance, at another loopback address where nothing listens (gRPC refuses two
	// endpoints of one address).
	register("echo-2", "127.0.0.2")
	checkEndpointTrace(t, exporter, map[string]string{"sailplane.registry": "consul", "sailplane.kind": "service",
		"sailplane.name": "echo", "sailplane.cluster": endpointwatcher.DefaultClusterID})
}

func readyEndpoint(addr string) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}}
}

func ptr[T any](v T) *T { return &v }

// waitEndpointsAcked waits until the one connected proxy ACKed the endpoints last sent to it,
// as /debug/syncz shows: from then on, an endpoints change is pushed to it.
func waitEndpointsAcked(t *testing.T, srv *xdsserver.Server) {
	t.Helper()
	syncz := srv.Debug().Endpoints["/debug/syncz"]
	testwait.For(t, waitFor, "the client to ACK its endpoints", func() error {
		rec := httptest.NewRecorder()
		syncz.ServeHTTP(rec, httptest.NewRequest("GET", "/debug/syncz", nil))
		var proxies []struct {
			Sent  string `json:"endpoint_sent"`
			Acked string `json:"endpoint_acked"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &proxies); err != nil {
			return fmt.Errorf("syncz: %w: %s", err, rec.Body)
		}
		if len(proxies) != 1 || proxies[0].Sent == "" || proxies[0].Sent != proxies[0].Acked {
			return fmt.Errorf("syncz: %s", rec.Body)
		}
		return nil
	})
}

// checkEndpointTrace waits for the trace of the endpoints change whose endpoints.change root has
// rootAttrs to reach the client's ACK, and checks its span tree: from the registry's event,
// through the bus, to the push and the client's ACK of the new endpoints.
func checkEndpointTrace(t *testing.T, exporter *tracetest.InMemoryExporter, rootAttrs map[string]string) {
	t.Helper()
	isChange := func(s sdktrace.ReadOnlySpan) bool {
		if s.Name() != "endpoints.change" {
			return false
		}
		for k, v := range rootAttrs {
			if attr(s, k) != v {
				return false
			}
		}
		return true
	}
	var push sdktrace.ReadOnlySpan
	testwait.For(t, waitFor, "the endpoints change's trace to reach the client's ACK", func() error {
		spans := exporter.GetSpans().Snapshots()
		for _, s := range spans {
			if s.Name() == "xds.push" && isChange(rootOf(spans, s)) {
				push = s
				return nil
			}
		}
		var roots []string
		for _, s := range spans {
			if s.Name() == "endpoints.change" {
				roots = append(roots, fmt.Sprint(s.Attributes()))
			}
		}
		return fmt.Errorf("no xds.push under an endpoints.change with %v yet; endpoints.change spans: %v", rootAttrs, roots)
	})
	spans := inTrace(exporter.GetSpans().Snapshots(), push.SpanContext().TraceID())
	tree := treeOf(spans)
	t.Logf("trace:\n%s", tree)

	checkPath(t, spans, push, "endpoints.change", "bus.publish", "bus.deliver", "xds.debounce", "xds.push")
	root := rootOf(spans, push)
	if len(childrenOf(spans, root, "endpoints.update")) != 1 {
		t.Errorf("endpoints.change has no endpoints.update child (recomputing the registry)")
	}
	publish := parentOf(spans, parentOf(spans, parentOf(spans, push)))
	if got := attr(publish, "sailplane.type"); got != schema.Endpoints.TypeURL {
		t.Errorf("the push continues the bus.publish of %s, want %s", got, schema.Endpoints.TypeURL)
	}
	proxies := childrenOf(spans, push, "xds.proxy")
	if len(proxies) != 1 {
		t.Fatalf("xds.push has %d xds.proxy children, want 1 (one client)", len(proxies))
	}
	var edsAcked bool
	for _, ack := range childrenOf(spans, proxies[0], "xds.ack") {
		if ack.Status().Code == codes.Error {
			t.Errorf("%s NACKed: %s", attr(ack, "sailplane.type"), ack.Status().Description)
		}
		if xdstype.Short(attr(ack, "sailplane.type")) == "EDS" {
			edsAcked = true
			if push.EndTime().Before(ack.EndTime()) {
				t.Errorf("xds.push ends before the endpoints' ACK")
			}
		}
	}
	if !edsAcked {
		t.Errorf("the client's ACK of the new endpoints is not in the trace")
	}
	if got := attr(push, "sailplane.acked"); got != "1" {
		t.Errorf("xds.push: %s proxies acked, want 1", got)
	}
}
