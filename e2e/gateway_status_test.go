package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/tools/testenv"
	"sailplane.dev/tools/xdsdiff"
)

// gatewayStatusDir holds the corpus (kube.yaml) and the allowlist of TestGatewayStatusMatchesIstiod.
const gatewayStatusDir = "testdata/gateway-status"

// gatewayStatusKinds are the Gateway API kinds that carry a status, as the API server serves them.
var gatewayStatusKinds = []struct {
	kind string
	gvr  schema.GroupVersionResource
	// required is the list field the status must have, if any: a route's parents, a
	// policy's ancestors.
	required string
}{
	{"GatewayClass", gwGVR("gatewayclasses"), ""},
	{"Gateway", gwGVR("gateways"), ""},
	{"ListenerSet", gwGVR("listenersets"), ""},
	{"HTTPRoute", gwGVR("httproutes"), "parents"},
	{"GRPCRoute", gwGVR("grpcroutes"), "parents"},
	{"TCPRoute", gwGVR("tcproutes"), "parents"},
	{"TLSRoute", gwGVR("tlsroutes"), "parents"},
	{"BackendTLSPolicy", gwGVR("backendtlspolicies"), "ancestors"},
}

func gwGVR(resource string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: resource}
}

// loadBalancerIngress is what a cloud controller would write to the corpus's LoadBalancer
// Services (there is none here): lb-pending-gw is left waiting.
var loadBalancerIngress = map[string]corev1.LoadBalancerIngress{
	"gs/lb-ip-gw":       {IP: "198.18.9.10"},
	"gs/lb-hostname-gw": {Hostname: "lb.example.net"},
}

