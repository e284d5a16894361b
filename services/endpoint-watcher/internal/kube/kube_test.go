package kube

import (
	"os"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/endpoint-watcher/internal/bustest"
	"sailplane.dev/shared/schema"
)

func TestProtocol(t *testing.T) {
	for _, tc := range []struct {
		name, port string
		number     int32
		appProto   *string
		proto      corev1.Protocol
		want       string
	}{
		{name: "http prefix", port: "http-web", want: "HTTP"},
		{name: "bare name", port: "http", want: "HTTP"},
		{name: "http2", port: "http2-x", want: "HTTP2"},
		{name: "grpc", port: "grpc", want: "GRPC"},
		{name: "grpc-web", port: "grpc-web-ui", want: "GRPC-Web"},
		{name: "https", port: "https-admin", want: "HTTPS"},
		{name: "tls", port: "tls-db", want: "TLS"},
		{name: "tcp", port: "tcp-raw", want: "TCP"},
		{name: "case insensitive", port: "HTTP-Upper", want: "HTTP"},
		{name: "unknown prefix is undeclared", port: "web", want: ""},
		{name: "no name is undeclared", port: "", want: ""},
		{name: "undeclared on a well-known server-first port", port: "db", number: 3306, want: "TCP"},
		{name: "declared on a well-known port", port: "http-smtp", number: 25, want: "HTTP"},
		{name: "mongo", port: "mongo-1", want: "Mongo"},
		{name: "appProtocol wins", port: "tcp-x", appProto: ptr("grpc"), want: "GRPC"},
		{name: "appProtocol h2c", port: "x", appProto: ptr("kubernetes.io/h2c"), want: "HTTP2"},
		{name: "unknown appProtocol is undeclared, whatever the name", port: "http-x", appProto: ptr("example.com/custom"), want: ""},
		{name: "appProtocol prefix", port: "x", appProto: ptr("http-legacy"), want: "HTTP"},
		{name: "udp", port: "http-dns", proto: corev1.ProtocolUDP, want: "UDP"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := corev1.ServicePort{Name: tc.port, Port: tc.number, AppProtocol: tc.appProto, Protocol: tc.proto}
			if got := Protocol(p); got != tc.want {
				t.Errorf("Protocol(%q, appProtocol %v) = %q, want %q", tc.port, tc.appProto, got, tc.want)
			}
		})
	}
}

