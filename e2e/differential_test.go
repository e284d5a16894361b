package e2e

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/prototext"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/tools/testenv"
	"sailplane.dev/tools/xdsdiff"
)

// differentialDir holds one folder per case: kube.yaml (what the API server holds), mesh.yaml
// (the mesh config both control planes read) and nodes.yaml (the proxies to connect as).
const differentialDir = "testdata/differential"

// istioVersion is the ISTIO_VERSION the nodes announce: istiod shapes some of its output by
// the proxy's version, and a current pilot-agent sends its own.
const istioVersion = "1.29.0"

// TestDifferentialIstiod runs Istio's istiod and Sailplane's hyper on the same API server for
// each case of testdata/differential, connects to both as the same nodes, and compares what
// they send (CDS, EDS, LDS, RDS) with xdsdiff. A difference not in the allowlist
// (testdata/differential/allowlist.yaml, each entry with its reason) fails the case; so does,
// once every case ran, an allowlist entry that matched nothing. SAILPLANE_DIFF_DUMP=<dir>
// writes both servers' snapshots there as JSON, <case>/<node>.{istiod,ours}.json.
func TestDifferentialIstiod(t *testing.T) {
	allow, err := xdsdiff.LoadAllowlist(filepath.Join(differentialDir, "allowlist.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(differentialDir)
	if err != nil {
		t.Fatal(err)
	}
	var cases []string
	for _, e := range entries {
		if e.IsDir() {
			cases = append(cases, e.Name())
		}
	}
	if len(cases) == 0 {
		t.Fatalf("no cases under %s", differentialDir)
	}
	used := map[int]bool{} // allowlist entries that matched, by index
	compared := 0          // cases that got as far as comparing every node
	var total xdsdiff.Stats
	start := time.Now()
	for _, name := range cases {
		t.Run(name, func(t *testing.T) {
			diffs, stats := runDifferentialCase(t, name)
			if t.Failed() {
				return // a node was not compared: its entries would look stale
			}
			compared++
			total.Resources += stats.Resources
			total.Properties += stats.Properties
			unexpected, unused := allow.Filter(diffs)
			for _, e := range allow.Entries {
				if !slices.ContainsFunc(unused, func(u xdsdiff.Entry) bool { return u.Index == e.Index }) {
					used[e.Index] = true
				}
			}
			t.Logf("compared %d resources, %d properties; %d differences, %d not in the allowlist",
				stats.Resources, stats.Properties, len(diffs), len(unexpected))
			if len(unexpected) > 0 {
				var b strings.Builder
				for _, d := range unexpected {
					b.WriteString(d.String())
				}
				t.Errorf("%d differences from istiod not in %s (fix them, or allow them with a reason):\n%s",
					len(unexpected), allow.File, b.String())
			}
		})
	}
	t.Logf("%d cases in %v: compared %d resources, %d properties", compared, time.Since(start).Round(time.Second),
		total.Resources, total.Properties)
	// An entry is stale only if no case used it; with some cases filtered out (-run) or
	// failed before comparing, it may belong to one of them.
	if compared == len(cases) {
		var stale []string
		for _, e := range allow.Entries {
			if !used[e.Index] {
				stale = append(stale, "  "+e.String())
			}
		}
		if len(stale) > 0 {
			t.Errorf("%d allowlist entries matched no difference: remove them from %s\n%s",
				len(stale), allow.File, strings.Join(stale, "\n"))
		}
	}
}

// diffNode is one entry of a case's nodes.yaml: a Pod of kube.yaml to connect as.
type diffNode struct {
	Pod       string `json:"pod"`
	Namespace string `json:"namespace"`
	// Kind is sidecar, router (a gateway) or proxyless (a gRPC client, GENERATOR=grpc).
	Kind string `json:"kind"`
	// Listeners are what a proxyless client dials (host:port), asked for by name.
	Listeners []string `json:"listeners,omitempty"`
	// DNSCapture: the agent captures the pod's DNS (ISTIO_META_DNS_CAPTURE), so the proxy uses
	// the auto-allocated addresses of ServiceEntry hosts without any.
	DNSCapture bool `json:"dnsCapture,omitempty"`
	// Cluster "remote" is a Pod of the case's remote.yaml (CLUSTER_ID remote); empty, of
	// kube.yaml (CLUSTER_ID Kubernetes).
	Cluster string `json:"cluster,omitempty"`
	// Network is the node's NETWORK, as the installation sets it; without it, the Pod's
	// topology.istio.io/network label, as the injector sets it.
	Network string `json:"network,omitempty"`
}

func (n diffNode) name() string { return n.Kind + "/" + n.Namespace + "/" + n.Pod }

// runDifferentialCase starts an API server holding the case's objects, then istiod and hyper on
// it, and returns the differences of every node's snapshots. Each case has its own API server,
// istiod and hyper: together they start in about 4 s here (a case takes 7-9 s in all), and
// nothing of one case can leak into the next, which a shared API server could not promise
// cheaply (without a controller manager a deleted namespace never goes away).
func runDifferentialCase(t *testing.T, name string) ([]xdsdiff.Difference, xdsdiff.Stats) {
	dir := filepath.Join(differentialDir, name)
	read := func(file string) []byte {
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	manifest, mesh := string(read("kube.yaml")), string(read("mesh.yaml"))
	var nodes []diffNode
	if err := yaml.UnmarshalStrict(read("nodes.yaml"), &nodes); err != nil {
		t.Fatalf("%s/nodes.yaml: %v", dir, err)
	}
	objs, err := framework.Decode(manifest)
	if err != nil {
		t.Fatalf("%s/kube.yaml: %v", dir, err)
	}
	pods, err := casePods(objs)
	if err != nil {
		t.Fatalf("%s/kube.yaml: %v", dir, err)
	}

	var opts []testenv.Option
	var istiodEnv []string
	if strings.Contains(manifest, "gateway.networking.k8s.io/") {
		opts = append(opts, testenv.WithGatewayAPICRDs()) // only where used: installing them takes a while
		// testenv's istiod runs without its Gateway API controller; translation (not status,
		// not deployments) is what is compared.
		istiodEnv = append(istiodEnv, "PILOT_ENABLE_GATEWAY_API=true")
	}
	k := testenv.KubeForTest(t, opts...)
	kube := framework.NewKube(t, k.RestConfig())
	// Both control planes keep their leases in their namespace.
	kube.EnsureNamespace(t, "istio-system")
	kube.Apply(t, manifest)
	setPodsRunning(t, kube, pods)
	writeEndpointSlices(t, kube, objs, pods)

	// The objects are in place before either starts, so each one's readiness (caches synced,
	// first state built) means it serves all of them.
	if remote, err := os.ReadFile(filepath.Join(dir, "remote.yaml")); err == nil {
		rpods := startRemoteCluster(t, kube, string(remote), opts)
		for key, p := range rpods {
			pods[remoteCluster+"/"+key] = p
		}
	}

	// meshNetworks.yaml, when the case has one: both read it as a file (istiod's
	// --networksConfig, hyper's meshNetworks beside its mesh file).
	var istiodOpts []testenv.Option
	nets, err := os.ReadFile(filepath.Join(dir, "meshNetworks.yaml"))
	if err == nil {
		istiodOpts = append(istiodOpts, testenv.WithMeshNetworks(string(nets)))
	}
	hyperAddr := startDifferentialHyperNets(t, k, mesh, string(nets))
	istiod := testenv.IstiodForTestWith(t, k, mesh, istiodEnv, istiodOpts...)

	var all []xdsdiff.Difference
	var stats xdsdiff.Stats
	for _, n := range nodes {
		node, err := n.xdsNode(pods)
		if err != nil {
			t.Fatalf("%s/nodes.yaml: %v", dir, err)
		}
		var ref, ours xdsdiff.Snapshot
		var wg sync.WaitGroup
		wg.Go(func() { ref = stableSnapshot(t, "istiod", istiod.XDSAddr(), node) })
		wg.Go(func() { ours = stableSnapshot(t, "hyper", hyperAddr, node) })
		wg.Wait()
		if t.Failed() {
			return nil, stats
		}
		if n.DNSCapture {
			ref = renameAutoAddresses(t, "istiod", istiod.XDSAddr(), node, ref)
			ours = renameAutoAddresses(t, "hyper", hyperAddr, node, ours)
		}
		dumpSnapshots(t, name, n, ref, ours)
		diffs, st, err := xdsdiff.Compare(ref, ours)
		if err != nil {
			t.Fatalf("node %s: %v", n.name(), err)
		}
		for i := range diffs {
			diffs[i].Case, diffs[i].Node = name, n.name()
		}
		t.Logf("node %s: %d resources, %d properties, %d differences", n.name(), st.Resources, st.Properties, len(diffs))
		all = append(all, diffs...)
		dumpDifferences(t, name, n, diffs)
		stats.Resources += st.Resources
		stats.Properties += st.Properties
	}
	return all, stats
}

// remoteCluster is the cluster ID of a case's remote.yaml.
const remoteCluster = "remote"

// startRemoteCluster starts a second API server holding manifest and registers it in the
// primary as cluster "remote" with a kubeconfig Secret (istio/multiCluster=true in
// istio-system), which istiod and hyper both read; it returns the remote's Pods.
func startRemoteCluster(t *testing.T, primary *framework.Kube, manifest string, opts []testenv.Option) map[string]*corev1.Pod {
	t.Helper()
	objs, err := framework.Decode(manifest)
	if err != nil {
		t.Fatalf("remote.yaml: %v", err)
	}
	pods, err := casePods(objs)
	if err != nil {
		t.Fatalf("remote.yaml: %v", err)
	}
	rk := testenv.KubeForTest(t, opts...)
	kube := framework.NewKube(t, rk.RestConfig())
	kube.EnsureNamespace(t, "istio-system")
	kube.Apply(t, manifest)
	setPodsRunning(t, kube, pods)
	writeEndpointSlices(t, kube, objs, pods)
	kubeconfig, err := os.ReadFile(rk.KubeconfigPath())
	if err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "istio-remote-secret-" + remoteCluster, Namespace: "istio-system",
			Labels: map[string]string{"istio/multiCluster": "true"}},
		Data: map[string][]byte{remoteCluster: kubeconfig},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := primary.Clientset.CoreV1().Secrets("istio-system").Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatalf("remote cluster secret: %v", err)
	}
	return pods
}

// startDifferentialHyper starts hyper on k with mesh as its mesh config and extra flags, and
// returns its xDS address once it is ready.
func startDifferentialHyper(t *testing.T, k *testenv.Kube, mesh string, extra ...string) string {
	t.Helper()
	return startDifferentialHyperNets(t, k, mesh, "", extra...)
}

// startDifferentialHyperNets is startDifferentialHyper with meshNetworks (none when empty).
func startDifferentialHyperNets(t *testing.T, k *testenv.Kube, mesh, nets string, extra ...string) string {
	t.Helper()
	dir := t.TempDir()
	framework.WriteFile(t, dir, "mesh.yaml", mesh)
	if nets != "" {
		framework.WriteFile(t, dir, "meshNetworks", nets)
	}
	addrs := distinctFreeAddrs(t, 5)
	xds, monitoring := addrs[0], addrs[4]
	args := []string{"--kubeconfig", k.KubeconfigPath(), "--config-source", "kubernetes", "--mesh-config", filepath.Join(dir, "mesh.yaml"),
		"--xds-listen", xds, "--bus-listen", addrs[1], "--xds-tls-listen", addrs[2], "--webhook-listen", addrs[3],
		"--monitoring-listen", monitoring, "--pod-name", "sailplane-differential"}
	framework.Start(t, dir, framework.Binary(t, "hyper"), append(args, extra...)...)
	framework.WaitReadyAt(t, monitoring)
	return xds
}

// distinctFreeAddrs returns n loopback addresses free a moment ago, all different: each is held
// until the last is picked (framework.FreeAddr, called n times, may return one port twice).
func distinctFreeAddrs(t *testing.T, n int) []string {
	t.Helper()
	var addrs []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		addrs = append(addrs, l.Addr().String())
	}
	return addrs
}

