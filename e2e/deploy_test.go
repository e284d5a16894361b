package e2e

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authzv1 "k8s.io/api/authorization/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"sailplane.dev/e2e/framework"
	sailplaneschema "sailplane.dev/shared/schema"
	"sailplane.dev/tools/testenv"
)

// deployOverlays are what a user applies (after deploy/crds), each built as `kubectl apply -k`
// builds it.
var deployOverlays = []string{"hyper", "hyper-canary", "microservices", "node-local", "segregated-ca", "agent-example"}

// controlPlaneOverlays install Sailplane itself (agent-example is an application).
var controlPlaneOverlays = []string{"hyper", "microservices", "node-local", "segregated-ca"}

const (
	partOf   = "app.kubernetes.io/part-of"
	sailName = "sailplane"
)

// kustomizeBuild builds deploy/<dir> with kustomize's library, as kubectl does.
func kustomizeBuild(t testing.TB, dir string) []*unstructured.Unstructured {
	t.Helper()
	built, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join("..", "deploy", dir))
	if err != nil {
		t.Fatalf("kustomize build deploy/%s: %v", dir, err)
	}
	manifest, err := built.AsYaml()
	if err != nil {
		t.Fatalf("deploy/%s: %v", dir, err)
	}
	objs, err := framework.Decode(string(manifest))
	if err != nil {
		t.Fatalf("deploy/%s: %v", dir, err)
	}
	return objs
}

func ref(o *unstructured.Unstructured) string {
	if o.GetNamespace() == "" {
		return o.GetKind() + " " + o.GetName()
	}
	return o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
}

// serverSideApply applies obj as `kubectl apply --server-side` does, with unknown and duplicate
// fields refused (Strict) rather than warned about; dryRun only validates and admits it.
func serverSideApply(ctx context.Context, kube *framework.Kube, obj *unstructured.Unstructured, dryRun bool) error {
	ri, err := kube.Resource(obj)
	if err != nil {
		return err
	}
	data, err := json.Marshal(obj.Object)
	if err != nil {
		return err
	}
	opts := metav1.PatchOptions{FieldManager: "sailplane-deploy-test", Force: new(true), FieldValidation: metav1.FieldValidationStrict}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	_, err = ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, opts)
	return err
}

// podTemplate is the pod template of a workload kind, if obj is one.
func podTemplate(t testing.TB, obj *unstructured.Unstructured) (corev1.PodTemplateSpec, bool) {
	t.Helper()
	switch obj.GetKind() {
	case "Deployment", "StatefulSet", "DaemonSet", "Job":
	default:
		return corev1.PodTemplateSpec{}, false
	}
	raw, found, err := unstructured.NestedMap(obj.Object, "spec", "template")
	if err != nil || !found {
		t.Fatalf("%s: no spec.template: %v", ref(obj), err)
	}
	var tmpl corev1.PodTemplateSpec
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &tmpl); err != nil {
		t.Fatalf("%s: spec.template: %v", ref(obj), err)
	}
	return tmpl, true
}

// TestDeployOnAPIServer applies deploy/crds (and deploy/crds/gateway-api) to a real API server,
// then every overlay with server-side dry-run (the server validates and admits each object,
// nothing is stored) in namespaces where Pod Security "restricted" is enforced and warned
// about, and every pod template as a Pod (Pod Security enforces on Pods; workloads only get warnings). Any error and
// any warning fails. There is no controller nor kubelet: nothing runs, the manifests are only
// judged. Then it checks what each service account may do against what each service's code does.
func TestDeployOnAPIServer(t *testing.T) {
	k := testenv.KubeForTest(t, testenv.WithoutIstioCRDs())
	warned := &testenv.WarningRecorder{}
	cfg := k.RestConfig()
	cfg.WarningHandler = warned
	kube := framework.NewKube(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	t.Run("crds", func(t *testing.T) {
		// Istio's, and the Gateway API's (optional, its own kustomization).
		crds := append(kustomizeBuild(t, "crds"), kustomizeBuild(t, "crds/gateway-api")...)
		var names []string
		for _, crd := range crds {
			if err := serverSideApply(ctx, kube, crd, false); err != nil {
				t.Fatalf("deploy/crds: %s: %v", ref(crd), err)
			}
			if crd.GetKind() == "CustomResourceDefinition" {
				names = append(names, crd.GetName())
			}
		}
		crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
		framework.Eventually(t, time.Minute, func() error {
			for _, name := range names {
				crd, err := kube.Dynamic.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				if !established(crd) {
					return fmt.Errorf("CRD %s not Established", name)
				}
			}
			return nil
		})
		if w := warned.Take(); len(w) > 0 {
			t.Errorf("deploy/crds: the API server warned:\n%s", strings.Join(w, "\n"))
		}
	})

	for _, overlay := range deployOverlays {
		t.Run("dry-run/"+overlay, func(t *testing.T) {
			objs := kustomizeBuild(t, overlay)
			for _, ns := range namespacesOf(objs) {
				if err := serverSideApply(ctx, kube, restricted(ns), false); err != nil {
					t.Fatalf("deploy/%s: namespace %s: %v", overlay, ns.GetName(), err)
				}
			}
			warned.Take()
			for _, obj := range objs {
				if err := serverSideApply(ctx, kube, obj, true); err != nil {
					t.Errorf("deploy/%s: %s: %v", overlay, ref(obj), err)
				}
			}
			for _, obj := range objs {
				tmpl, ok := podTemplate(t, obj)
				if !ok {
					continue
				}
				pod := &corev1.Pod{
					TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
					ObjectMeta: metav1.ObjectMeta{Name: obj.GetName() + "-pod", Namespace: obj.GetNamespace(), Labels: tmpl.Labels},
					Spec:       tmpl.Spec,
				}
				_, err := kube.Clientset.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
				if err != nil {
					t.Errorf("deploy/%s: %s as a Pod: %v", overlay, ref(obj), err)
				}
			}
			if w := warned.Take(); len(w) > 0 {
				t.Errorf("deploy/%s: the API server warned:\n%s", overlay, strings.Join(w, "\n"))
			}
		})
	}

	t.Run("rbac", func(t *testing.T) { checkRBAC(ctx, t, kube) })
}

// namespacesOf is every namespace the objects live in, as the manifests' Namespace objects
// when they define one.
func namespacesOf(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	byName := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			byName[o.GetName()] = o.DeepCopy()
		}
	}
	for _, o := range objs {
		if ns := o.GetNamespace(); ns != "" && byName[ns] == nil {
			byName[ns] = &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns},
			}}
		}
	}
	var out []*unstructured.Unstructured
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		out = append(out, byName[name])
	}
	return out
}