// TestGatewayStatusMatchesIstiod applies the corpus of testdata/gateway-status (kube.yaml, then
// edits.yaml) to a real API server, lets istiod (its gateway controller and status writer on, as
// installed) write the Gateway API status, stops it and clears every status, lets Sailplane's
// hyper write it, and compares the two per object: conditions (type, status, reason, observedGeneration),
// attachedRoutes, supportedKinds, addresses (in order), parents and their controllerName;
// messages and lastTransitionTime are not compared. A difference not in
// testdata/gateway-status/allowlist.yaml fails the test, and so does an entry that matched
// nothing. Neither deploys gateways (no kubelet would run them): the corpus holds the Services
// a deployment would have made. One API server for both, so the Services' cluster IPs are the
// same. SAILPLANE_DIFF_DUMP=<dir> writes both sides' statuses there.
func TestGatewayStatusMatchesIstiod(t *testing.T) {
	start := time.Now()
	allow, err := xdsdiff.LoadAllowlist(filepath.Join(gatewayStatusDir, "allowlist.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(gatewayStatusDir, "kube.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	manifest := string(b)
	objs, err := framework.Decode(manifest)
	if err != nil {
		t.Fatalf("%s/kube.yaml: %v", gatewayStatusDir, err)
	}
	pods, err := casePods(objs)
	if err != nil {
		t.Fatalf("%s/kube.yaml: %v", gatewayStatusDir, err)
	}
	expected := expectedStatuses(objs)

	k := testenv.KubeForTest(t, testenv.WithGatewayAPICRDs())
	kube := framework.NewKube(t, k.RestConfig())
	kube.EnsureNamespace(t, "istio-system")
	kube.Apply(t, manifest)
	edits, err := os.ReadFile(filepath.Join(gatewayStatusDir, "edits.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range kube.Apply(t, string(edits)) {
		if o.GetGeneration() < 2 {
			t.Fatalf("%s/edits.yaml: %s %s/%s is at generation %d: the edit changed nothing", gatewayStatusDir,
				o.GetKind(), o.GetNamespace(), o.GetName(), o.GetGeneration())
		}
	}
	setPodsRunning(t, kube, pods)
	writeEndpointSlices(t, kube, objs, pods)
	setLoadBalancerIngress(t, kube)
	t.Logf("API server and corpus ready in %v", time.Since(start).Round(time.Millisecond))

	const mesh = "rootNamespace: istio-system\n"
	phase := time.Now()
	// istiod's gateway controller and status writer, as installed (testenv turns them off). It
	// writes once it holds its per-revision Lease istio-gateway-status-leader in POD_NAMESPACE
	// (istio-system; revision "default"), which nobody holds here, so at once. Its deployment
	// controller stays off, and so does hyper's (--gateway-deployment=false): the corpus holds
	// the Services, so both see the same ones.
	istiod := testenv.IstiodForTest(t, k, mesh, "PILOT_ENABLE_GATEWAY_API=true", "PILOT_ENABLE_GATEWAY_API_STATUS=true")
	ref := settledGatewayStatus(t, kube, "istiod", expected)
	istiod.Stop()
	t.Logf("istiod: %d statuses settled in %v", len(ref), time.Since(phase).Round(time.Millisecond))

	// What istiod wrote must not pass for ours: Sailplane writes nothing that is already there.
	clearGatewayStatus(t, kube)
	phase = time.Now()
	startDifferentialHyper(t, k, mesh, "--gateway-deployment=false")
	ours := settledGatewayStatus(t, kube, "hyper", expected)
	t.Logf("hyper: %d statuses settled in %v", len(ours), time.Since(phase).Round(time.Millisecond))
	dumpGatewayStatus(t, ref, ours)

	diffs, compared := compareGatewayStatus(ref, ours)
	unexpected, unused := allow.Filter(diffs)
	t.Logf("compared %d objects, %d properties: %d differences, %d not in the allowlist; %v in all",
		len(ref), compared, len(diffs), len(unexpected), time.Since(start).Round(time.Millisecond))
	if len(unexpected) > 0 {
		var b strings.Builder
		for _, d := range unexpected {
			b.WriteString(d.String())
		}
		t.Errorf("%d differences from istiod not in %s (fix them, or allow them with a reason):\n%s",
			len(unexpected), allow.File, b.String())
	}
	if len(unused) > 0 {
		var s []string
		for _, e := range unused {
			s = append(s, "  "+e.String())
		}
		t.Errorf("%d allowlist entries matched no difference: remove them from %s\n%s", len(unused), allow.File, strings.Join(s, "\n"))
	}
}

// expectedStatuses are the objects of the corpus either control plane must write a status to
// before its status can be taken as settled: the GatewayClasses and Gateways of class istio,
// the ListenerSets, and the routes with a parent that is a Gateway of class istio. (Whether
// each side writes to the others too is compared like the rest.)
func expectedStatuses(objs []*unstructured.Unstructured) []string {
	ours := map[string]bool{} // Gateways of class istio, by namespace/name
	for _, o := range objs {
		if c, _, _ := unstructured.NestedString(o.Object, "spec", "gatewayClassName"); o.GetKind() == "Gateway" && c == "istio" {
			ours[nsOf(o)+"/"+o.GetName()] = true
		}
	}
	var out []string
	for _, o := range objs {
		k := o.GetKind() + "/" + statusObjectName(o.GetNamespace(), o.GetName())
		switch o.GetKind() {
		case "GatewayClass":
			if c, _, _ := unstructured.NestedString(o.Object, "spec", "controllerName"); c == "istio.io/gateway-controller" {
				out = append(out, k)
			}
		case "Gateway":
			if ours[nsOf(o)+"/"+o.GetName()] {
				out = append(out, k)
			}
		case "ListenerSet":
			out = append(out, k)
		case "HTTPRoute", "GRPCRoute", "TCPRoute", "TLSRoute":
			refs, _, _ := unstructured.NestedSlice(o.Object, "spec", "parentRefs")
			for _, r := range refs {
				m, _ := r.(map[string]any)
				ns, _ := m["namespace"].(string)
				name, _ := m["name"].(string)
				if kind, _ := m["kind"].(string); strOr(kind, "Gateway") == "Gateway" && ours[strOr(ns, nsOf(o))+"/"+name] {
					out = append(out, k)
					break
				}
			}
		}
	}
	return out
}

func strOr(s, dflt string) string {
	if s == "" {
		return dflt
	}
	return s
}

// statusObjectName is namespace/name, or the name of a cluster-scoped object.
func statusObjectName(ns, name string) string {
	if ns == "" {
		return name
	}
	return ns + "/" + name
}

// setLoadBalancerIngress writes loadBalancerIngress to the Services' status.
func setLoadBalancerIngress(t *testing.T, kube *framework.Kube) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, key := range slices.Sorted(maps.Keys(loadBalancerIngress)) {
		ns, name, _ := strings.Cut(key, "/")
		api := kube.Clientset.CoreV1().Services(ns)
		svc, err := api.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("service %s: %v", key, err)
		}
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{loadBalancerIngress[key]}
		if _, err := api.UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("service %s status: %v", key, err)
		}
	}
}

