package framework

import (
	"context"
	"errors"
	"fmt"
	"io"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// fieldManager names the tests' writes in managedFields.
const fieldManager = "sailplane-e2e"

// Kube applies and deletes objects of any kind (core, Istio CRDs) in an API server, as
// `kubectl apply` / `kubectl delete` would.
type Kube struct {
	Dynamic   dynamic.Interface
	Clientset kubernetes.Interface
	mapper    meta.ResettableRESTMapper
}

// NewKube builds the clients for cfg. Their connections are closed when the test ends, so no
// HTTP connection goroutine outlives it (goleak).
func NewKube(t testing.TB, cfg *rest.Config) *Kube {
	t.Helper()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatalf("kube http client: %v", err)
	}
	t.Cleanup(hc.CloseIdleConnections)
	dyn, err := dynamic.NewForConfigAndClient(cfg, hc)
	if err != nil {
		t.Fatalf("dynamic client: %v", err)
	}
	cs, err := kubernetes.NewForConfigAndClient(cfg, hc)
	if err != nil {
		t.Fatalf("kubernetes client: %v", err)
	}
	dc, err := discovery.NewDiscoveryClientForConfigAndClient(cfg, hc)
	if err != nil {
		t.Fatalf("discovery client: %v", err)
	}
	return &Kube{Dynamic: dyn, Clientset: cs, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}
}

// Decode splits multi-document YAML into objects; empty documents are skipped.
func Decode(manifest string) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifest), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, fmt.Errorf("document %d: %w", len(objs)+1, err)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

// Resource returns the client for obj's kind, in its namespace ("default" when unset) for
// namespaced kinds.
func (k *Kube) Resource(obj *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := obj.GroupVersionKind()
	m, err := k.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if meta.IsNoMatchError(err) {
		// A CRD installed after the first lookup: forget the cached discovery and retry.
		k.mapper.Reset()
		m, err = k.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", gvk, err)
	}
	if m.Scope.Name() != meta.RESTScopeNameNamespace {
		return k.Dynamic.Resource(m.Resource), nil
	}
	ns := obj.GetNamespace()
	if ns == "" {
		ns = "default"
		obj.SetNamespace(ns)
	}
	return k.Dynamic.Resource(m.Resource).Namespace(ns), nil
}

// Apply server-side-applies every object of a multi-document manifest, creating missing
// namespaces first, and returns the objects as the API server stored them.
func (k *Kube) Apply(t testing.TB, manifest string) []*unstructured.Unstructured {
	t.Helper()
	objs, err := Decode(manifest)
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []*unstructured.Unstructured
	for _, obj := range objs {
		ri, err := k.Resource(obj)
		if err != nil {
			t.Fatalf("apply: %v", err)
		}
		if ns := obj.GetNamespace(); ns != "" {
			k.EnsureNamespace(t, ns)
		}
		got, err := ri.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: fieldManager, Force: true})
		if err != nil {
			t.Fatalf("apply %s %s/%s: %v", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
		}
		out = append(out, got)
	}
	return out
}

// Delete deletes every object of a manifest; objects already gone are fine.
func (k *Kube) Delete(t testing.TB, manifest string) {
	t.Helper()
	objs, err := Decode(manifest)
	if err != nil {
		t.Fatalf("delete: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, obj := range objs {
		ri, err := k.Resource(obj)
		if err != nil {
			t.Fatalf("delete: %v", err)
		}
		if err := ri.Delete(ctx, obj.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("delete %s %s/%s: %v", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
		}
	}
}

// Get reads one object; kind is "Kind.group" as in GroupKind's String, e.g.
// "VirtualService.networking.istio.io", or "Pod" for core kinds.
func (k *Kube) Get(ctx context.Context, kind, namespace, name string) (*unstructured.Unstructured, error) {
	m, err := k.mapper.RESTMapping(schema.ParseGroupKind(kind))
	if err != nil {
		return nil, err
	}
	return k.Dynamic.Resource(m.Resource).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
}

// EnsureNamespace creates a namespace unless it exists. Without a controller manager nothing
// else would.
func (k *Kube) EnsureNamespace(t testing.TB, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": name},
	}}
	_, err := k.Dynamic.Resource(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}).
		Create(ctx, ns, metav1.CreateOptions{FieldManager: fieldManager})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("namespace %s: %v", name, err)
	}
}

// ServiceAccountToken creates a ServiceAccount (unless it exists) and returns a token of it for
// audiences (TokenRequest), as the kubelet projects one into a pod.
func (k *Kube) ServiceAccountToken(t testing.TB, namespace, name string, audiences ...string) string {
	t.Helper()
	k.EnsureNamespace(t, namespace)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sas := k.Clientset.CoreV1().ServiceAccounts(namespace)
	if _, err := sas.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("service account %s/%s: %v", namespace, name, err)
	}
	tr, err := sas.CreateToken(ctx, name, &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{Audiences: audiences}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token of %s/%s: %v", namespace, name, err)
	}
	return tr.Status.Token
}