// restricted is ns with Pod Security "restricted" enforced and warned about.
func restricted(ns *unstructured.Unstructured) *unstructured.Unstructured {
	ns = ns.DeepCopy()
	l := ns.GetLabels()
	if l == nil {
		l = map[string]string{}
	}
	l["pod-security.kubernetes.io/enforce"] = "restricted"
	l["pod-security.kubernetes.io/warn"] = "restricted"
	ns.SetLabels(l)
	return ns
}

func established(crd *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}

// access is one request a service's Kubernetes client makes.
type access struct {
	verb, group, resource, subresource, namespace, name string
}

// covered reports whether needs include a, or the same access to every namespace and name (a
// cluster-wide list of Secrets covers one namespace's).
func covered(needs []access, a access) bool {
	wide := a
	wide.namespace, wide.name = "", ""
	return slices.Contains(needs, a) || slices.Contains(needs, wide)
}

func (a access) String() string {
	s := a.verb + " " + a.resource
	if a.group != "" {
		s += "." + a.group
	}
	if a.subresource != "" {
		s += "/" + a.subresource
	}
	if a.name != "" {
		s += " " + a.name
	}
	if a.namespace != "" {
		s += " in " + a.namespace
	}
	return s
}

func each(verbs []string, a access) []access {
	var out []access
	for _, v := range verbs {
		a.verb = v
		out = append(out, a)
	}
	return out
}