// gatewayStatuses reads the status of every Gateway API object, by Kind/namespace/name.
func gatewayStatuses(ctx context.Context, kube *framework.Kube) (map[string]map[string]any, error) {
	out := map[string]map[string]any{}
	for _, k := range gatewayStatusKinds {
		list, err := kube.Dynamic.Resource(k.gvr).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", k.gvr.Resource, err)
		}
		for _, o := range list.Items {
			st, _, _ := unstructured.NestedMap(o.Object, "status")
			out[k.kind+"/"+statusObjectName(o.GetNamespace(), o.GetName())] = st
		}
	}
	return out, nil
}

// settledGatewayStatus waits until server has written a status to every expected object and
// then nothing changes for two seconds (both write in batches: istiod as its collections
// recompute, hyper debounced by 100 ms, at most 1 s; a Gateway's attachedRoutes may follow its
// first write), and returns the statuses.
func settledGatewayStatus(t *testing.T, kube *framework.Kube, server string, expected []string) map[string]map[string]any {
	t.Helper()
	const quiet = 2 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	var prev map[string]map[string]any
	var since time.Time
	var missing []string
	for {
		cur, err := gatewayStatuses(ctx, kube)
		if err != nil {
			t.Fatalf("%s: %v", server, err)
		}
		missing = missing[:0]
		for _, k := range expected {
			if !statusWritten(cur[k]) {
				missing = append(missing, k)
			}
		}
		switch {
		case len(missing) > 0 || !reflect.DeepEqual(cur, prev):
			prev, since = cur, time.Now()
		case time.Since(since) >= quiet:
			return cur
		}
		select {
		case <-ctx.Done():
			if len(missing) > 0 {
				t.Fatalf("%s wrote no status to %d objects within the deadline: %s", server, len(missing), strings.Join(missing, ", "))
			}
			t.Fatalf("%s: the status did not settle (quiet for %v) within the deadline", server, quiet)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// statusWritten: a controller wrote this status (a route's parents, a policy's ancestors, a
// condition that is not the CRD's default "Pending").
func statusWritten(st map[string]any) bool {
	for _, f := range []string{"parents", "ancestors"} {
		if l, ok := st[f].([]any); ok && len(l) > 0 {
			return true
		}
	}
	conds, _ := st["conditions"].([]any)
	for _, c := range conds {
		if m, _ := c.(map[string]any); m != nil && m["reason"] != "Pending" {
			return true
		}
	}
	return false
}

// clearGatewayStatus empties the status of every Gateway API object (a route's parents and a
// policy's ancestors are required: an empty list).
func clearGatewayStatus(t *testing.T, kube *framework.Kube) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, k := range gatewayStatusKinds {
		api := kube.Dynamic.Resource(k.gvr)
		list, err := api.List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("list %s: %v", k.gvr.Resource, err)
		}
		for _, o := range list.Items {
			st := map[string]any{}
			if k.required != "" {
				st[k.required] = []any{}
			}
			o.Object["status"] = st
			var err error
			if o.GetNamespace() == "" {
				_, err = api.UpdateStatus(ctx, &o, metav1.UpdateOptions{})
			} else {
				_, err = api.Namespace(o.GetNamespace()).UpdateStatus(ctx, &o, metav1.UpdateOptions{})
			}
			if err != nil {
				t.Fatalf("clear the status of %s %s: %v", k.kind, o.GetName(), err)
			}
		}
	}
}

// compareGatewayStatus compares each object's status property by property (see flattenStatus)
// and returns the differences and how many properties were compared.
func compareGatewayStatus(ref, ours map[string]map[string]any) ([]xdsdiff.Difference, int) {
	var diffs []xdsdiff.Difference
	compared := 0
	for _, obj := range slices.Sorted(maps.Keys(ref)) {
		kind, name, _ := strings.Cut(obj, "/")
		a, b := flattenStatus(ref[obj]), flattenStatus(ours[obj])
		paths := slices.Sorted(maps.Keys(a))
		for p := range b {
			if _, ok := a[p]; !ok {
				paths = append(paths, p)
			}
		}
		slices.Sort(paths)
		for _, p := range paths {
			compared++
			va, okA := a[p]
			vb, okB := b[p]
			if okA && okB && va == vb {
				continue
			}
			d := xdsdiff.Difference{Case: "gateway-status", Type: kind, Resource: name, Path: p, Istiod: va, Ours: vb}
			if !okA {
				d.Istiod = "(absent)"
			}
			if !okB {
				d.Ours = "(absent)"
			}
			diffs = append(diffs, d)
		}
	}
	return diffs, compared
}

// flattenStatus maps each compared leaf of a status to its value as JSON. Lists whose order
// carries no meaning are keyed by what identifies an entry: conditions by type, listeners by
// name, parents (and policies' ancestors) by parentRef (namespace/kind/name/section/port, each
// "-" when unset) and controllerName. Other lists (addresses, supportedKinds) keep their index: their order is
// compared. Messages and lastTransitionTime are left out.
func flattenStatus(st map[string]any) map[string]string {
	out := map[string]string{}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				if k == "message" || k == "lastTransitionTime" {
					continue
				}
				walk(join(path, k), e)
			}
		case []any:
			for i, e := range v {
				walk(fmt.Sprintf("%s[%s]", path, entryKey(e, i)), e)
			}
			if len(v) == 0 {
				out[path] = "[]"
			}
		default:
			b, _ := json.Marshal(v)
			out[path] = string(b)
		}
	}
	walk("", st)
	return out
}

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

