package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/tools/testenv"
)

// TestGatewayDeploymentInjected: hyper on Kubernetes deploys a Kubernetes Gateway of class istio,
// and a pod of the Deployment it wrote (made here as the ReplicaSet controller would: the test
// environment has none) is injected by hyper's webhook with the gateway template: the agent as
// a router node, Envoy filling the istio-proxy placeholder, no capture.
func TestGatewayDeploymentInjected(t *testing.T) {
	k := testenv.KubeForTest(t, testenv.WithGatewayAPICRDs())
	kube := framework.NewKube(t, k.RestConfig())
	kube.EnsureNamespace(t, "istio-system")
	kube.Apply(t, meshConfigMap)
	webhookAddr := framework.FreeAddr(t)
	webhookTopologies[0].start(t, k, kube, webhookAddr) // hyper
	applyWebhooks(t, kube, webhookAddr)

	kube.Apply(t, `apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: web, namespace: apps}
spec:
  gatewayClassName: istio
  listeners:
  - {name: http, port: 80, protocol: HTTP}
`)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var dep *unstructured.Unstructured
	framework.Eventually(t, time.Minute, func() (err error) {
		dep, err = kube.Get(ctx, "Deployment.apps", "apps", "web-istio")
		return err
	})
	raw, _, _ := unstructured.NestedMap(dep.Object, "spec", "template")
	var tmpl corev1.PodTemplateSpec
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &tmpl); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: tmpl.ObjectMeta, Spec: tmpl.Spec}
	pod.Name, pod.Namespace = "web-istio-0", "apps"
	var got *corev1.Pod
	// The injector's caBundle is patched a moment after hyper starts.
	framework.Eventually(t, time.Minute, func() (err error) {
		got, err = kube.Clientset.CoreV1().Pods("apps").Create(ctx, pod, metav1.CreateOptions{})
		return err
	})
	if _, ok := got.Annotations["sidecar.istio.io/status"]; !ok {
		t.Fatalf("the gateway's pod was not injected: %+v", got.Spec)
	}
	agent := slices.IndexFunc(got.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == "sailplane-agent" })
	if agent < 0 || !slices.ContainsFunc(got.Spec.InitContainers[agent].Env, func(e corev1.EnvVar) bool {
		return e.Name == "SAILPLANE_PROXY_TYPE" && e.Value == "router"
	}) {
		t.Errorf("no agent running as a router: %+v", got.Spec.InitContainers)
	}
	if slices.ContainsFunc(got.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == "istio-init" || c.Name == "istio-validation" }) {
		t.Errorf("a gateway pod got traffic capture: %+v", got.Spec.InitContainers)
	}
	proxy := slices.IndexFunc(got.Spec.Containers, func(c corev1.Container) bool { return c.Name == "istio-proxy" })
	if proxy < 0 || got.Spec.Containers[proxy].Image == "auto" || len(got.Spec.Containers) != 1 {
		t.Errorf("Envoy does not fill the istio-proxy placeholder: %+v", got.Spec.Containers)
	}
}
