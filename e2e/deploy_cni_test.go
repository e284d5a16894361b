package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"sigs.k8s.io/yaml"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/tools/testenv"
)

// TestDeployCNI checks deploy/cni (CNI mode), which deployOverlays leaves out since its node
// DaemonSet cannot be "restricted" (it writes the node's CNI folders): the DaemonSet mounts
// only /opt/cni/bin and /etc/cni/net.d, runs the sailplane/agent-init image skaffold builds as
// root with no capability, no privilege and a read-only root filesystem, its arguments are flags
// of `sailplane-cni install`, its probes ask its declared port; the injection values are
// deploy/base/injection/values with pilot.cni.enabled. On a real API server the overlay applies
// without warnings, the DaemonSet's pod is admitted, and its service account may get pods (the
// plugin), list, watch and delete them and create events (the repair loop), and nothing more.
func TestDeployCNI(t *testing.T) {
	objs := kustomizeBuild(t, "cni")
	var ds *unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "DaemonSet" && o.GetName() == "sailplane-cni-node" {
			ds = o
		}
	}
	if ds == nil {
		t.Fatal("deploy/cni: no DaemonSet sailplane-cni-node")
	}
	tmpl, _ := podTemplate(t, ds)
	var hostPaths []string
	for _, v := range tmpl.Spec.Volumes {
		if v.HostPath != nil {
			hostPaths = append(hostPaths, v.HostPath.Path)
		}
	}
	if slices.Sort(hostPaths); !slices.Equal(hostPaths, []string{"/etc/cni/net.d", "/opt/cni/bin"}) {
		t.Errorf("deploy/cni: the DaemonSet mounts host paths %v, want /etc/cni/net.d and /opt/cni/bin only", hostPaths)
	}
	if tmpl.Spec.HostNetwork || tmpl.Spec.HostPID {
		t.Error("deploy/cni: the DaemonSet uses the host's network or PID namespace; it needs neither")
	}
	if len(tmpl.Spec.Containers) != 1 || len(tmpl.Spec.InitContainers) != 0 {
		t.Fatalf("deploy/cni: the DaemonSet has %d containers, %d init containers; want the installer alone", len(tmpl.Spec.Containers), len(tmpl.Spec.InitContainers))
	}
	c := tmpl.Spec.Containers[0]
	if c.Image != "sailplane/agent-init" {
		t.Errorf("deploy/cni: the installer runs %s, want sailplane/agent-init (which holds sailplane-cni)", c.Image)
	}
	sc := c.SecurityContext
	switch {
	case sc == nil:
		t.Error("deploy/cni: the installer has no securityContext")
	case sc.Privileged != nil && *sc.Privileged, sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Error("deploy/cni: the installer may be privileged or escalate")
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
		t.Errorf("deploy/cni: the installer's capabilities %+v, want all dropped and none added", sc.Capabilities)
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem, sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
		t.Error("deploy/cni: the installer's root filesystem is writable or its seccomp profile is not RuntimeDefault")
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := c.Resources.Requests[r]; !ok {
			t.Errorf("deploy/cni: the installer requests no %s", r)
		}
	}
	if _, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok || c.ReadinessProbe == nil || c.LivenessProbe == nil {
		t.Error("deploy/cni: the installer lacks a memory limit or probes")
	}
	for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
		if port, ok := probePort(p); ok && !hasPort(c, port) {
			t.Errorf("deploy/cni: a probe asks port %d, which the installer does not declare", port)
		}
	}
	if !slices.Equal(c.Command, []string{"/usr/local/bin/sailplane-cni", "install"}) {
		t.Errorf("deploy/cni: the installer runs %q, want sailplane-cni install", c.Command)
	}
	help := installHelp(t)
	for _, arg := range c.Args {
		flag, _, _ := strings.Cut(arg, "=")
		if !regexp.MustCompile(`(?m)^\s+-` + regexp.QuoteMeta(strings.TrimLeft(flag, "-")) + `\b`).MatchString(help) {
			t.Errorf("deploy/cni: %s is not a flag of sailplane-cni install", flag)
		}
	}

	// skaffold builds the image (the installer's, and the injected istio-init's) and deploys the
	// overlay.
	data, err := os.ReadFile("../skaffold.yaml")
	if err != nil {
		t.Fatal(err)
	}
	type artifact struct {
		Image  string
		Docker struct {
			Target    string
			BuildArgs map[string]string `json:"buildArgs"`
		}
	}
	type profile struct {
		Name      string
		Manifests struct{ Kustomize struct{ Paths []string } }
	}
	var sk struct {
		Build    struct{ Artifacts []artifact }
		Profiles []profile
	}
	if err := yaml.Unmarshal(data, &sk); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(sk.Build.Artifacts, func(a artifact) bool {
		return a.Image == "sailplane/agent-init" && a.Docker.Target == "agent-init" && a.Docker.BuildArgs["SERVICE"] == "agent"
	}) {
		t.Error("skaffold.yaml: no artifact sailplane/agent-init (deploy/Dockerfile target agent-init, SERVICE agent)")
	}
	if !slices.ContainsFunc(sk.Profiles, func(p profile) bool {
		return p.Name == "cni" && slices.Equal(p.Manifests.Kustomize.Paths, []string{"deploy/cni"})
	}) {
		t.Error("skaffold.yaml: no profile cni deploying deploy/cni")
	}
	if df, err := os.ReadFile("../deploy/Dockerfile"); err != nil || !regexp.MustCompile(`(?m)^FROM \S+ AS agent-init$`).Match(df) || !strings.Contains(string(df), "nftables iptables iproute2") {
		t.Errorf("deploy/Dockerfile: no stage agent-init installing nftables iptables iproute2 (%v)", err)
	}

	// The values: the base's, with CNI mode on.
	baseRaw, err := os.ReadFile("../deploy/base/injection/values")
	if err != nil {
		t.Fatal(err)
	}
	var base, got map[string]any
	if err := json.Unmarshal(baseRaw, &base); err != nil {
		t.Fatal(err)
	}
	base["pilot"] = map[string]any{"cni": map[string]any{"enabled": true}}
	cm := slices.IndexFunc(objs, func(o *unstructured.Unstructured) bool {
		return o.GetKind() == "ConfigMap" && o.GetName() == "istio-sidecar-injector"
	})
	if cm < 0 {
		t.Fatal("deploy/cni: no ConfigMap istio-sidecar-injector")
	}
	raw, _, _ := unstructured.NestedString(objs[cm].Object, "data", "values")
	if err := json.Unmarshal([]byte(raw), &got); err != nil {
		t.Fatalf("deploy/cni: values: %v", err)
	}
	if !reflect.DeepEqual(got, base) {
		t.Errorf("deploy/cni: injection values are not deploy/base/injection/values with pilot.cni.enabled true:\n%s", raw)
	}

	// On a real API server.
	k := testenv.KubeForTest(t, testenv.WithoutIstioCRDs())
	warned := &testenv.WarningRecorder{}
	cfg := k.RestConfig()
	cfg.WarningHandler = warned
	kube := framework.NewKube(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, crd := range kustomizeBuild(t, "crds") {
		if err := serverSideApply(ctx, kube, crd, false); err != nil {
			t.Fatalf("deploy/crds: %s: %v", ref(crd), err)
		}
	}
	for _, o := range namespacesOf(objs) {
		if err := serverSideApply(ctx, kube, o, false); err != nil {
			t.Fatal(err)
		}
	}
	warned.Take()
	for _, o := range objs {
		if o.GetKind() == "Namespace" || o.GetKind() == "CustomResourceDefinition" {
			continue
		}
		// The CRDs' Established condition is not awaited: the overlay holds none of their
		// objects.
		if err := serverSideApply(ctx, kube, o, false); err != nil {
			t.Errorf("deploy/cni: %s: %v", ref(o), err)
		}
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "cni-node", Namespace: ds.GetNamespace(), Labels: tmpl.Labels}, Spec: tmpl.Spec}
	if _, err := kube.Clientset.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("deploy/cni: the DaemonSet's pod: %v", err)
	}
	if w := warned.Take(); len(w) > 0 {
		t.Errorf("deploy/cni: the API server warned:\n%s", strings.Join(w, "\n"))
	}
	allowed := func(a access) bool {
		t.Helper()
		review, err := kube.Clientset.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
			User:               "system:serviceaccount:istio-system:sailplane-cni",
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:istio-system", "system:authenticated"},
			ResourceAttributes: &authzv1.ResourceAttributes{Verb: a.verb, Group: a.group, Resource: a.resource, Subresource: a.subresource, Namespace: a.namespace, Name: a.name},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return review.Status.Allowed
	}
	// get: the plugin; list, watch, delete and events: the repair loop.
	for _, a := range []access{
		{verb: "get", resource: "pods", namespace: "demo", name: "app"},
		{verb: "list", resource: "pods"},
		{verb: "watch", resource: "pods"},
		{verb: "delete", resource: "pods", namespace: "demo", name: "app"},
		{verb: "create", resource: "events", namespace: "demo"},
	} {
		if !allowed(a) {
			t.Errorf("deploy/cni: the account istio-system/sailplane-cni may not %s", a)
		}
	}
	refused := append([]access{
		{verb: "update", resource: "pods", namespace: "demo", name: "app"},
		{verb: "patch", resource: "pods", namespace: "demo", name: "app"},
		{verb: "create", resource: "pods", namespace: "demo"},
		{verb: "update", resource: "pods", subresource: "status", namespace: "demo", name: "app"},
		{verb: "update", resource: "events", namespace: "demo", name: "e"},
		{verb: "get", resource: "namespaces", name: "demo"},
		{verb: "get", resource: "configmaps", namespace: "istio-system", name: "istio"},
	}, neverAllowed...)
	for _, a := range refused {
		if allowed(a) {
			t.Errorf("deploy/cni: the plugin's account istio-system/sailplane-cni may %s", a)
		}
	}
	checkOwnNode(ctx, t, kube, k, tmpl.Spec)
}

