package gatewaystatus

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"sailplane.dev/shared/pki"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"sailplane.dev/shared/gatewayapi"
	"sailplane.dev/shared/testlog"
	"sailplane.dev/shared/testwait"
)

// selfSigned returns a PEM certificate and its PEM private key (a self-signed root).
func selfSigned(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	auth, err := pki.NewSelfSigned(pki.ECDSAP256, "example.com", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	layout, err := pki.IstioLayout(auth)
	if err != nil {
		t.Fatal(err)
	}
	return layout[pki.CACertFile], layout[pki.CAKeyFile]
}

// The transform keeps istiod's verdicts and nothing of the data: what a Secret holds is
// neither in the stored object nor in the error text.
func TestCredentialVerdicts(t *testing.T) {
	cert, key := selfSigned(t)
	otherCert, _ := selfSigned(t)
	garbage := []byte("Hello world\n")
	for _, tc := range []struct {
		name             string
		data             map[string][]byte
		configMap        bool
		wantPair, wantCA string // substrings of the error, "" valid
	}{
		{name: "tls layout", data: map[string][]byte{"tls.crt": cert, "tls.key": key}, wantCA: `didn't have expected keys cacert or ca.crt; found: tls.crt, tls.key`},
		{name: "generic layout with CA", data: map[string][]byte{"cert": cert, "key": key, "cacert": cert}},
		{name: "generic wins over tls", data: map[string][]byte{"cert": garbage, "key": garbage, "tls.crt": cert, "tls.key": key},
			wantPair: "the certificate is malformed: tls: failed to find any PEM data in certificate input", wantCA: "didn't have expected keys"},
		{name: "malformed (the conformance suite's)", data: map[string][]byte{"tls.crt": garbage, "tls.key": garbage},
			wantPair: "the certificate is malformed: tls: failed to find any PEM data in certificate input", wantCA: "found: tls.crt, tls.key"},
		{name: "key of another certificate", data: map[string][]byte{"tls.crt": otherCert, "tls.key": key},
			wantPair: "the certificate is malformed: tls: private key does not match public key", wantCA: "didn't have expected keys"},
		{name: "empty values", data: map[string][]byte{"tls.crt": nil, "tls.key": nil, "ca.crt": nil},
			wantPair: `found keys "tls.crt" and "tls.key", but they were empty`, wantCA: `found key "ca.crt", but it was empty`},
		{name: "other keys", data: map[string][]byte{"a": key, "b": key, "c": key, "d": key},
			wantPair: "didn't have expected keys (cert and key) or (tls.crt and tls.key); found: a, b, c, and 1 more...", wantCA: "found secret, but"},
		{name: "CA only", data: map[string][]byte{"ca.crt": cert}, wantPair: "didn't have expected keys", wantCA: ""},
		{name: "CA malformed", data: map[string][]byte{"ca.crt": garbage}, wantPair: "didn't have expected keys", wantCA: "the bundle is malformed"},
		{name: "ConfigMap CA", data: map[string][]byte{"ca.crt": cert}, configMap: true, wantPair: "a ConfigMap holds no private key"},
		{name: "ConfigMap without CA", data: map[string][]byte{}, configMap: true, wantPair: "a ConfigMap holds no private key",
			wantCA: "found configmap, but didn't have expected keys cacert or ca.crt; found: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			meta := metav1.ObjectMeta{Name: "n", Namespace: "ns", ResourceVersion: "7", Labels: map[string]string{"a": "b"},
				Annotations: map[string]string{"kubectl.kubernetes.io/last-applied-configuration": string(key)}}
			var obj any = &corev1.Secret{ObjectMeta: meta, Data: tc.data}
			if tc.configMap {
				cm := &corev1.ConfigMap{ObjectMeta: meta, Data: map[string]string{}}
				for k, v := range tc.data {
					cm.Data[k] = string(v)
				}
				obj = cm
			}
			out, err := toCredential(obj)
			if err != nil {
				t.Fatal(err)
			}
			c, ok := out.(*credential)
			if !ok {
				t.Fatalf("transformed to %T, want *credential", out)
			}
			if k, _ := cache.MetaNamespaceKeyFunc(c); k != "ns/n" || c.ResourceVersion != "7" {
				t.Errorf("key %q, resourceVersion %q", k, c.ResourceVersion)
			}
			if c.Labels != nil || c.Annotations != nil {
				t.Errorf("metadata kept beyond name, namespace, uid and resourceVersion: %+v", c.ObjectMeta)
			}
			for what, got := range map[string]string{"key pair": c.pairErr, "CA": c.caErr} {
				want := tc.wantPair
				if what == "CA" {
					want = tc.wantCA
				}
				if (want == "") != (got == "") || !strings.Contains(got, want) {
					t.Errorf("%s: error %q, want one containing %q", what, got, want)
				}
				if strings.Contains(got, "PRIVATE KEY") || strings.Contains(got, "Hello") {
					t.Errorf("%s: error %q shows the data", what, got)
				}
			}
			again, _ := toCredential(c)
			if again != c {
				t.Error("a credential transformed again is not kept as it is")
			}
		})
	}
}