// stableSnapshot fetches what the server at addr sends node until two fetches in a row are
// the same, so that a push still on its way is not taken for the state.
func stableSnapshot(t *testing.T, server, addr string, node framework.XDSNode) xdsdiff.Snapshot {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var prev xdsdiff.Snapshot
	var last error
	for ctx.Err() == nil {
		s, err := framework.FetchXDS(ctx, addr, node, 2*time.Second)
		if err != nil {
			// A server refuses streams until its first full state; retried, as Envoy does.
			last = err
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		if prev != nil {
			d, _, err := xdsdiff.Compare(prev, s)
			if err != nil {
				t.Errorf("%s as %s: %v", server, node.ID, err)
				return nil
			}
			if len(d) == 0 {
				return s
			}
			last = fmt.Errorf("changed between two fetches: %v", d[0])
		}
		prev = s
	}
	t.Errorf("%s as %s: no stable state within a minute: %v", server, node.ID, last)
	return nil
}

// autoRanges are where istiod and Sailplane allocate ServiceEntry addresses.
var autoRanges = []netip.Prefix{netip.MustParsePrefix("240.240.0.0/16"), netip.MustParsePrefix("2001:2::/48")}

// renameAutoAddresses names each auto-allocated address in snap after its host, as the name
// table the same server sends node says: istiod allocates in creation order, Sailplane by hash,
// so only what each does with its own addresses can be compared.
func renameAutoAddresses(t *testing.T, server, addr string, node framework.XDSNode, snap xdsdiff.Snapshot) xdsdiff.Snapshot {
	t.Helper()
	nt, err := nameTableOf(addr, node)
	if err != nil {
		t.Fatalf("%s name table for %s: %v", server, node.ID, err)
	}
	names := map[string]string{}
	for host, info := range nt.GetTable() {
		for _, ip := range info.GetIps() {
			if a, err := netip.ParseAddr(ip); err == nil && slices.ContainsFunc(autoRanges, func(p netip.Prefix) bool { return p.Contains(a) }) {
				names[ip] = "auto(" + host + ")"
			}
		}
	}
	if len(names) == 0 {
		t.Fatalf("%s gave %s, which captures DNS, no auto-allocated address: the case tests nothing", server, node.ID)
	}
	out, err := xdsdiff.RenameAddresses(snap, names)
	if err != nil {
		t.Fatalf("%s as %s: %v", server, node.ID, err)
	}
	return out
}

// dumpSnapshots writes both snapshots as JSON under $SAILPLANE_DIFF_DUMP, if set.
func dumpSnapshots(t *testing.T, caseName string, n diffNode, ref, ours xdsdiff.Snapshot) {
	root := os.Getenv("SAILPLANE_DIFF_DUMP")
	if root == "" {
		return
	}
	dir := filepath.Join(root, caseName)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	base := strings.ReplaceAll(n.name(), "/", "_")
	for side, s := range map[string]xdsdiff.Snapshot{"istiod": ref, "ours": ours} {
		out := map[string][]json.RawMessage{}
		for typ, rs := range s {
			for _, a := range rs {
				b, err := protojson.MarshalOptions{Indent: "  "}.Marshal(a)
				if err != nil {
					// An extension type not linked in: protojson cannot show it, text format
					// shows it with that Any undecoded.
					b, _ = json.Marshal(map[string]string{"@type": a.GetTypeUrl(), "json": err.Error(), "text": prototext.Format(a)})
				}
				out[typ] = append(out[typ], b)
			}
		}
		b, err := json.MarshalIndent(out, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, base+"."+side+".json")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("wrote %s/%s.{istiod,ours}.json", dir, base)
}

// dumpDifferences writes a node's differences under $SAILPLANE_DIFF_DUMP as JSON, for whoever
// writes the allowlist.
func dumpDifferences(t *testing.T, caseName string, n diffNode, diffs []xdsdiff.Difference) {
	root := os.Getenv("SAILPLANE_DIFF_DUMP")
	if root == "" {
		return
	}
	b, err := json.MarshalIndent(diffs, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(root, caseName, strings.ReplaceAll(n.name(), "/", "_")+".differences.json")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// casePods are the Pods of a case, by namespace/name; each must have status.podIP.
func casePods(objs []*unstructured.Unstructured) (map[string]*corev1.Pod, error) {
	pods := map[string]*corev1.Pod{}
	for _, o := range objs {
		if o.GetKind() != "Pod" {
			continue
		}
		var p corev1.Pod
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &p); err != nil {
			return nil, fmt.Errorf("pod %s: %w", o.GetName(), err)
		}
		if p.Namespace == "" {
			p.Namespace = "default"
		}
		if p.Status.PodIP == "" {
			return nil, fmt.Errorf("pod %s/%s: status.podIP is required (no kubelet gives it one)", p.Namespace, p.Name)
		}
		pods[p.Namespace+"/"+p.Name] = &p
	}
	return pods, nil
}

// setPodsRunning writes each pod's status as a kubelet would once it runs: its IP, Running,
// Ready.
func setPodsRunning(t *testing.T, kube *framework.Kube, pods map[string]*corev1.Pod) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, key := range slices.Sorted(maps.Keys(pods)) {
		want := pods[key]
		api := kube.Clientset.CoreV1().Pods(want.Namespace)
		cur, err := api.Get(ctx, want.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("pod %s: %v", key, err)
		}
		now := metav1.Now()
		cur.Status = corev1.PodStatus{
			Phase:  corev1.PodRunning,
			HostIP: "198.18.0.1", HostIPs: []corev1.HostIP{{IP: "198.18.0.1"}},
			PodIP: want.Status.PodIP, PodIPs: []corev1.PodIP{{IP: want.Status.PodIP}},
			StartTime: &now,
			Conditions: []corev1.PodCondition{
				{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			},
		}
		if _, err := api.UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("pod %s status: %v", key, err)
		}
	}
}

// writeEndpointSlices does the endpoint-slice controller's work (there is no controller
// manager): one slice for each Service with a selector that kube.yaml gives none, listing the
// Pods the selector matches with the Service's ports resolved to their target ports.
func writeEndpointSlices(t *testing.T, kube *framework.Kube, objs []*unstructured.Unstructured, pods map[string]*corev1.Pod) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	given := map[string]bool{}
	for _, o := range objs {
		if o.GetKind() == "EndpointSlice" {
			given[nsOf(o)+"/"+o.GetLabels()[discoveryv1.LabelServiceName]] = true
		}
	}
	for _, o := range objs {
		if o.GetKind() != "Service" {
			continue
		}
		var svc corev1.Service
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &svc); err != nil {
			t.Fatalf("service %s: %v", o.GetName(), err)
		}
		svc.Namespace = nsOf(o)
		if len(svc.Spec.Selector) == 0 || given[svc.Namespace+"/"+svc.Name] {
			continue
		}
		slice := endpointSliceFor(&svc, pods)
		if _, err := kube.Clientset.DiscoveryV1().EndpointSlices(svc.Namespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
			t.Fatalf("endpointslice of %s/%s: %v", svc.Namespace, svc.Name, err)
		}
	}
}