// serviceNeeds is what each service's code does with its Kubernetes client (informers list and
// watch), read from the code: the RBAC must allow exactly this much. The ca's signing key is in
// caNamespace, its own.
func serviceNeeds(caNamespace string) map[string][]access {
	read := []string{"list", "watch"}
	var ingest []access
	for _, k := range sailplaneschema.IstioConfig {
		ingest = append(ingest, each(read, access{group: k.Group, resource: k.Plural})...)
		ingest = append(ingest, access{verb: "patch", group: k.Group, resource: k.Plural, subresource: "status", namespace: "default", name: "any"})
	}
	ingest = append(ingest, each(read, access{group: "apiextensions.k8s.io", resource: "customresourcedefinitions"})...)
	ingest = append(ingest, each(read, access{resource: "namespaces"})...)
	ingest = append(ingest, each(read, access{resource: "configmaps", namespace: "istio-system", name: "istio"})...)
	ingest = append(ingest, each([]string{"get", "update"}, access{group: "coordination.k8s.io", resource: "leases", namespace: "istio-system", name: "sailplane-config-ingest-status"})...)
	ingest = append(ingest, access{verb: "create", group: "coordination.k8s.io", resource: "leases", namespace: "istio-system"})
	// The Gateway API kinds, and their status writer: every kind read (get after a conflict),
	// Services for the backendRefs and their EndpointSlices (a Gateway's Service has instances:
	// Programmed), the status PUT (ReferenceGrant has none); the CRDs are watched to notice the
	// Gateway API's being installed.
	for _, k := range sailplaneschema.GatewayAPI {
		ingest = append(ingest, each(read, access{group: k.Group, resource: k.Plural})...)
		ingest = append(ingest, access{verb: "get", group: k.Group, resource: k.Plural, namespace: "default", name: "any"})
		if k.Kind != "ReferenceGrant" {
			ingest = append(ingest, access{verb: "update", group: k.Group, resource: k.Plural, subresource: "status", namespace: "default", name: "any"})
		}
	}
	ingest = append(ingest, each(read, access{resource: "services"})...)
	ingest = append(ingest, each(read, access{group: "discovery.k8s.io", resource: "endpointslices"})...)
	// Revision tags: the webhook configurations labelled istio.io/tag (shared/revision.Tags).
	ingest = append(ingest, each(read, access{group: "admissionregistration.k8s.io", resource: "mutatingwebhookconfigurations"})...)
	// The gateway deployment controller: Gateways, classes and ListenerSets watched; the generated objects
	// watched (label-selected), read by name, applied (create and patch) and deleted; ConfigMaps
	// watched (metadata) and read (parametersRef).
	for _, r := range []string{"gateways", "gatewayclasses", "listenersets"} {
		ingest = append(ingest, each(read, access{group: "gateway.networking.k8s.io", resource: r})...)
	}
	for _, r := range []access{{resource: "serviceaccounts"}, {resource: "services"}, {group: "apps", resource: "deployments"},
		{group: "autoscaling", resource: "horizontalpodautoscalers"}, {group: "policy", resource: "poddisruptionbudgets"}} {
		ingest = append(ingest, each(read, r)...)
		r.namespace, r.name = "default", "web-istio"
		ingest = append(ingest, each([]string{"get", "patch", "delete"}, r)...)
		r.name = ""
		ingest = append(ingest, access{verb: "create", group: r.group, resource: r.resource, namespace: r.namespace})
	}
	ingest = append(ingest, each([]string{"get", "list", "watch"}, access{resource: "configmaps"})...)
	// The certificates Gateways and BackendTLSPolicies reference (--gateway-secrets): Secrets
	// watched everywhere (ConfigMaps as above). With the ca segregated, not: that would reach
	// the signing key's namespace.
	if caNamespace == "istio-system" {
		ingest = append(ingest, each(read, access{resource: "secrets"})...)
	}

	var watcher []access
	for _, r := range []string{"services", "pods", "nodes"} {
		watcher = append(watcher, each(read, access{resource: r})...)
	}
	watcher = append(watcher, each(read, access{group: "discovery.k8s.io", resource: "endpointslices"})...)
	watcher = append(watcher, each(read, access{resource: "secrets", namespace: "istio-system"})...) // remote clusters
	// The control-plane namespace alone (its network label), field-selected by name.
	watcher = append(watcher, each([]string{"list", "watch"}, access{resource: "namespaces", name: "istio-system"})...)

	ca := []access{
		{verb: "get", resource: "secrets", namespace: caNamespace, name: "cacerts"},
		{verb: "get", resource: "secrets", namespace: caNamespace, name: "istio-ca-secret"},
		{verb: "update", resource: "secrets", namespace: caNamespace, name: "istio-ca-secret"},
		{verb: "create", resource: "secrets", namespace: caNamespace},
		{verb: "create", resource: "configmaps", namespace: "default"},
		{verb: "create", group: "authentication.k8s.io", resource: "tokenreviews"},
	}
	ca = append(ca, each([]string{"get", "list", "watch", "update"}, access{resource: "configmaps", namespace: "default", name: "istio-ca-root-cert"})...)
	ca = append(ca, each([]string{"get", "list", "watch"}, access{resource: "namespaces"})...)

	// Its revision's configurations, watched, read and updated by name; the injection templates
	// (the mesh config comes from the bus); a dry-run Gateway telling whether the API server
	// reaches it.
	var webhook []access
	for resource, name := range map[string]string{"mutatingwebhookconfigurations": "sailplane-sidecar-injector", "validatingwebhookconfigurations": "sailplane-validator"} {
		webhook = append(webhook, each([]string{"get", "list", "watch", "update"}, access{group: "admissionregistration.k8s.io", resource: resource, name: name})...)
	}
	webhook = append(webhook, each([]string{"list", "watch"}, access{resource: "configmaps", namespace: "istio-system", name: "istio-sidecar-injector"})...)
	webhook = append(webhook, access{verb: "create", group: "networking.istio.io", resource: "gateways", namespace: "istio-system"})

	// credentialName secrets: a field-selected Secret informer, and whether a proxy's account
	// may read its namespace's Secrets; tokens on the TLS xDS port, reviewed as istiod reviews
	// them. With the ca segregated, none of it: listing Secrets everywhere would reach the
	// signing key's namespace.
	var xds []access
	if caNamespace == "istio-system" {
		xds = append(each(read, access{resource: "secrets"}),
			access{verb: "create", group: "authorization.k8s.io", resource: "subjectaccessreviews"},
			access{verb: "create", group: "authentication.k8s.io", resource: "tokenreviews"})
	}
	return map[string][]access{
		"config-ingest": ingest, "endpoint-watcher": watcher, "ca": ca, "webhook": webhook, "xds-server": xds,
	}
}

// neverAllowed is refused to every Sailplane account. Listing Secrets everywhere is xds-server's
// need (credentialName, as istiod) and config-ingest's (the Gateway API status), checked with
// the others' needs.
var neverAllowed = []access{
	{verb: "get", resource: "secrets", namespace: "default", name: "any"},
	{verb: "update", resource: "secrets", namespace: "default", name: "any"},
	{verb: "create", resource: "pods", namespace: "default"},
	{verb: "update", group: "apps", resource: "deployments", namespace: "default", name: "any"},
	{verb: "delete", resource: "secrets", namespace: "default", name: "any"},
	{verb: "update", group: "networking.istio.io", resource: "virtualservices", namespace: "default", name: "any"},
	{verb: "delete", resource: "configmaps", namespace: "default", name: "istio-ca-root-cert"},
	{verb: "update", group: "admissionregistration.k8s.io", resource: "mutatingwebhookconfigurations", name: "someone-else"},
	{verb: "list", group: "admissionregistration.k8s.io", resource: "validatingwebhookconfigurations"},
	{verb: "patch", group: "admissionregistration.k8s.io", resource: "mutatingwebhookconfigurations", name: "sailplane-sidecar-injector"},
	{verb: "update", resource: "configmaps", namespace: "default", name: "someone-else"},
}

