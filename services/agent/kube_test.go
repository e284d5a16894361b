package agent

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	ca "sailplane.dev/services/ca"
	"sailplane.dev/shared/spiffe"
	"sailplane.dev/tools/testenv"
)

// TestTokenAuth: a pod's agent authenticates its first request with its projected
// service-account token (reviewed by the real API server), re-read from the file since the
// kubelet rotates it, then renews with its own certificate, needing the token no more.
func TestTokenAuth(t *testing.T) {
	k := testenv.KubeForTest(t)
	client, err := kubernetes.NewForConfig(k.RestConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().ServiceAccounts("shop").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "cart"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := client.CoreV1().ServiceAccounts("shop").CreateToken(ctx, "cart", &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{Audiences: []string{"istio-ca"}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	c := startCA(t, ca.Config{Kube: k.RestConfig(), CertDir: t.TempDir()})
	cfg := outputs(t, c)
	cfg.TokenFile = filepath.Join(t.TempDir(), "istio-token")
	cfg.CertTTL = 3 * time.Second
	a := startAgent(t, cfg)
	// No token yet (the kubelet has not written it): no request can be authenticated.
	if code := readiness(t, a); code != 503 {
		t.Fatalf("readiness %d without a token, want 503", code)
	}
	if err := os.WriteFile(cfg.TokenFile, []byte(tr.Status.Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	first := waitReady(t, a)
	cart := spiffe.ID{TrustDomain: "cluster.local", Namespace: "shop", ServiceAccount: "cart"}
	checkCredential(t, first, cart, c.svc.RootsPEM())
	if sent := a.tokens(); len(sent) != 1 || !sent[0] {
		t.Fatalf("requests carrying the token: %v, want the first one only", sent)
	}

	// The token goes bad; renewals use the certificate.
	if err := os.WriteFile(cfg.TokenFile, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	eventually(t, "two renewals", func() bool { return a.Published() >= 3 })
	checkCredential(t, a.Current(), cart, c.svc.RootsPEM())
	for i, withToken := range a.tokens()[1:] {
		if withToken {
			t.Errorf("renewal %d sent the token", i+1)
		}
	}
	checkNoKeySent(t, a.sent())
}
