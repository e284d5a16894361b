package ca

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"testing"
	"time"

	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/testwait"
)

// testRootCertConfigMaps: the ca writes istio-ca-root-cert (root-cert.pem: its roots) into the
// namespaces the mesh config's discoverySelectors select (and its own), a new selected
// namespace gets it, an edited or deleted one is restored, and a namespace labelled in later or
// selectors dropped from the mesh config (on the bus) extend it.
func testRootCertConfigMaps(t *testing.T, env *kubeEnv) {
	meshStore := bus.NewStore()
	selective := &meshv1alpha1.MeshConfig{
		RootNamespace:      "rootcm-ca",
		DiscoverySelectors: []*meshv1alpha1.LabelSelector{{MatchLabels: map[string]string{"mesh": "on"}}},
	}
	if err := meshStore.Replace(schema.MeshConfig.TypeURL, []*bus.Resource{{Name: "mesh", Body: selective}}); err != nil {
		t.Fatal(err)
	}
	caNS := env.namespace(t, "rootcm-ca")
	outside := env.namespace(t, "rootcm-outside")
	r, err := tryStartCAWith(t, Config{Kube: env.cfg, Namespace: caNS}, Deps{Mesh: bus.Local(meshStore)})
	if err != nil {
		t.Fatal(err)
	}
	roots := string(r.RootsPEM())
	ctx := ctxT(t)
	cms := func(ns string) *corev1.ConfigMap {
		cm, err := env.client.CoreV1().ConfigMaps(ns).Get(ctx, RootCertConfigMap, metav1.GetOptions{})
		if err != nil {
			return nil
		}
		return cm
	}
	hasRoots := func(ns string) func() error {
		return func() error {
			cm := cms(ns)
			if cm == nil {
				return fmt.Errorf("no %s/%s", ns, RootCertConfigMap)
			}
			if cm.Data[RootCertKey] != roots {
				return fmt.Errorf("%s/%s holds %v, want %s with the roots", ns, RootCertConfigMap, cm.Data, RootCertKey)
			}
			return nil
		}
	}
	waitFor(t, hasRoots(caNS))

	// A new namespace the selectors select gets it.
	if _, err := env.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: "rootcm-inside", Labels: map[string]string{"mesh": "on"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, hasRoots("rootcm-inside"))
	// Namespaces are handled in order of events: the outside one, older, was seen before.
	if cms(outside) != nil {
		t.Fatalf("%s, not selected, got the ConfigMap", outside)
	}

	// Edited: restored; a key someone added is kept, as istiod keeps it.
	cm := cms("rootcm-inside")
	cm.Data[RootCertKey] = "tampered"
	cm.Data["extra"] = "x"
	if _, err := env.client.CoreV1().ConfigMaps("rootcm-inside").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, hasRoots("rootcm-inside"))
	if got := cms("rootcm-inside").Data["extra"]; got != "x" {
		t.Errorf("the added key became %q, want kept", got)
	}
	// Deleted: recreated.
	if err := env.client.CoreV1().ConfigMaps("rootcm-inside").Delete(ctx, RootCertConfigMap, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, hasRoots("rootcm-inside"))

	// Labelled in later: gets it.
	ns, err := env.client.CoreV1().Namespaces().Get(ctx, outside, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns.Labels = map[string]string{"mesh": "on"}
	if _, err := env.client.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, hasRoots(outside))

	// Selectors dropped from the mesh config: every namespace gets it.
	late := env.namespace(t, "rootcm-unlabelled")
	// Handled after the unlabelled one: once it has the ConfigMap, the unlabelled one was seen.
	if _, err := env.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: "rootcm-marker", Labels: map[string]string{"mesh": "on"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, hasRoots("rootcm-marker"))
	if cms(late) != nil {
		t.Fatalf("%s, not selected, got the ConfigMap", late)
	}
	if err := meshStore.Replace(schema.MeshConfig.TypeURL, []*bus.Resource{{Name: "mesh", Body: &meshv1alpha1.MeshConfig{RootNamespace: "rootcm-ca"}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, hasRoots(late))
}

// waitFor polls cond until it returns nil, failing the test with its last error after 30s.
func waitFor(t *testing.T, cond func() error) {
	t.Helper()
	testwait.For(t, 30*time.Second, "condition", cond)
}

// testServingCertSecret: the ca keeps a serving certificate for xds-server in a
// kubernetes.io/tls Secret of another namespace: a key pair that verifies with the roots (ca.crt)
// for istiod's name.
func testServingCertSecret(t *testing.T, env *kubeEnv) {
	caNS, xdsNS := env.namespace(t, "serving-ca"), env.namespace(t, "serving-xds")
	r, err := tryStartCA(t, Config{Kube: env.cfg, Namespace: caNS, ServingCertSecret: xdsNS + "/xds-server-tls"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	var secret *corev1.Secret
	waitFor(t, func() error {
		secret, err = env.client.CoreV1().Secrets(xdsNS).Get(ctx, "xds-server-tls", metav1.GetOptions{})
		return err
	})
	if secret.Type != corev1.SecretTypeTLS || string(secret.Data[ServingRootFile]) != string(r.RootsPEM()) {
		t.Fatalf("Secret type %q, ca.crt\n%s\nwant %s with the roots", secret.Type, secret.Data[ServingRootFile], corev1.SecretTypeTLS)
	}
	pair, err := tls.X509KeyPair(secret.Data[ServingCertFile], secret.Data[ServingKeyFile])
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(secret.Data[ServingRootFile])
	if _, err := pair.Leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "istiod." + caNS + ".svc"}); err != nil {
		t.Fatalf("serving certificate: %v", err)
	}
}
