package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/shared/schema"
	"sailplane.dev/tools/testenv"
)

// startRevision runs hyper as revision rev on k, its webhook on webhookAddr, and returns its
// config bus address.
func startRevision(t *testing.T, k *testenv.Kube, rev, webhookAddr string) string {
	t.Helper()
	dir := t.TempDir()
	framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", "rootNamespace: istio-system\n")
	busAddr := framework.FreeAddr(t)
	framework.Start(t, dir, framework.Binary(t, "hyper"), "--revision", rev,
		"--kubeconfig", k.KubeconfigPath(), "--config-source", "kubernetes", "--xds-listen", framework.FreeAddr(t),
		"--bus-listen", busAddr, "--xds-tls-listen", framework.FreeAddr(t), "--webhook-listen", webhookAddr,
		"--pod-name", "hyper-"+rev, "--log-level", "debug")
	return busAddr
}

// canaryInjector is the canary revision's injector configuration, as the revisioned overlay
// installs it: the rev.* webhooks of deploy/base/webhooks.yaml, selecting istio.io/rev=canary,
// calling the canary's webhook at addr.
func canaryInjector(addr string) string {
	return `apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: sailplane-sidecar-injector-canary
  labels: {istio.io/rev: canary, app.kubernetes.io/part-of: sailplane}
webhooks:
  - name: rev.namespace.sidecar-injector.sailplane.dev
    clientConfig: {url: "https://` + addr + `/inject"}
    rules: [{operations: [CREATE], apiGroups: [""], apiVersions: [v1], resources: [pods]}]
    namespaceSelector:
      matchExpressions:
        - {key: istio.io/rev, operator: In, values: [canary]}
        - {key: istio-injection, operator: DoesNotExist}
        - {key: kubernetes.io/metadata.name, operator: NotIn, values: [istio-system, kube-system]}
    objectSelector:
      matchExpressions: [{key: sidecar.istio.io/inject, operator: NotIn, values: ["false"]}]
    failurePolicy: Fail
    sideEffects: None
    admissionReviewVersions: [v1]
  - name: rev.object.sidecar-injector.sailplane.dev
    clientConfig: {url: "https://` + addr + `/inject"}
    rules: [{operations: [CREATE], apiGroups: [""], apiVersions: [v1], resources: [pods]}]
    namespaceSelector:
      matchExpressions:
        - {key: istio.io/rev, operator: DoesNotExist}
        - {key: istio-injection, operator: DoesNotExist}
        - {key: kubernetes.io/metadata.name, operator: NotIn, values: [istio-system, kube-system]}
    objectSelector:
      matchExpressions:
        - {key: sidecar.istio.io/inject, operator: NotIn, values: ["false"]}
        - {key: istio.io/rev, operator: In, values: [canary]}
    failurePolicy: Fail
    sideEffects: None
    admissionReviewVersions: [v1]
`
}