func TestHealth(t *testing.T) {
	for _, tc := range []struct {
		name                        string
		ready, serving, terminating *bool
		want                        discoveryv1.Health
	}{
		{name: "unset means ready", want: discoveryv1.Health_HEALTHY},
		{name: "ready", ready: ptr(true), serving: ptr(true), terminating: ptr(false), want: discoveryv1.Health_HEALTHY},
		{name: "not ready", ready: ptr(false), serving: ptr(false), want: discoveryv1.Health_UNHEALTHY},
		{name: "draining", ready: ptr(false), serving: ptr(true), terminating: ptr(true), want: discoveryv1.Health_DRAINING},
		{name: "terminating not serving", ready: ptr(false), serving: ptr(false), terminating: ptr(true), want: discoveryv1.Health_UNHEALTHY},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Health(discovery.EndpointConditions{Ready: tc.ready, Serving: tc.serving, Terminating: tc.terminating})
			if got != tc.want {
				t.Errorf("Health = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestExportTo(t *testing.T) {
	for in, want := range map[string][]string{
		"":        nil,
		"*":       {"*"},
		".":       {"ns"},
		"b, ., a": {"a", "b", "ns"},
		"a,*,b":   {"*"},
	} {
		if got := exportTo("ns", in); !slices.Equal(got, want) {
			t.Errorf("exportTo(%q) = %v, want %v", in, got, want)
		}
	}
}

// TestServiceEndpoints covers translation, incremental updates and deletion against a real API
// server.
func TestServiceEndpoints(t *testing.T) {
	k := sharedKube(t)
	cs := clientFor(t, k.RestConfig())
	ns := newNamespace(t, cs, "svc")
	node := ns + "-node"
	createNode(t, cs, node, map[string]string{LabelRegion: "eu", LabelZone: "eu-a", LabelSubZone: "rack1", "other": "x"})
	labels := map[string]string{"app": "web", "version": "v1"}
	createPod(t, cs, podSpec{ns: ns, name: "web-1", sa: "web-sa", node: node, ip: "198.18.0.1", labels: labels, ready: true})
	createPod(t, cs, podSpec{ns: ns, name: "web-2", sa: "web-sa", node: node, ip: "198.18.0.2", labels: labels})
	createPod(t, cs, podSpec{ns: ns, name: "web-3", sa: "web-sa", ip: "198.18.0.3", labels: labels})
	svc := createService(t, cs, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns, Labels: map[string]string{"team": "a"},
			Annotations: map[string]string{AnnotationExportTo: ".,other", "unrelated": "dropped"}},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{
				{Name: "http-web", Port: 80, TargetPort: intstr.FromInt32(8080)},
				{Name: "api", Port: 9090, AppProtocol: ptr("grpc"), TargetPort: intstr.FromString("api")},
			},
		},
	})
	ports := []discovery.EndpointPort{slicePort("http-web", 8080), slicePort("api", 9091)}
	sl := createSlice(t, cs, newSlice(ns, "web-abc", "web", ports,
		sliceEP("198.18.0.1", "web-1", "", true, true, false),
		sliceEP("198.18.0.2", "web-2", "", false, false, false),
		func() discovery.Endpoint {
			e := sliceEP("198.18.0.3", "web-3", "", false, true, true)
			e.Zone = ptr("zone-from-slice")
			return e
		}(),
	))
	// A Service in the same namespace, used as a barrier: its slice is watched by the same
	// informer, so its update is seen after every earlier slice update.
	createService(t, cs, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "barrier", Namespace: ns},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "tcp", Port: 1}}},
	})
	barrier := createSlice(t, cs, newSlice(ns, "barrier-1", "barrier", []discovery.EndpointPort{slicePort("tcp", 1)},
		sliceEP("198.18.9.1", "", "", true, true, false)))

	_, rec := startController(t, Config{ClusterID: "c1"}, Deps{Kube: k.RestConfig()})

	host := "web." + ns + ".svc.cluster.local"
	name := ns + "/" + host
	waitService(t, rec, name, &discoveryv1.Service{
		Hostname: host, Namespace: ns,
		Ports: []*discoveryv1.Port{
			{Name: "http-web", Number: 80, Protocol: "HTTP", TargetPort: 8080},
			{Name: "api", Number: 9090, Protocol: "GRPC"},
		},
		Addresses: svc.Spec.ClusterIPs, Resolution: discoveryv1.Resolution_STATIC,
		Labels: map[string]string{"team": "a"}, Registry: "kubernetes",
		ExportTo: slices.Sorted(slices.Values([]string{ns, "other"})), ClusterId: "c1",
	})
	loc := &discoveryv1.Locality{Region: "eu", Zone: "eu-a", SubZone: "rack1"}
	ep := func(addr, pod string, h discoveryv1.Health, loc *discoveryv1.Locality) *discoveryv1.Endpoint {
		// The API server may add the node's topology labels to a Pod bound at creation.
		return &discoveryv1.Endpoint{Address: addr, Ports: map[string]uint32{"http-web": 8080, "api": 9091},
			Labels: podLabels(t, cs, ns, pod), ServiceAccount: "web-sa", Locality: loc, Health: h, ClusterId: "c1", Workload: pod}
	}
	waitEndpoints(t, rec, name, &discoveryv1.Endpoints{Hostname: host, Namespace: ns, Endpoints: []*discoveryv1.Endpoint{
		ep("198.18.0.1", "web-1", discoveryv1.Health_HEALTHY, loc),
		ep("198.18.0.2", "web-2", discoveryv1.Health_UNHEALTHY, loc),
		ep("198.18.0.3", "web-3", discoveryv1.Health_DRAINING, &discoveryv1.Locality{Zone: "zone-from-slice"}),
	}})

	t.Run("pod becoming ready sends one Endpoints", func(t *testing.T) {
		rec.Reset()
		sl.Endpoints[1].Conditions = discovery.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)}
		sl = updateSlice(t, cs, sl)
		barrier.Endpoints[0].Addresses = []string{"198.18.9.2"}
		barrier = updateSlice(t, cs, barrier)
		barrierName := ns + "/barrier." + ns + ".svc.cluster.local"
		rec.WaitFor(t, timeout, func(calls []bustest.Call) bool {
			return slices.ContainsFunc(calls, func(c bustest.Call) bool { return slices.Contains(c.Names, barrierName) })
		})
		calls := rec.Calls()
		want := []bustest.Call{
			{Op: "Upsert", TypeURL: schema.Endpoints.TypeURL, Names: []string{name}},
			{Op: "Upsert", TypeURL: schema.Endpoints.TypeURL, Names: []string{barrierName}},
		}
		if !slices.EqualFunc(calls, want, func(a, b bustest.Call) bool {
			return a.Op == b.Op && a.TypeURL == b.TypeURL && slices.Equal(a.Names, b.Names)
		}) {
			t.Fatalf("calls = %+v, want %+v", calls, want)
		}
		got := rec.State(schema.Endpoints.TypeURL)[name].Body.(*discoveryv1.Endpoints)
		if h := got.Endpoints[1].Health; h != discoveryv1.Health_HEALTHY {
			t.Errorf("web-2 health = %v, want HEALTHY:\n%s", h, text(got))
		}
	})

	t.Run("pod label change updates endpoint labels", func(t *testing.T) {
		pod, err := cs.CoreV1().Pods(ns).Get(ctxFor(t), "web-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pod.Labels["version"] = "v2"
		if _, err := cs.CoreV1().Pods(ns).Update(ctxFor(t), pod, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, rec, schema.Endpoints.TypeURL, name, func(e *discoveryv1.Endpoints) bool {
			return e.Endpoints[0].Labels["version"] == "v2"
		})
	})

	t.Run("node locality change updates endpoints", func(t *testing.T) {
		n, err := cs.CoreV1().Nodes().Get(ctxFor(t), node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Labels[LabelZone] = "eu-b"
		if _, err := cs.CoreV1().Nodes().Update(ctxFor(t), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, rec, schema.Endpoints.TypeURL, name, func(e *discoveryv1.Endpoints) bool {
			return e.Endpoints[0].Locality.GetZone() == "eu-b" && e.Endpoints[1].Locality.GetZone() == "eu-b"
		})
	})

	t.Run("service deletion deletes both", func(t *testing.T) {
		rec.Reset()
		if err := cs.CoreV1().Services(ns).Delete(ctxFor(t), "web", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor[*discoveryv1.Service](t, rec, schema.Service.TypeURL, name, nil)
		waitFor[*discoveryv1.Endpoints](t, rec, schema.Endpoints.TypeURL, name, nil)
		for _, c := range rec.Calls() {
			if c.Op != "Delete" || !slices.Equal(c.Names, []string{name}) {
				t.Errorf("unexpected call %+v", c)
			}
		}
	})
}

// TestEndpointWaitsForItsPod: as istiod, an EndpointSlice endpoint whose targetRef Pod is not
// (yet) in the cache is left out, since its labels and identity are unknown; the Pod's arrival
// brings it in. Endpoints without a targetRef do not wait.
func TestEndpointWaitsForItsPod(t *testing.T) {
	k := sharedKube(t)
	cs := clientFor(t, k.RestConfig())
	ns := newNamespace(t, cs, "latepod")
	createPod(t, cs, podSpec{ns: ns, name: "api-1", sa: "api-sa", ip: "198.18.2.1", labels: map[string]string{"app": "api"}, ready: true})
	createService(t, cs, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: ns},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "api"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	})
	createSlice(t, cs, newSlice(ns, "api-1", "api", []discovery.EndpointPort{slicePort("http", 8080)},
		sliceEP("198.18.2.1", "api-1", "", true, true, false),
		sliceEP("198.18.2.2", "api-2", "", true, true, false), // its Pod comes later
		sliceEP("198.18.2.9", "", "", true, true, false),      // no Pod: not waited for
	))
	_, rec := startController(t, Config{ClusterID: "c1"}, Deps{Kube: k.RestConfig()})

	host := "api." + ns + ".svc.cluster.local"
	name := ns + "/" + host
	ep := func(addr, pod string) *discoveryv1.Endpoint {
		e := &discoveryv1.Endpoint{Address: addr, Ports: map[string]uint32{"http": 8080}, Health: discoveryv1.Health_HEALTHY, ClusterId: "c1"}
		if pod != "" {
			e.Labels, e.ServiceAccount, e.Workload = podLabels(t, cs, ns, pod), "api-sa", pod
		}
		return e
	}
	// The first state is computed from synced caches, so api-2 is absent from it, not late.
	waitEndpoints(t, rec, name, &discoveryv1.Endpoints{Hostname: host, Namespace: ns, Endpoints: []*discoveryv1.Endpoint{
		ep("198.18.2.1", "api-1"), ep("198.18.2.9", ""),
	}})

	createPod(t, cs, podSpec{ns: ns, name: "api-2", sa: "api-sa", ip: "198.18.2.2", labels: map[string]string{"app": "api", "version": "v2"}, ready: true})
	waitEndpoints(t, rec, name, &discoveryv1.Endpoints{Hostname: host, Namespace: ns, Endpoints: []*discoveryv1.Endpoint{
		ep("198.18.2.1", "api-1"), ep("198.18.2.2", "api-2"), ep("198.18.2.9", ""),
	}})
}

