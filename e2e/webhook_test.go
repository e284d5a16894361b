package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/tools/testenv"
)

// TestHyperWebhook runs hyper on Kubernetes behind deploy/base/webhooks.yaml (calling its
// --webhook-listen on 127.0.0.1, since the API server cannot resolve the Service): hyper serves
// the webhook with a certificate from its linked ca, patches the caBundle with the ca's roots,
// turns the validator to fail closed once the API server reaches it, and an invalid
// VirtualService is refused at creation with the validator's field message.
func TestHyperWebhook(t *testing.T) {
	k := testenv.KubeForTest(t)
	kube := framework.NewKube(t, k.RestConfig())
	kube.EnsureNamespace(t, "istio-system")
	kube.Apply(t, meshConfigMap)
	dir := t.TempDir()
	framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", "rootNamespace: istio-system\n")
	webhookAddr := framework.FreeAddr(t)
	framework.Start(t, dir, framework.Binary(t, "hyper"),
		"--kubeconfig", k.KubeconfigPath(), "--config-source", "kubernetes", "--xds-listen", framework.FreeAddr(t),
		"--bus-listen", framework.FreeAddr(t), "--xds-tls-listen", framework.FreeAddr(t), "--webhook-listen", webhookAddr)

	shipped, err := os.ReadFile("../deploy/base/webhooks.yaml")
	if err != nil {
		t.Fatal(err)
	}
	manifest := string(shipped)
	for _, path := range []string{"/inject", "/validate"} {
		service := "service: {name: sailplane-webhook, namespace: istio-system, path: " + path + ", port: 443}"
		if !strings.Contains(manifest, service) {
			t.Fatalf("webhooks.yaml no longer says %q", service)
		}
		manifest = strings.ReplaceAll(manifest, service, "url: https://"+webhookAddr+path)
	}
	kube.Apply(t, manifest)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	framework.Eventually(t, 2*time.Minute, func() error {
		vwc, err := kube.Get(ctx, "ValidatingWebhookConfiguration.admissionregistration.k8s.io", "", "sailplane-validator")
		if err != nil {
			return err
		}
		hooks, _, _ := unstructured.NestedSlice(vwc.Object, "webhooks")
		for _, h := range hooks {
			if h := h.(map[string]any); h["name"] == "validation.sailplane.dev" && h["failurePolicy"] == "Fail" {
				return nil
			}
		}
		return fmt.Errorf("validator not fail closed yet: %v", hooks)
	})

	objs, err := framework.Decode(`apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: bad, namespace: demo}
spec:
  hosts: [reviews]
  http:
    - route:
        - {destination: {host: reviews, subset: v1}, weight: 150}
        - {destination: {host: reviews, subset: v2}, weight: -50}
`)
	if err != nil {
		t.Fatal(err)
	}
	kube.EnsureNamespace(t, "demo")
	ri, err := kube.Resource(objs[0])
	if err != nil {
		t.Fatal(err)
	}
	_, err = ri.Create(ctx, objs[0], metav1.CreateOptions{})
	if want := "VirtualService demo/bad: spec.http[0].route[0].weight: must be between 0 and 100, got 150"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("create: %v, want %q", err, want)
	}
}