// checkRBAC applies the control-plane overlays for real and asks the API server's authorizer
// (SubjectAccessReview) about every request each service makes, and about the requests of the
// other services, which its account must be refused; hyper's account may do what any service
// does. In deploy/segregated-ca the ca's account and key are in sailplane-ca.
func checkRBAC(ctx context.Context, t *testing.T, kube *framework.Kube) {
	apply := func(overlay string) []*unstructured.Unstructured {
		objs := kustomizeBuild(t, overlay)
		for _, obj := range objs {
			if err := serverSideApply(ctx, kube, obj, false); err != nil {
				t.Fatalf("deploy/%s: %s: %v", overlay, ref(obj), err)
			}
		}
		return objs
	}
	// The topologies share account names (istio-system/xds-server…) but not bindings: each is
	// checked with its own bindings alone, as a cluster has one of them installed.
	unbind := func(overlay string, objs []*unstructured.Unstructured) {
		for _, obj := range objs {
			if k := obj.GetKind(); k != "ClusterRoleBinding" && k != "RoleBinding" {
				continue
			}
			ri, err := kube.Resource(obj)
			if err == nil {
				err = ri.Delete(ctx, obj.GetName(), metav1.DeleteOptions{})
			}
			if err != nil {
				t.Fatalf("deploy/%s: deleting %s: %v", overlay, ref(obj), err)
			}
		}
	}
	allowed := func(namespace, account string, a access) bool {
		t.Helper()
		review, err := kube.Clientset.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{
			Spec: authzv1.SubjectAccessReviewSpec{
				User:   "system:serviceaccount:" + namespace + ":" + account,
				Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
				ResourceAttributes: &authzv1.ResourceAttributes{
					Verb: a.verb, Group: a.group, Resource: a.resource, Subresource: a.subresource,
					Namespace: a.namespace, Name: a.name,
				},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("SubjectAccessReview for %s/%s: %v", namespace, account, err)
		}
		return review.Status.Allowed
	}
	for _, topology := range []struct{ overlay, caNamespace string }{
		{"microservices", "istio-system"}, {"node-local", "istio-system"}, {"segregated-ca", "sailplane-ca"},
	} {
		objs := apply(topology.overlay)
		needs := serviceNeeds(topology.caNamespace)
		namespaceOf := func(svc string) string {
			if svc == "ca" {
				return topology.caNamespace
			}
			return "istio-system"
		}
		services := slices.Sorted(maps.Keys(needs))
		for _, svc := range services {
			ns := namespaceOf(svc)
			for _, a := range needs[svc] {
				if !allowed(ns, svc, a) {
					t.Errorf("deploy/%s: service account %s/%s may not %s; its code needs it", topology.overlay, ns, svc, a)
				}
			}
			for _, other := range services {
				for _, a := range needs[other] {
					if other != svc && !covered(needs[svc], a) && allowed(ns, svc, a) {
						t.Errorf("deploy/%s: service account %s/%s may %s (%s's need, not its own)", topology.overlay, ns, svc, a, other)
					}
				}
			}
			for _, a := range neverAllowed {
				if allowed(ns, svc, a) {
					t.Errorf("deploy/%s: service account %s/%s may %s", topology.overlay, ns, svc, a)
				}
			}
		}
		unbind(topology.overlay, objs)
	}
	apply("hyper") // last: it shares some bindings with the topologies, which unbind removed
	for svc, needs := range serviceNeeds("istio-system") {
		for _, a := range needs {
			if !allowed("istio-system", sailName, a) {
				t.Errorf("deploy/hyper: service account istio-system/%s may not %s (%s's need)", sailName, a, svc)
			}
		}
	}
	for _, a := range neverAllowed {
		if allowed("istio-system", sailName, a) {
			t.Errorf("deploy/hyper: service account istio-system/%s may %s", sailName, a)
		}
	}
}

// TestDeployContainersHardened checks what Pod Security "restricted" asks and more on every
// container of every overlay: probes, resource requests and a memory limit, a numeric non-root
// user, a read-only root filesystem, no privilege escalation, no capabilities, RuntimeDefault
// seccomp.
func TestDeployContainersHardened(t *testing.T) {
	for _, overlay := range deployOverlays {
		for _, obj := range kustomizeBuild(t, overlay) {
			tmpl, ok := podTemplate(t, obj)
			if !ok {
				continue
			}
			for _, problem := range hardeningProblems(tmpl.Spec) {
				t.Errorf("deploy/%s: %s: %s", overlay, ref(obj), problem)
			}
		}
	}
}

func hardeningProblems(pod corev1.PodSpec) []string {
	var problems []string
	psc := pod.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	check := func(c corev1.Container, probed bool) {
		bad := func(format string, args ...any) {
			problems = append(problems, fmt.Sprintf("container %s: ", c.Name)+fmt.Sprintf(format, args...))
		}
		if probed && c.ReadinessProbe == nil {
			bad("no readinessProbe")
		}
		if probed && c.LivenessProbe == nil {
			bad("no livenessProbe")
		}
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if _, ok := c.Resources.Requests[r]; !ok {
				bad("no resources.requests.%s", r)
			}
		}
		if _, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok {
			bad("no resources.limits.memory")
		}
		sc := c.SecurityContext
		if sc == nil {
			sc = &corev1.SecurityContext{}
		}
		if nonRoot := cmpOr(sc.RunAsNonRoot, psc.RunAsNonRoot); nonRoot == nil || !*nonRoot {
			bad("runAsNonRoot is not true (container or pod)")
		}
		if user := cmpOr(sc.RunAsUser, psc.RunAsUser); user == nil || *user == 0 {
			bad("no numeric non-root runAsUser (container or pod)")
		}
		seccomp := cmpOr(sc.SeccompProfile, psc.SeccompProfile)
		if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
			bad("seccompProfile is not RuntimeDefault (container or pod)")
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			bad("allowPrivilegeEscalation is not false")
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			bad("readOnlyRootFilesystem is not true")
		}
		if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
			bad("capabilities do not drop ALL (and add none)")
		}
	}
	for _, c := range pod.InitContainers {
		// Only a native sidecar (restartPolicy Always) runs alongside and takes probes.
		check(c, c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways)
	}
	for _, c := range pod.Containers {
		check(c, true)
	}
	if len(pod.Containers) == 0 {
		problems = append(problems, "no containers")
	}
	return problems
}

