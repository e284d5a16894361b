package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/tools/testenv"
)

// webhookTopologies start the webhook on Kubernetes with the given --webhook-listen: linked
// into hyper (its certificate from the linked ca), or the webhook binary beside the ca (its own
// certificate, asked for with its service account's token; the ca adds the Service's names).
var webhookTopologies = []struct {
	name  string
	start func(t *testing.T, k *testenv.Kube, kube *framework.Kube, listen string)
}{
	{"hyper", func(t *testing.T, k *testenv.Kube, _ *framework.Kube, listen string) {
		dir := t.TempDir()
		framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", "rootNamespace: istio-system\n")
		framework.Start(t, dir, framework.Binary(t, "hyper"),
			"--kubeconfig", k.KubeconfigPath(), "--config-source", "kubernetes", "--xds-listen", framework.FreeAddr(t),
			"--bus-listen", framework.FreeAddr(t), "--xds-tls-listen", framework.FreeAddr(t), "--webhook-listen", listen)
	}},
	{"microservices", func(t *testing.T, k *testenv.Kube, kube *framework.Kube, listen string) {
		dir, caAddr := t.TempDir(), framework.FreeAddr(t)
		framework.Start(t, dir, framework.Binary(t, "ca"), "--kubernetes=true", "--kubeconfig", k.KubeconfigPath(),
			"--ca-listen", caAddr, "--ca-cert-dir", "etc/certs", "--bus-listen=")
		rootFile := filepath.Join(dir, "etc/certs/root-cert.pem")
		framework.Eventually(t, time.Minute, func() error {
			_, err := os.Stat(rootFile)
			return err
		})
		framework.WriteFile(t, dir, "var/run/secrets/tokens/istio-token", kube.ServiceAccountToken(t, "istio-system", "webhook", "istio-ca"))
		hook := framework.Start(t, dir, framework.Binary(t, "webhook"), "--kubeconfig", k.KubeconfigPath(), "--webhook-listen", listen,
			"--ca-address", caAddr, "--ca-root-cert", rootFile, "--ca-token-file", filepath.Join(dir, "var/run/secrets/tokens/istio-token"))
		framework.WaitReady(t, hook) // ready once it serves with the ca's certificate
	}},
}

// TestWebhookOnKube runs the webhook on Kubernetes behind deploy/base/webhooks.yaml (calling its
// --webhook-listen on 127.0.0.1, since the API server cannot resolve the Service), in both
// topologies: the caBundle is patched with the ca's roots, the validator turns to fail closed
// once the API server reaches it, an invalid VirtualService is refused at creation with the
// validator's field message, and a pod in a namespace labelled for injection gets the sidecar.
func TestWebhookOnKube(t *testing.T) {
	for _, topo := range webhookTopologies {
		t.Run(topo.name, func(t *testing.T) {
			k := testenv.KubeForTest(t)
			kube := framework.NewKube(t, k.RestConfig())
			kube.EnsureNamespace(t, "istio-system")
			kube.Apply(t, meshConfigMap)
			webhookAddr := framework.FreeAddr(t)
			topo.start(t, k, kube, webhookAddr)
			checkWebhook(t, kube, webhookAddr)
		})
	}
}

// applyWebhooks applies deploy/base/webhooks.yaml, calling webhookAddr instead of the Service.
func applyWebhooks(t *testing.T, kube *framework.Kube, webhookAddr string) {
	t.Helper()
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
}

func checkWebhook(t *testing.T, kube *framework.Kube, webhookAddr string) {
	applyWebhooks(t, kube, webhookAddr)

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
        - {destination: {host: reviews, subset: v1}, weight: -150}
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
	if want := "VirtualService demo/bad: spec.http[0].route[0].weight: must not be negative, got -150"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("create: %v, want %q", err, want)
	}

	// A pod created in a namespace labelled for injection gets the sidecar.
	kube.Apply(t, "apiVersion: v1\nkind: Namespace\nmetadata: {name: injected, labels: {istio-injection: enabled}}\n")
	pods, err := framework.Decode(`apiVersion: v1
kind: Pod
metadata: {name: app, namespace: injected}
spec:
  serviceAccountName: default
  containers: [{name: app, image: example/app}]
`)
	if err != nil {
		t.Fatal(err)
	}
	ri, err = kube.Resource(pods[0])
	if err != nil {
		t.Fatal(err)
	}
	// The API server watches the two configurations apart: the injector's caBundle may arrive
	// a moment after the validator's.
	var pod *unstructured.Unstructured
	framework.Eventually(t, time.Minute, func() error {
		pod, err = ri.Create(ctx, pods[0], metav1.CreateOptions{})
		return err
	})
	if _, ok := pod.GetAnnotations()["sidecar.istio.io/status"]; !ok {
		t.Errorf("pod not injected: %v", pod.Object["spec"])
	}
}

// TestHyperWebhookFiles: without Kubernetes, hyper serves the webhook only when --webhook-listen
// asks for it, with a certificate from its ca (root in etc/certs/) and the injection templates of
// etc/sailplane/injection/ beside mesh.yaml.
func TestHyperWebhookFiles(t *testing.T) {
	dir := t.TempDir()
	framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", "")
	for _, name := range []string{"config", "values"} {
		data, err := os.ReadFile("../examples/etc/sailplane/injection/" + name)
		if err != nil {
			t.Fatal(err)
		}
		framework.WriteFile(t, dir, "etc/sailplane/injection/"+name, strings.ReplaceAll(string(data), `"sailplane/agent"`, `"example.org/folder-agent"`))
	}
	webhookAddr := framework.FreeAddr(t)
	framework.Start(t, dir, framework.Binary(t, "hyper"), "--config-source", "files", "--xds-listen", framework.FreeAddr(t),
		"--bus-listen", framework.FreeAddr(t), "--xds-tls-listen", framework.FreeAddr(t), "--webhook-listen", webhookAddr)

	var client *http.Client
	framework.Eventually(t, time.Minute, func() error {
		root, err := os.ReadFile(filepath.Join(dir, "etc/certs/root-cert.pem"))
		if err != nil {
			return err
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(root)
		client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
		resp, err := client.Get("https://" + webhookAddr + "/ready")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/ready: %s", resp.Status)
		}
		return nil
	})
	review := `{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "1", "operation": "CREATE",
	  "kind": {"group": "", "version": "v1", "kind": "Pod"}, "namespace": "demo", "name": "app",
	  "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "app", "namespace": "demo"},
	             "spec": {"serviceAccountName": "default", "containers": [{"name": "app", "image": "example/app"}]}}}}`
	resp, err := client.Post("https://"+webhookAddr+"/inject", "application/json", strings.NewReader(review))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Response struct {
			Allowed bool   `json:"allowed"`
			Patch   []byte `json:"patch"`
		} `json:"response"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if !out.Response.Allowed || !strings.Contains(string(out.Response.Patch), "example.org/folder-agent") {
		t.Errorf("allowed %v, patch %s: want the folder's agent image injected", out.Response.Allowed, out.Response.Patch)
	}
}