func TestHeadlessAndExternalName(t *testing.T) {
	k := sharedKube(t)
	cs := clientFor(t, k.RestConfig())
	ns := newNamespace(t, cs, "headless")
	createService(t, cs, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: ns},
		Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone,
			Ports: []corev1.ServicePort{{Name: "tcp-db", Port: 5432}}},
	})
	createSlice(t, cs, newSlice(ns, "db-1", "db", []discovery.EndpointPort{slicePort("tcp-db", 5432)},
		sliceEP("198.18.1.1", "", "", true, true, false)))
	createService(t, cs, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "ext", Namespace: ns},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "example.com",
			Ports: []corev1.ServicePort{{Name: "https", Port: 443}}},
	})
	_, rec := startController(t, Config{ClusterID: "c1", ClusterDomain: "corp.example"}, Deps{Kube: k.RestConfig()})

	host := "db." + ns + ".svc.corp.example"
	waitService(t, rec, ns+"/"+host, &discoveryv1.Service{
		Hostname: host, Namespace: ns, Resolution: discoveryv1.Resolution_NONE,
		Ports:    []*discoveryv1.Port{{Name: "tcp-db", Number: 5432, Protocol: "TCP"}},
		Registry: "kubernetes", ClusterId: "c1",
	})
	waitEndpoints(t, rec, ns+"/"+host, &discoveryv1.Endpoints{Hostname: host, Namespace: ns, Endpoints: []*discoveryv1.Endpoint{
		{Address: "198.18.1.1", Ports: map[string]uint32{"tcp-db": 5432}, ClusterId: "c1"},
	}})
	ext := "ext." + ns + ".svc.corp.example"
	waitService(t, rec, ns+"/"+ext, &discoveryv1.Service{
		Hostname: ext, Namespace: ns, Resolution: discoveryv1.Resolution_DNS, MeshExternal: true,
		Ports:    []*discoveryv1.Port{{Name: "https", Number: 443, Protocol: "HTTPS"}},
		Registry: "kubernetes", ClusterId: "c1",
	})
	waitEndpoints(t, rec, ns+"/"+ext, &discoveryv1.Endpoints{Hostname: ext, Namespace: ns, Endpoints: []*discoveryv1.Endpoint{
		{Address: "example.com", Ports: map[string]uint32{"https": 443}, ClusterId: "c1"},
	}})
}

func podLabels(t testing.TB, cs kubernetes.Interface, ns, name string) map[string]string {
	t.Helper()
	p, err := cs.CoreV1().Pods(ns).Get(ctxFor(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p.Labels
}

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