// cmpOr is the container's setting, else the pod's.
func cmpOr[T any](container, pod *T) *T {
	if container != nil {
		return container
	}
	return pod
}

// TestDeployTopology checks what each control-plane overlay promises beyond single objects:
// the webhook's Service reaches a pod serving 15017, xds-server is autoscaled, spread and
// covered by a disruption budget, and the NetworkPolicies admit the bus ports from Sailplane's
// pods only while xDS, the ca and the webhook stay open.
func TestDeployTopology(t *testing.T) {
	for _, overlay := range controlPlaneOverlays {
		t.Run(overlay, func(t *testing.T) {
			objs := kustomizeBuild(t, overlay)
			pods := map[string]corev1.PodTemplateSpec{} // by namespace/deployment
			var services []corev1.Service
			var policies []networkingv1.NetworkPolicy
			for _, obj := range objs {
				if tmpl, ok := podTemplate(t, obj); ok {
					pods[obj.GetNamespace()+"/"+obj.GetName()] = tmpl
				}
				switch obj.GetKind() {
				case "Service":
					services = append(services, convert[corev1.Service](t, obj))
				case "NetworkPolicy":
					policies = append(policies, convert[networkingv1.NetworkPolicy](t, obj))
				}
			}

			webhookService := slices.IndexFunc(services, func(s corev1.Service) bool {
				return s.Name == "sailplane-webhook" && s.Namespace == "istio-system"
			})
			if webhookService < 0 {
				t.Fatalf("deploy/%s: no Service istio-system/sailplane-webhook", overlay)
			}
			svc := services[webhookService]
			if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 443 || svc.Spec.Ports[0].TargetPort.IntValue() != 15017 {
				t.Errorf("deploy/%s: Service sailplane-webhook ports %+v, want 443 -> 15017", overlay, svc.Spec.Ports)
			}
			served := false
			for key, tmpl := range pods {
				if strings.HasPrefix(key, "istio-system/") && labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(tmpl.Labels)) {
					served = served || slices.ContainsFunc(tmpl.Spec.Containers, func(c corev1.Container) bool { return hasPort(c, 15017) })
				}
			}
			if !served {
				t.Errorf("deploy/%s: Service sailplane-webhook selects no pod serving 15017", overlay)
			}

			switch overlay {
			case "hyper":
			case "node-local":
				checkXDSServerNodeLocal(t, overlay, objs)
			default:
				checkXDSServerScaling(t, overlay, objs, pods["istio-system/xds-server"])
			}

			for key, tmpl := range pods {
				ns, _, _ := strings.Cut(key, "/")
				if tmpl.Labels[partOf] != sailName {
					t.Errorf("deploy/%s: pods of %s lack the label %s=%s the NetworkPolicies admit", overlay, key, partOf, sailName)
				}
				for _, c := range tmpl.Spec.Containers {
					if slices.Contains(settingsBinaries, c.Name) {
						for _, problem := range monitoringProbeProblems(c) {
							t.Errorf("deploy/%s: %s container %s: %s", overlay, key, c.Name, problem)
						}
						// Prometheus scrapes /metrics there, as it finds istiod's.
						if tmpl.Annotations["prometheus.io/scrape"] != "true" || tmpl.Annotations["prometheus.io/port"] != "15014" {
							t.Errorf("deploy/%s: pods of %s lack istiod's prometheus.io/scrape and prometheus.io/port (15014) annotations: %v", overlay, key, tmpl.Annotations)
						}
					}
					for _, p := range c.Ports {
						open, sailplaneOnly := admitted(policies, ns, tmpl.Labels, p.ContainerPort)
						switch p.ContainerPort {
						case 15051, 15052, 15053:
							if open || !sailplaneOnly {
								t.Errorf("deploy/%s: %s port %d (a bus): open to all %v, admitted from Sailplane's pods %v; want Sailplane's pods only", overlay, key, p.ContainerPort, open, sailplaneOnly)
							}
						case 15010, 15012, 15017:
							if !open {
								t.Errorf("deploy/%s: %s port %d is not open to the mesh and the API server", overlay, key, p.ContainerPort)
							}
						case 15014:
							if !open {
								t.Errorf("deploy/%s: %s port 15014 (monitoring) is not open to the kubelet's probes, which come from the node", overlay, key)
							}
						}
					}
				}
			}
		})
	}
}