func TestCredentialRegistry(t *testing.T) {
	cert, key := selfSigned(t)
	secrets, configMaps := cache.NewStore(cache.MetaNamespaceKeyFunc), cache.NewStore(cache.MetaNamespaceKeyFunc)
	add := func(store cache.Store, obj any) {
		c, _ := toCredential(obj)
		if err := store.Add(c); err != nil {
			t.Fatal(err)
		}
	}
	add(secrets, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "good"}, Data: map[string][]byte{"tls.crt": cert, "tls.key": key}})
	add(configMaps, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "ca"}, Data: map[string]string{"ca.crt": string(cert)}})
	r := credentialRegistry{registry: newRegistry(nil, nil, "cluster.local", nil), secrets: secrets, configMaps: configMaps}
	for _, tc := range []struct {
		kind, name string
		caOnly     bool
		want       string
	}{
		{"Secret", "good", false, ""},
		{"Secret", "good", true, "didn't have expected keys cacert or ca.crt"},
		{"Secret", "missing", false, "secret ns/missing not found"},
		{"ConfigMap", "ca", true, ""},
		{"ConfigMap", "missing", true, "configmap ns/missing not found"},
		{"Service", "good", true, "unsupported kind Service"},
	} {
		err := r.Certificate(tc.kind, "ns", tc.name, tc.caOnly)
		if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Certificate(%s, ns, %s, %v) = %v, want %q", tc.kind, tc.name, tc.caOnly, err, tc.want)
		}
	}
}

// Where config-ingest may not read Secrets, the status is still written, references taken as
// valid (as with the check off), instead of waiting forever for informers that cannot sync.
func TestCredentialsNotReadable(t *testing.T) {
	e := newEnv(t)
	user := "no-secrets-" + e.ns
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"gateway.networking.k8s.io"}, Resources: []string{"*"}, Verbs: []string{"get", "list", "watch", "update"}},
		{APIGroups: []string{""}, Resources: []string{"services", "namespaces"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"networking.istio.io"}, Resources: []string{"serviceentries"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
	}}
	if _, err := e.kube.RbacV1().ClusterRoles().Create(t.Context(), role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.kube.RbacV1().ClusterRoleBindings().Create(t.Context(), &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user}, RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: user},
		Subjects: []rbacv1.Subject{{Kind: "User", Name: user}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.kube.RbacV1().ClusterRoleBindings().Delete(context.Background(), user, metav1.DeleteOptions{})
		_ = e.kube.RbacV1().ClusterRoles().Delete(context.Background(), user, metav1.DeleteOptions{})
	})
	if _, err := e.gw.GatewayV1().Gateways(e.ns).Create(t.Context(), &gwv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: "tls"},
		Spec: gwv1.GatewaySpec{GatewayClassName: gwv1.ObjectName(e.class), Listeners: []gwv1.Listener{{Name: "https", Port: 443,
			Protocol: gwv1.HTTPSProtocolType, TLS: &gwv1.ListenerTLSConfig{CertificateRefs: []gwv1.SecretObjectReference{{Name: "missing"}}}}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rc := rest.CopyConfig(e.k.RestConfig())
	rc.Impersonate = rest.ImpersonationConfig{UserName: user}
	log, logs := testlog.NewRecording(t, slog.LevelDebug)
	w, err := New(rc, Config{Translate: gatewayapi.Translate, Leader: func() bool { return true }, Credentials: true, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	testwait.Until(t, waitTimeout, "the listener's status written, its reference taken as valid", func() bool {
		g, err := e.gw.GatewayV1().Gateways(e.ns).Get(t.Context(), "tls", metav1.GetOptions{})
		if err != nil || len(g.Status.Listeners) == 0 {
			return false
		}
		c := meta.FindStatusCondition(g.Status.Listeners[0].Conditions, "ResolvedRefs")
		return c != nil && c.Status == metav1.ConditionTrue
	})
	if logs.Count("are not checked") != 1 {
		t.Errorf("%d warnings that certificates are not checked, want 1", logs.Count("are not checked"))
	}
}