func entryKey(e any, i int) string {
	m, _ := e.(map[string]any)
	if m == nil {
		return fmt.Sprint(i)
	}
	ref, ok := m["parentRef"].(map[string]any)
	if !ok {
		ref, ok = m["ancestorRef"].(map[string]any) // a policy's ancestor
	}
	if ok {
		var parts []string
		for _, f := range []string{"namespace", "kind", "name", "sectionName", "port"} {
			parts = append(parts, strOr(fmt.Sprint(valueOr(ref[f], "-")), "-"))
		}
		return strings.Join(parts, "/") + " " + fmt.Sprint(m["controllerName"])
	}
	if t, ok := m["type"].(string); ok {
		if _, isCond := m["status"]; isCond {
			return t
		}
	}
	if n, ok := m["name"].(string); ok {
		if _, isListener := m["attachedRoutes"]; isListener {
			return n
		}
	}
	return fmt.Sprint(i)
}

func valueOr(v, dflt any) any {
	if v == nil {
		return dflt
	}
	return v
}

// dumpGatewayStatus writes both sides' statuses under $SAILPLANE_DIFF_DUMP/gateway-status.
func dumpGatewayStatus(t *testing.T, ref, ours map[string]map[string]any) {
	root := os.Getenv("SAILPLANE_DIFF_DUMP")
	if root == "" {
		return
	}
	dir := filepath.Join(root, "gateway-status")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for side, s := range map[string]map[string]map[string]any{"istiod": ref, "ours": ours} {
		b, err := json.MarshalIndent(s, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, side+".json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("wrote %s/{istiod,ours}.json", dir)
}