// monitoringProbeProblems: a Sailplane service's probes ask its monitoring port, readiness
// /healthz/ready (synced) and liveness /healthz/live, so that the kubelet and the code agree on
// what ready means.
func monitoringProbeProblems(c corev1.Container) []string {
	var problems []string
	for _, want := range []struct {
		kind  string
		probe *corev1.Probe
		path  string
	}{{"readiness", c.ReadinessProbe, "/healthz/ready"}, {"liveness", c.LivenessProbe, "/healthz/live"}} {
		var get *corev1.HTTPGetAction
		if want.probe != nil {
			get = want.probe.HTTPGet
		}
		if get == nil || get.Port.IntValue() != 15014 || get.Path != want.path {
			problems = append(problems, fmt.Sprintf("%s probe %+v, want httpGet %s on 15014", want.kind, want.probe, want.path))
		}
	}
	if !slices.ContainsFunc(c.Args, func(a string) bool { return a == "--monitoring-listen=:15014" }) {
		problems = append(problems, "no --monitoring-listen=:15014")
	}
	return problems
}

func checkXDSServerScaling(t *testing.T, overlay string, objs []*unstructured.Unstructured, pod corev1.PodTemplateSpec) {
	t.Helper()
	var hpa *autoscalingv2.HorizontalPodAutoscaler
	var pdb *policyv1.PodDisruptionBudget
	for _, obj := range objs {
		switch {
		case obj.GetKind() == "HorizontalPodAutoscaler" && obj.GetName() == "xds-server":
			hpa = new(convert[autoscalingv2.HorizontalPodAutoscaler](t, obj))
		case obj.GetKind() == "PodDisruptionBudget" && obj.GetName() == "xds-server":
			pdb = new(convert[policyv1.PodDisruptionBudget](t, obj))
		case obj.GetKind() == "Deployment" && obj.GetName() == "xds-server":
			if d := convert[appsv1.Deployment](t, obj); d.Spec.Replicas != nil {
				t.Errorf("deploy/%s: Deployment xds-server sets replicas (%d): the autoscaler owns them, every apply would reset them", overlay, *d.Spec.Replicas)
			}
		}
	}
	switch {
	case hpa == nil:
		t.Errorf("deploy/%s: no HorizontalPodAutoscaler xds-server", overlay)
	case hpa.Spec.ScaleTargetRef.Kind != "Deployment" || hpa.Spec.ScaleTargetRef.Name != "xds-server" ||
		!slices.ContainsFunc(hpa.Spec.Metrics, func(m autoscalingv2.MetricSpec) bool {
			return m.Resource != nil && m.Resource.Name == corev1.ResourceCPU
		}) || hpa.Spec.MinReplicas == nil || *hpa.Spec.MinReplicas < 2:
		t.Errorf("deploy/%s: HorizontalPodAutoscaler xds-server %+v: want Deployment xds-server on CPU, at least 2 replicas", overlay, hpa.Spec)
	}
	if pdb == nil {
		t.Errorf("deploy/%s: no PodDisruptionBudget xds-server", overlay)
	} else if sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector); err != nil || !sel.Matches(labels.Set(pod.Labels)) {
		t.Errorf("deploy/%s: PodDisruptionBudget xds-server does not select xds-server's pods (%v)", overlay, err)
	}
	if len(pod.Spec.TopologySpreadConstraints) == 0 {
		t.Errorf("deploy/%s: xds-server's pods have no topologySpreadConstraints", overlay)
	}
}

