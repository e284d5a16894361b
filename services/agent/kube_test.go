package agent

import (
	"bytes"
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

	// The ca comes back with another root (its CA was lost and replaced): the workload's
	// certificate is foreign now and refused; the token, good again, gets a new one.
	if err := os.WriteFile(cfg.TokenFile, []byte(tr.Status.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	c.stop()
	before := len(a.tokens())
	c2 := startCA(t, ca.Config{Kube: k.RestConfig(), CertDir: t.TempDir(), Listen: c.Addr()})
	if err := os.WriteFile(c.RootFile, c2.svc.RootsPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a certificate under the new root", func() bool { return bytes.Equal(a.Current().RootsPEM, c2.svc.RootsPEM()) })
	checkCredential(t, a.Current(), cart, c2.svc.RootsPEM())
	sent := a.tokens()[before:]
	fellBack := false
	for i := 1; i < len(sent); i++ {
		fellBack = fellBack || !sent[i-1] && sent[i]
	}
	if !fellBack {
		t.Errorf("requests since the new root carried the token: %v; want a certificate attempt, then the token", sent)
	}
	if c2.svc.Stats().Unauthenticated == 0 {
		t.Error("the new ca refused nothing: the foreign certificate was not tried")
	}
	checkNoKeySent(t, a.sent())
}