// checkOwnNode: with the token of the DaemonSet's pod on node-a (bound to that pod, as the
// kubelet gets it), the account may delete a pod of node-a, and is refused one of node-b by
// deploy/cni's ValidatingAdmissionPolicy, naming why (dry-run deletions, the admission is the
// same).
func checkOwnNode(ctx context.Context, t *testing.T, kube *framework.Kube, k *testenv.Kube, spec corev1.PodSpec) {
	t.Helper()
	cs := kube.Clientset.CoreV1()
	for _, node := range []string{"node-a", "node-b"} {
		if _, err := cs.Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cs.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "demo"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	spec.NodeName = "node-a"
	agentPod, err := cs.Pods("istio-system").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "cni-node-a"}, Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"node-a", "node-b"} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "on-" + node}, Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "app"}}}}
		if _, err := cs.Pods("demo").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	tok, err := cs.ServiceAccounts("istio-system").CreateToken(ctx, spec.ServiceAccountName, &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
		BoundObjectRef: &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: agentPod.Name, UID: agentPod.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(k.RestConfig())
	cfg.BearerToken = tok.Status.Token
	asAgent, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dryRun := metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}
	// The policy takes effect once the API server has loaded it.
	framework.Eventually(t, time.Minute, func() error {
		err := asAgent.CoreV1().Pods("demo").Delete(ctx, "on-node-b", dryRun)
		if err == nil {
			return errors.New("deploy/cni: the node agent of node-a may delete a pod of node-b")
		}
		if !strings.Contains(err.Error(), "sailplane-cni may delete only the pods of its own node") {
			t.Fatalf("deploy/cni: deleting a pod of node-b: %v, want the own-node policy's refusal", err)
		}
		return nil
	})
	if err := asAgent.CoreV1().Pods("demo").Delete(ctx, "on-node-a", dryRun); err != nil {
		t.Errorf("deploy/cni: the node agent of node-a may not delete a pod of node-a: %v", err)
	}
}

// installHelp is `sailplane-cni install -h`: its flags.
func installHelp(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "sailplane-cni")
	if out, err := exec.Command("go", "build", "-o", bin, "sailplane.dev/services/agent/cmd/sailplane-cni").CombinedOutput(); err != nil {
		t.Fatalf("go build sailplane-cni: %v\n%s", err, out)
	}
	out, _ := exec.Command(bin, "install", "-h").CombinedOutput() // -h exits 2 after the usage
	if !strings.Contains(string(out), "-cni-bin-dir") {
		t.Fatalf("sailplane-cni install -h: %s", out)
	}
	return string(out)
}