// checkXDSServerNodeLocal: deploy/node-local runs xds-server as a DaemonSet on every node
// (tainted ones too), replaced on a node only once the new pod is ready, with no autoscaler,
// disruption budget nor peer balancing (a Local Service sends a shed proxy back to the same
// pod), and proxies reach their own node's through a Service with internalTrafficPolicy: Local.
func checkXDSServerNodeLocal(t *testing.T, overlay string, objs []*unstructured.Unstructured) {
	t.Helper()
	var ds *appsv1.DaemonSet
	var svc *corev1.Service
	for _, obj := range objs {
		switch {
		case obj.GetName() != "xds-server" && obj.GetName() != "xds-server-peers":
		case obj.GetKind() == "DaemonSet":
			ds = new(convert[appsv1.DaemonSet](t, obj))
		case obj.GetKind() == "Service" && obj.GetName() == "xds-server":
			svc = new(convert[corev1.Service](t, obj))
		case obj.GetKind() == "Deployment", obj.GetKind() == "HorizontalPodAutoscaler", obj.GetKind() == "PodDisruptionBudget",
			obj.GetName() == "xds-server-peers":
			t.Errorf("deploy/%s: %s: the node-local topology has no %s for xds-server", overlay, ref(obj), obj.GetKind())
		}
	}
	if ds == nil {
		t.Fatalf("deploy/%s: no DaemonSet xds-server", overlay)
	}
	if ru := ds.Spec.UpdateStrategy.RollingUpdate; ru == nil || ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 0 ||
		ru.MaxSurge == nil || ru.MaxSurge.IntValue() < 1 {
		t.Errorf("deploy/%s: DaemonSet xds-server update strategy %+v: want maxSurge 1, maxUnavailable 0 (a node never without a ready xds-server)", overlay, ds.Spec.UpdateStrategy)
	}
	if !slices.ContainsFunc(ds.Spec.Template.Spec.Tolerations, func(tol corev1.Toleration) bool {
		return tol.Operator == corev1.TolerationOpExists && tol.Key == "" && tol.Effect == ""
	}) {
		t.Errorf("deploy/%s: DaemonSet xds-server does not tolerate every taint: proxies on tainted nodes would have no xds-server", overlay)
	}
	spec := ds.Spec.Template.Spec
	if spec.HostNetwork {
		t.Errorf("deploy/%s: DaemonSet xds-server uses the host network", overlay)
	}
	for _, c := range spec.Containers {
		if slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--xds-peers") }) {
			t.Errorf("deploy/%s: DaemonSet xds-server balances with peers (%v): a shed proxy comes back to the same pod", overlay, c.Args)
		}
	}
	switch {
	case svc == nil:
		t.Errorf("deploy/%s: no Service xds-server", overlay)
	case svc.Spec.InternalTrafficPolicy == nil || *svc.Spec.InternalTrafficPolicy != corev1.ServiceInternalTrafficPolicyLocal:
		t.Errorf("deploy/%s: Service xds-server internalTrafficPolicy %q, want Local", overlay, *cmp.Or(svc.Spec.InternalTrafficPolicy, new(corev1.ServiceInternalTrafficPolicy)))
	case !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(ds.Spec.Template.Labels)):
		t.Errorf("deploy/%s: Service xds-server does not select the DaemonSet's pods", overlay)
	}
}

func hasPort(c corev1.Container, port int32) bool {
	return slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.ContainerPort == port })
}

// admitted tells whether the policies of ns selecting a pod with podLabels let anyone reach port
// (open), or only Sailplane's pods in Sailplane's namespaces (sailplaneOnly); a pod no policy
// selects is open to all.
func admitted(policies []networkingv1.NetworkPolicy, ns string, podLabels map[string]string, port int32) (open, sailplaneOnly bool) {
	selected := false
	for _, p := range policies {
		sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
		if p.Namespace != ns || err != nil || !sel.Matches(labels.Set(podLabels)) {
			continue
		}
		selected = true
		for _, rule := range p.Spec.Ingress {
			if len(rule.Ports) > 0 && !slices.ContainsFunc(rule.Ports, func(pp networkingv1.NetworkPolicyPort) bool {
				return pp.Port != nil && pp.Port.IntValue() == int(port)
			}) {
				continue
			}
			if len(rule.From) == 0 {
				open = true
			}
			for _, from := range rule.From {
				if from.PodSelector == nil || from.PodSelector.MatchLabels[partOf] != sailName || from.NamespaceSelector == nil || from.IPBlock != nil {
					open = true // from more than Sailplane's pods
				} else {
					sailplaneOnly = true
				}
			}
		}
	}
	return open || !selected, sailplaneOnly && !open
}

func convert[T any](t testing.TB, obj *unstructured.Unstructured) T {
	t.Helper()
	var out T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &out); err != nil {
		t.Fatalf("%s: %v", ref(obj), err)
	}
	return out
}

// TestDeployCRDsMatchIstioAPI fails when deploy/crds differs from the CRDs of the istio.io/api
// version tools/testenv installs: run `make crds`.
func TestDeployCRDsMatchIstioAPI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	path, err := testenv.IstioCRDFile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../deploy/crds/customresourcedefinitions.gen.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("deploy/crds/customresourcedefinitions.gen.yaml differs from %s (istio.io/api %s): run `make crds`", path, testenv.IstioAPIVersion)
	}
}

// TestDeployGatewayAPICRDsMatchModule fails when deploy/crds/gateway-api differs from the
// standard-channel CRDs of the sigs.k8s.io/gateway-api version Sailplane pins: run `make crds`.
func TestDeployGatewayAPICRDsMatchModule(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	files, err := testenv.GatewayAPICRDFiles(ctx)
	if err != nil {
		t.Fatal(err)
	}
	copies, err := filepath.Glob("../deploy/crds/gateway-api/gateway.networking.k8s.io_*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(copies) != len(files) {
		t.Errorf("deploy/crds/gateway-api has %d CRD files, sigs.k8s.io/gateway-api %s has %d: run `make crds`", len(copies), testenv.GatewayAPIVersion, len(files))
	}
	for _, f := range files {
		want, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join("../deploy/crds/gateway-api", filepath.Base(f)))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("deploy/crds/gateway-api/%s differs from sigs.k8s.io/gateway-api %s (%v): run `make crds`", filepath.Base(f), testenv.GatewayAPIVersion, err)
		}
	}
}