// TestCanaryUpgrade is the walkthrough of docs/multi-cluster.md "Revisions and tags", end to
// end: the default revision runs, namespace app is labelled with tag prod naming it; a canary
// revision is installed beside it; `sailplanectl tag set prod --revision canary --overwrite`
// moves app (its new pods injected by the canary, its tagged config served by the canary
// only); moving the tag back rolls back. Unlabelled config is served by both all along.
func TestCanaryUpgrade(t *testing.T) {
	k := testenv.KubeForTest(t)
	kube := framework.NewKube(t, k.RestConfig())
	kube.EnsureNamespace(t, "istio-system")
	kube.Apply(t, meshConfigMap)
	ctl := framework.Binary(t, "sailplanectl")
	tag := func(args ...string) {
		t.Helper()
		out, err := exec.Command(ctl, append([]string{"tag"}, append(args, "--kubeconfig", k.KubeconfigPath())...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("sailplanectl tag %v: %v\n%s", args, err, out)
		}
		t.Logf("sailplanectl tag %v: %s", args, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	patched := func(name string) error {
		mwc, err := kube.Get(ctx, "MutatingWebhookConfiguration.admissionregistration.k8s.io", "", name)
		if err != nil {
			return err
		}
		hooks, _, _ := unstructured.NestedSlice(mwc.Object, "webhooks")
		for _, h := range hooks {
			if b, _ := h.(map[string]any)["clientConfig"].(map[string]any)["caBundle"].(string); b == "" {
				return fmt.Errorf("%s: caBundle not patched yet", name)
			}
		}
		return nil
	}

	// 1. The default revision, namespace app on tag prod.
	defHook := framework.FreeAddr(t)
	defBus := startRevision(t, k, "default", defHook)
	applyWebhooks(t, kube, defHook)
	framework.Eventually(t, 2*time.Minute, func() error { return patched("sailplane-sidecar-injector") })
	tag("set", "prod", "--revision", "default")
	kube.Apply(t, `apiVersion: v1
kind: Namespace
metadata: {name: app, labels: {istio.io/rev: prod}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: shared, namespace: app}
spec: {hosts: [shared], http: [{route: [{destination: {host: shared}}]}]}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: tagged, namespace: app, labels: {istio.io/rev: prod}}
spec: {hosts: [tagged], http: [{route: [{destination: {host: tagged}}]}]}
`)
	pod := 0
	injectedBy := func() string {
		t.Helper()
		pod++
		objs, err := framework.Decode(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: app-%d, namespace: app}
spec:
  serviceAccountName: default
  containers: [{name: app, image: example/app}]
`, pod))
		if err != nil {
			t.Fatal(err)
		}
		ri, err := kube.Resource(objs[0])
		if err != nil {
			t.Fatal(err)
		}
		var created *unstructured.Unstructured
		framework.Eventually(t, time.Minute, func() error {
			created, err = ri.Create(ctx, objs[0], metav1.CreateOptions{})
			return err
		})
		var st struct {
			Revision string `json:"revision"`
		}
		raw, ok := created.GetAnnotations()["sidecar.istio.io/status"]
		if !ok {
			return "(not injected)"
		}
		if err := json.Unmarshal([]byte(raw), &st); err != nil {
			t.Fatalf("sidecar.istio.io/status %q: %v", raw, err)
		}
		return st.Revision
	}
	if got := injectedBy(); got != "default" {
		t.Fatalf("a pod of app injected by %q, want default (tag prod names it)", got)
	}
	defConfig := framework.RecordBus(t, defBus, schema.VirtualService.TypeURL)
	served := func(rec *framework.BusRecorder, name string) bool {
		_, ok := rec.Get(schema.VirtualService.TypeURL, "app/"+name)
		return ok
	}
	framework.Eventually(t, time.Minute, func() error {
		if !served(defConfig, "shared") || !served(defConfig, "tagged") {
			return fmt.Errorf("the default revision does not serve app's config yet")
		}
		return nil
	})

	// 2. Install the canary beside it.
	canaryHook := framework.FreeAddr(t)
	canaryBus := startRevision(t, k, "canary", canaryHook)
	kube.Apply(t, canaryInjector(canaryHook))
	framework.Eventually(t, 2*time.Minute, func() error { return patched("sailplane-sidecar-injector-canary") })
	canaryConfig := framework.RecordBus(t, canaryBus, schema.VirtualService.TypeURL)
	framework.Eventually(t, time.Minute, func() error {
		if !served(canaryConfig, "shared") {
			return fmt.Errorf("the canary does not serve the unlabelled config yet")
		}
		return nil
	})
	if served(canaryConfig, "tagged") {
		t.Error("the canary serves config of tag prod, which names the default revision")
	}
	if got := injectedBy(); got != "default" {
		t.Errorf("with the canary installed, a pod of app injected by %q, want still default", got)
	}

	// 3. Move the namespace by its tag.
	tag("set", "prod", "--revision", "canary", "--overwrite")
	framework.Eventually(t, time.Minute, func() error {
		if !served(canaryConfig, "tagged") || served(defConfig, "tagged") {
			return fmt.Errorf("tag prod's config not moved to the canary yet")
		}
		return nil
	})
	framework.Eventually(t, time.Minute, func() error {
		if got := injectedBy(); got != "canary" {
			return fmt.Errorf("a pod of app injected by %q, want canary", got)
		}
		return nil
	})

	// 4. Roll back.
	tag("set", "prod", "--revision", "default", "--overwrite")
	framework.Eventually(t, time.Minute, func() error {
		if !served(defConfig, "tagged") || served(canaryConfig, "tagged") {
			return fmt.Errorf("tag prod's config not back on the default revision yet")
		}
		return nil
	})
	framework.Eventually(t, time.Minute, func() error {
		if got := injectedBy(); got != "default" {
			return fmt.Errorf("after the roll back, a pod of app injected by %q, want default", got)
		}
		return nil
	})
	if !served(defConfig, "shared") || !served(canaryConfig, "shared") {
		t.Error("the unlabelled config left a revision")
	}
}
