package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/tools/testenv"
)

// TestSegregatedCARBAC applies deploy/segregated-ca (built with kustomize, as users apply it)
// to a real API server with RBAC on, then acts as each service account the manifests define:
// only the ca's may get the signing-key Secret (istio-ca-secret in its namespace); every other
// Sailplane account is refused, and the ca itself may not list Secrets nor read other ConfigMaps
// than istio-ca-root-cert, nor write a Secret into istio-system (where endpoint-watcher lists
// Secrets): xds-server asks for its serving certificate itself, with the istio-ca token every
// service mounts.
func TestSegregatedCARBAC(t *testing.T) {
	const caNamespace = "sailplane-ca"
	k := testenv.KubeForTest(t)
	kube := framework.NewKube(t, k.RestConfig())

	built, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), "../deploy/segregated-ca")
	if err != nil {
		t.Fatalf("kustomize build deploy/segregated-ca: %v", err)
	}
	manifest, err := built.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	objs := kube.Apply(t, string(manifest))

	admin, err := kubernetes.NewForConfig(k.RestConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := admin.CoreV1().Secrets(caNamespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "istio-ca-secret", Namespace: caNamespace},
		Data:       map[string][]byte{"ca-key.pem": []byte("the signing key")},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().ConfigMaps(caNamespace).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: caNamespace},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// Each service mounts a token only the ca accepts (audience istio-ca) for its certificate.
	tokens := map[string]bool{}
	for _, o := range objs {
		if o.GetKind() != "Deployment" {
			continue
		}
		vols, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "volumes")
		for _, v := range vols {
			sources, _, _ := unstructured.NestedSlice(v.(map[string]any), "projected", "sources")
			for _, src := range sources {
				if aud, _, _ := unstructured.NestedString(src.(map[string]any), "serviceAccountToken", "audience"); aud == "istio-ca" {
					tokens[o.GetName()] = true
				}
			}
		}
	}
	for _, svc := range []string{"config-ingest", "endpoint-watcher", "xds-server"} {
		if !tokens[svc] {
			t.Errorf("Deployment %s mounts no service-account token with audience istio-ca", svc)
		}
	}

	var accounts []string
	for _, o := range objs {
		if o.GetKind() == "ServiceAccount" {
			accounts = append(accounts, o.GetNamespace()+"/"+o.GetName())
		}
	}
	if len(accounts) < 4 {
		t.Fatalf("the manifests define the service accounts %v; want config-ingest, endpoint-watcher, xds-server and ca", accounts)
	}
	for _, account := range accounts {
		ns, name, _ := strings.Cut(account, "/")
		as := impersonate(t, k.RestConfig(), ns, name)
		_, err := as.CoreV1().Secrets(caNamespace).Get(ctx, "istio-ca-secret", metav1.GetOptions{})
		isCA := account == caNamespace+"/ca"
		switch {
		case isCA && err != nil:
			t.Errorf("%s: get Secret %s/istio-ca-secret: %v, want allowed", account, caNamespace, err)
		case !isCA && !apierrors.IsForbidden(err):
			t.Errorf("%s: get Secret %s/istio-ca-secret: %v, want Forbidden", account, caNamespace, err)
		}
		if _, err := as.CoreV1().Secrets(caNamespace).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("%s: list Secrets in %s: %v, want Forbidden", account, caNamespace, err)
		}
		if !isCA {
			continue
		}
		if _, err := as.CoreV1().ConfigMaps(caNamespace).Get(ctx, "other", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("the ca: get ConfigMap %s/other: %v, want Forbidden", caNamespace, err)
		}
		if _, err := as.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "istio-ca-root-cert"}, Data: map[string]string{"root-cert.pem": "x"},
		}, metav1.CreateOptions{}); err != nil {
			t.Errorf("the ca: create ConfigMap default/istio-ca-root-cert: %v", err)
		}
		if _, err := as.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=istio-ca-root-cert"}); err != nil {
			t.Errorf("the ca: list ConfigMaps named istio-ca-root-cert: %v", err)
		}
		// xds-server asks for its own serving certificate: the ca writes no Secret where
		// endpoint-watcher, which lists the Secrets of istio-system, could read it.
		tlsSecret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "xds-server-tls"}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{"tls.crt": nil, "tls.key": nil}}
		if _, err := as.CoreV1().Secrets("istio-system").Create(ctx, tlsSecret, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("the ca: create Secret istio-system/xds-server-tls: %v, want Forbidden", err)
		}
	}
}

// impersonate is a client acting as a service account, with the groups the API server gives one.
func impersonate(t *testing.T, admin *rest.Config, ns, name string) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(admin)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + ns + ":" + name,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