// TestDeployArgs runs each Sailplane binary the overlays run with --help and checks the
// containers' arguments against it: every flag exists, every port a flag listens on (":port") is
// a declared container port and the other way round, and every probe asks a declared port.
func TestDeployArgs(t *testing.T) {
	helps := map[string]string{}
	help := func(binary string) string {
		if h, ok := helps[binary]; ok {
			return h
		}
		helps[binary] = binaryHelp(t, binary)
		return helps[binary]
	}
	for _, overlay := range deployOverlays {
		for _, obj := range kustomizeBuild(t, overlay) {
			tmpl, ok := podTemplate(t, obj)
			if !ok {
				continue
			}
			for _, c := range slices.Concat(tmpl.Spec.InitContainers, tmpl.Spec.Containers) {
				binary, ok := strings.CutPrefix(c.Image, "sailplane/")
				if !ok {
					continue
				}
				where := fmt.Sprintf("deploy/%s: %s: container %s", overlay, ref(obj), c.Name)
				declared := map[int32]bool{}
				for _, p := range c.Ports {
					declared[p.ContainerPort] = true
				}
				listened := map[int32]bool{}
				for _, arg := range c.Args {
					flag, value, _ := strings.Cut(arg, "=")
					if !strings.HasPrefix(flag, "--") || !regexp.MustCompile(`(?m)^\s+(-\w, )?`+regexp.QuoteMeta(flag)+`\b`).MatchString(help(binary)) {
						t.Errorf("%s: %s is not a flag of %s", where, flag, binary)
					}
					if port, ok := strings.CutPrefix(value, ":"); ok {
						n, err := strconv.ParseInt(port, 10, 32)
						if err != nil {
							t.Errorf("%s: %s: %v", where, arg, err)
						}
						listened[int32(n)] = true
						if !declared[int32(n)] {
							t.Errorf("%s: %s listens on %d, not a declared container port", where, flag, n)
						}
					}
				}
				for p := range declared {
					if !listened[p] {
						t.Errorf("%s: container port %d: no flag listens there", where, p)
					}
				}
				for name, probe := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe, "startup": c.StartupProbe} {
					if port, ok := probePort(probe); ok && !declared[port] {
						t.Errorf("%s: %s probe on port %d, not a declared container port", where, name, port)
					}
				}
			}
		}
	}
}

func probePort(p *corev1.Probe) (int32, bool) {
	switch {
	case p == nil:
		return 0, false
	case p.GRPC != nil:
		return p.GRPC.Port, true
	case p.HTTPGet != nil:
		return int32(p.HTTPGet.Port.IntValue()), true
	case p.TCPSocket != nil:
		return int32(p.TCPSocket.Port.IntValue()), true
	}
	return 0, false
}

// TestDeployInjectionAddresses checks the injection values each control-plane overlay ships:
// the injected agent's xDS and ca addresses are Services of that overlay on 15012, and
// everything else is deploy/base/injection/values (the overlays copy the file to change only
// the addresses).
func TestDeployInjectionAddresses(t *testing.T) {
	baseValues, err := os.ReadFile("../deploy/base/injection/values")
	if err != nil {
		t.Fatal(err)
	}
	withoutAddresses := func(where string, raw []byte) map[string]any {
		t.Helper()
		var v map[string]any
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatalf("%s: values: %v", where, err)
		}
		global, _ := v["global"].(map[string]any)
		delete(global, "discoveryAddress")
		delete(global, "caAddress")
		return v
	}
	base := withoutAddresses("deploy/base/injection/values", baseValues)
	for _, overlay := range controlPlaneOverlays {
		objs := kustomizeBuild(t, overlay)
		cm := slices.IndexFunc(objs, func(o *unstructured.Unstructured) bool {
			return o.GetKind() == "ConfigMap" && o.GetName() == "istio-sidecar-injector"
		})
		if cm < 0 {
			t.Errorf("deploy/%s: no ConfigMap istio-sidecar-injector", overlay)
			continue
		}
		raw, _, _ := unstructured.NestedString(objs[cm].Object, "data", "values")
		var values struct {
			Global struct{ DiscoveryAddress, CAAddress string }
		}
		if err := json.Unmarshal([]byte(raw), &values); err != nil {
			t.Fatalf("deploy/%s: values: %v", overlay, err)
		}
		if got := withoutAddresses("deploy/"+overlay, []byte(raw)); !reflect.DeepEqual(got, base) {
			t.Errorf("deploy/%s: injection values differ from deploy/base/injection/values beyond the addresses:\n%s", overlay, raw)
		}
		for name, addr := range map[string]string{
			"discoveryAddress": values.Global.DiscoveryAddress,
			"caAddress":        cmp.Or(values.Global.CAAddress, values.Global.DiscoveryAddress),
		} {
			if !servedBy(objs, addr) {
				t.Errorf("deploy/%s: injection values %s %q is no Service port of the overlay", overlay, name, addr)
			}
		}
	}
}

// servedBy tells whether addr, <service>.<namespace>.svc:<port>, is a port of a Service in objs.
func servedBy(objs []*unstructured.Unstructured, addr string) bool {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	name, ns, _ := strings.Cut(strings.TrimSuffix(host, ".svc"), ".")
	for _, o := range objs {
		if o.GetKind() != "Service" || o.GetName() != name || o.GetNamespace() != ns {
			continue
		}
		ports, _, _ := unstructured.NestedSlice(o.Object, "spec", "ports")
		for _, p := range ports {
			if fmt.Sprint(p.(map[string]any)["port"]) == port {
				return true
			}
		}
	}
	return false
}