func nsOf(o *unstructured.Unstructured) string {
	if ns := o.GetNamespace(); ns != "" {
		return ns
	}
	return "default"
}

func endpointSliceFor(svc *corev1.Service, pods map[string]*corev1.Pod) *discoveryv1.EndpointSlice {
	sel := labels.SelectorFromSet(svc.Spec.Selector)
	var matched []*corev1.Pod
	for _, key := range slices.Sorted(maps.Keys(pods)) {
		if p := pods[key]; p.Namespace == svc.Namespace && sel.Matches(labels.Set(p.Labels)) {
			matched = append(matched, p)
		}
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: svc.Name + "-differential", Namespace: svc.Namespace, Labels: map[string]string{
			discoveryv1.LabelServiceName: svc.Name,
			discoveryv1.LabelManagedBy:   "endpointslice-controller.k8s.io",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for _, sp := range svc.Spec.Ports {
		port := targetPort(sp, matched)
		slice.Ports = append(slice.Ports, discoveryv1.EndpointPort{
			Name: ptr(sp.Name), Port: ptr(port), Protocol: ptr(orTCP(sp.Protocol)), AppProtocol: sp.AppProtocol,
		})
	}
	for _, p := range matched {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{p.Status.PodIP},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: p.Namespace, Name: p.Name},
		})
	}
	return slice
}

// targetPort resolves a Service port's targetPort: a number, or a container port's name in the
// (first) matching pod; unset, the port itself.
func targetPort(sp corev1.ServicePort, pods []*corev1.Pod) int32 {
	switch {
	case sp.TargetPort.Type == intstr.Int && sp.TargetPort.IntVal != 0:
		return sp.TargetPort.IntVal
	case sp.TargetPort.Type == intstr.String && sp.TargetPort.StrVal != "":
		for _, p := range pods {
			for _, c := range p.Spec.Containers {
				for _, cp := range c.Ports {
					if cp.Name == sp.TargetPort.StrVal {
						return cp.ContainerPort
					}
				}
			}
		}
	}
	return sp.Port
}

func orTCP(p corev1.Protocol) corev1.Protocol {
	if p == "" {
		return corev1.ProtocolTCP
	}
	return p
}

// xdsNode is the node a pilot-agent in the pod would announce (Istio's node ID and the
// metadata its bootstrap carries).
func (n diffNode) xdsNode(pods map[string]*corev1.Pod) (framework.XDSNode, error) {
	ns := n.Namespace
	if ns == "" {
		ns = "default"
	}
	key, clusterID := ns+"/"+n.Pod, "Kubernetes"
	switch n.Cluster {
	case "":
	case remoteCluster:
		key, clusterID = remoteCluster+"/"+key, remoteCluster
	default:
		return framework.XDSNode{}, fmt.Errorf("node %s: cluster %q: want empty or %q", n.name(), n.Cluster, remoteCluster)
	}
	p := pods[key]
	if p == nil {
		return framework.XDSNode{}, fmt.Errorf("node %s: no such Pod in kube.yaml (remote.yaml for cluster remote)", n.name())
	}
	kind := n.Kind
	switch kind {
	case "sidecar", "proxyless":
		kind = "sidecar"
	case "router":
	default:
		return framework.XDSNode{}, fmt.Errorf("node %s: kind %q: want sidecar, router or proxyless", n.name(), n.Kind)
	}
	if (n.Kind == "proxyless") != (len(n.Listeners) > 0) {
		return framework.XDSNode{}, fmt.Errorf("node %s: listeners are for (and required by) kind proxyless", n.name())
	}
	ip := p.Status.PodIP
	sa := p.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	workload := p.Labels["app"]
	if workload == "" {
		workload = p.Name
	}
	podLabels := map[string]any{}
	for k, v := range p.Labels {
		podLabels[k] = v
	}
	var ports []map[string]any
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			port := map[string]any{"containerPort": cp.ContainerPort, "protocol": string(orTCP(cp.Protocol))}
			if cp.Name != "" {
				port["name"] = cp.Name
			}
			ports = append(ports, port)
		}
	}
	podPorts, _ := json.Marshal(ports)
	md := map[string]any{
		"NAMESPACE":         ns,
		"NAME":              p.Name,
		"LABELS":            podLabels,
		"SERVICE_ACCOUNT":   sa,
		"CLUSTER_ID":        clusterID,
		"MESH_ID":           "cluster.local",
		"ISTIO_VERSION":     istioVersion,
		"INTERCEPTION_MODE": "REDIRECT",
		"WORKLOAD_NAME":     workload,
		"OWNER":             "kubernetes://apis/apps/v1/namespaces/" + ns + "/deployments/" + workload,
		"INSTANCE_IPS":      ip,
		"POD_PORTS":         string(podPorts),
	}
	if nw := cmp.Or(n.Network, p.Labels["topology.istio.io/network"]); nw != "" {
		md["NETWORK"] = nw // ISTIO_META_NETWORK, which the injector takes from the pod's label
	}
	if n.Kind == "proxyless" {
		md["GENERATOR"] = "grpc"
	}
	if n.DNSCapture {
		md["DNS_CAPTURE"] = "true"
	}
	return framework.XDSNode{
		ID:        fmt.Sprintf("%s~%s~%s.%s~%s.svc.cluster.local", kind, ip, p.Name, ns, ns),
		Metadata:  md,
		Listeners: n.Listeners,
	}, nil
}
