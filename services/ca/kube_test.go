package ca

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	pb "istio.io/api/security/v1alpha1"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/spiffe"
	"sailplane.dev/shared/testlog"
	"sailplane.dev/tools/testenv"
)

// kubeEnv is one API server shared by the Kubernetes tests, each in its own namespaces.
type kubeEnv struct {
	kube   *testenv.Kube
	cfg    *rest.Config
	client kubernetes.Interface
}

func newKubeEnv(t testing.TB) *kubeEnv {
	k := testenv.KubeForTest(t)
	cfg := k.RestConfig()
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &kubeEnv{kube: k, cfg: cfg, client: c}
}

func (e *kubeEnv) namespace(t testing.TB, name string) string {
	t.Helper()
	if _, err := e.client.CoreV1().Namespaces().Create(ctxT(t), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}

// token creates a ServiceAccount and asks the API server for a token of it (TokenRequest).
func (e *kubeEnv) token(t testing.TB, ns, sa string, audiences ...string) string {
	t.Helper()
	ctx := ctxT(t)
	_, err := e.client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
	if err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	tr, err := e.client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{Audiences: audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// tokens creates a ServiceAccount and asks the API server for n distinct tokens of it.
func (e *kubeEnv) tokens(t testing.TB, ns, sa string, n int) []string {
	t.Helper()
	e.token(t, ns, sa, "istio-ca") // creates the ServiceAccount
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tokens := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	for range 8 {
		wg.Go(func() {
			for i := range next {
				tr, err := e.client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authnv1.TokenRequest{
					Spec: authnv1.TokenRequestSpec{Audiences: []string{"istio-ca"}},
				}, metav1.CreateOptions{})
				if err != nil {
					select {
					case errs <- err:
					default:
					}
					return
				}
				tokens[i] = tr.Status.Token
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	return tokens
}

func TestKubernetes(t *testing.T) {
	env := newKubeEnv(t)
	t.Run("TokenAuth", func(t *testing.T) { testTokenAuth(t, env) })
	t.Run("SecretRootPersists", func(t *testing.T) { testSecretRootPersists(t, env) })
	t.Run("ConcurrentStartsShareOneRoot", func(t *testing.T) { testConcurrentStarts(t, env) })
	t.Run("DamagedSecretRefusesToStart", func(t *testing.T) { testDamagedSecret(t, env) })
	t.Run("PluggedSecret", func(t *testing.T) { testPluggedSecret(t, env) })
	t.Run("RootCertConfigMaps", func(t *testing.T) { testRootCertConfigMaps(t, env) })
	t.Run("ServingCertSecret", func(t *testing.T) { testServingCertSecret(t, env) })
	t.Run("RootRotationSecret", func(t *testing.T) { testRootRotationSecret(t, env) })
	// Last: it stops the API server for a while.
	t.Run("APIServerDown", func(t *testing.T) { testAPIServerDown(t, env) })
}

// Without the API server, a token reviewed before still works (cached), a new one is
// Unavailable (retry later), not Unauthenticated; certificate authentication is unaffected.
func testAPIServerDown(t *testing.T, env *kubeEnv) {
	ns := env.namespace(t, "ca-outage")
	r := startCA(t, Config{Kube: env.cfg, Namespace: ns})
	cl := r.client(t, r.RootsPEM(), nil)
	id := spiffe.ID{TrustDomain: "cluster.local", Namespace: ns, ServiceAccount: "known"}
	known, fresh := env.token(t, ns, "known", "istio-ca"), env.token(t, ns, "fresh", "istio-ca")
	key, csr := newCSR(t, pki.ECDSAP256, id)
	resp, err := cl.CreateCertificate(withToken(ctxT(t), known), &pb.IstioCertificateRequest{Csr: csr})
	if err != nil {
		t.Fatal(err)
	}

	laterNS := env.namespace(t, "ca-outage-start")
	env.kube.StopAPIServer()
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			_ = env.kube.StartAPIServer(ctxT(t))
		}
	})
	// A ca starting now waits for the API server instead of failing.
	later, err := New(Config{Kube: env.cfg, Namespace: laterNS, Listen: "127.0.0.1:0"}, Deps{Logger: testlog.New(t, slog.LevelInfo)})
	if err != nil {
		t.Fatal(err)
	}
	laterCtx, stopLater := context.WithCancel(context.Background())
	laterDone := make(chan error, 1)
	go func() { laterDone <- later.Run(laterCtx) }()
	defer func() { stopLater(); <-laterDone }()

	if _, err := cl.CreateCertificate(withToken(ctxT(t), known), &pb.IstioCertificateRequest{Csr: csr}); err != nil {
		t.Fatalf("cached token with the API server down: %v", err)
	}
	_, freshCSR := newCSR(t, pki.ECDSAP256, spiffe.ID{TrustDomain: "cluster.local", Namespace: ns, ServiceAccount: "fresh"})
	_, err = cl.CreateCertificate(withToken(ctxT(t), fresh), &pb.IstioCertificateRequest{Csr: freshCSR})
	wantCode(t, err, codes.Unavailable, "TokenReview")
	resp2, err := r.client(t, r.RootsPEM(), tlsCert(resp, key)).CreateCertificate(ctxT(t), &pb.IstioCertificateRequest{Csr: csr})
	if err != nil {
		t.Fatalf("certificate authentication with the API server down: %v", err)
	}
	checkChain(t, resp2, id, r.RootsPEM())

	restarted = true
	if err := env.kube.StartAPIServer(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-later.Ready():
	case err := <-laterDone:
		t.Fatalf("the ca started during the outage gave up: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the ca started during the outage is not ready 30s after the API server came back")
	}
}

func testTokenAuth(t *testing.T, env *kubeEnv) {
	caNS := env.namespace(t, "ca-token")
	appNS := env.namespace(t, "shop")
	// Count TokenReviews to see the cache at work.
	var reviews atomic.Int64
	kcfg := rest.CopyConfig(env.cfg)
	kcfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if strings.HasSuffix(req.URL.Path, "/tokenreviews") {
				reviews.Add(1)
			}
			return rt.RoundTrip(req)
		})
	})
	r := startCA(t, Config{Kube: kcfg, Namespace: caNS})
	roots := r.RootsPEM()
	cart := spiffe.ID{TrustDomain: "cluster.local", Namespace: appNS, ServiceAccount: "cart"}
	token := env.token(t, appNS, "cart", "istio-ca")
	key, csr := newCSR(t, pki.ECDSAP256, cart)
	cl := r.client(t, roots, nil)

	resp, err := cl.CreateCertificate(withToken(ctxT(t), token), &pb.IstioCertificateRequest{Csr: csr, ValidityDuration: 3600})
	if err != nil {
		t.Fatal(err)
	}
	leaf := checkChain(t, resp, cart, roots)
	if got := time.Until(leaf.NotAfter); got > time.Hour || got < 59*time.Minute {
		t.Fatalf("lifetime %s, want 1h", got)
	}

	// A token storm costs one review while the cached one is fresh.
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Go(func() {
			_, err := cl.CreateCertificate(withToken(ctxT(t), token), &pb.IstioCertificateRequest{Csr: csr})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := reviews.Load(); n != 1 {
		t.Fatalf("%d TokenReviews for one token, want 1", n)
	}

	// The certificate just issued authenticates the next request, without a token.
	resp2, err := r.client(t, roots, tlsCert(resp, key)).CreateCertificate(ctxT(t), &pb.IstioCertificateRequest{Csr: csr})
	if err != nil {
		t.Fatal(err)
	}
	checkChain(t, resp2, cart, roots)

	_, otherCSR := newCSR(t, pki.ECDSAP256, spiffe.ID{TrustDomain: "cluster.local", Namespace: appNS, ServiceAccount: "payments"})
	for _, tc := range []struct {
		name     string
		ctx      context.Context
		csr      string
		code     codes.Code
		contains string
	}{
		{"garbage token", withToken(ctxT(t), "not-a-jwt"), csr, codes.Unauthenticated, "invalid bearer token"},
		{"token for another audience", withToken(ctxT(t), env.token(t, appNS, "cart", "vault")), csr, codes.Unauthenticated, `audiences ["vault"] is invalid`},
		{"token of the API server's audience", withToken(ctxT(t), env.token(t, appNS, "cart")), csr, codes.Unauthenticated, "is invalid for the target audiences"},
		{"other cluster", metadata.AppendToOutgoingContext(withToken(ctxT(t), token), "clusterid", "east"), csr, codes.Unauthenticated, `claims cluster "east"`},
		{"CSR for another identity", withToken(ctxT(t), token), otherCSR, codes.PermissionDenied, "/sa/payments"},
		{"malformed CSR", withToken(ctxT(t), token), "junk", codes.InvalidArgument, "certificate signing request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := cl.CreateCertificate(tc.ctx, &pb.IstioCertificateRequest{Csr: tc.csr})
			wantCode(t, err, tc.code, tc.contains)
		})
	}
	// A token of the right cluster name passes.
	if _, err := cl.CreateCertificate(metadata.AppendToOutgoingContext(withToken(ctxT(t), token), "clusterid", "Kubernetes"), &pb.IstioCertificateRequest{Csr: csr}); err != nil {
		t.Fatal(err)
	}
	if got := r.Stats(); got.Signed != 23 || got.Unauthenticated != 4 || got.PermissionDenied != 1 || got.InvalidArgument != 1 {
		t.Fatalf("stats %+v", got)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func testSecretRootPersists(t *testing.T, env *kubeEnv) {
	ns := env.namespace(t, "ca-persist")
	first := startCA(t, Config{Kube: env.cfg, Namespace: ns})
	roots := first.RootsPEM()
	secret, err := env.client.CoreV1().Secrets(ns).Get(ctxT(t), RootSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if secret.Type != RootSecretType {
		t.Fatalf("Secret type %q, want %q", secret.Type, RootSecretType)
	}
	if string(secret.Data[pki.RootCertFile]) != string(roots) || string(secret.Data[pki.CACertFile]) != string(roots) || len(secret.Data[pki.CAKeyFile]) == 0 {
		t.Fatalf("Secret is not in istiod's layout: keys %v", keys(secret.Data))
	}
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}
	second := startCA(t, Config{Kube: env.cfg, Namespace: ns})
	if string(second.RootsPEM()) != string(roots) {
		t.Fatal("a restart changed the root")
	}
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func testConcurrentStarts(t *testing.T, env *kubeEnv) {
	ns := env.namespace(t, "ca-race")
	const replicas = 3
	var wg sync.WaitGroup
	started := make([]*running, replicas)
	errs := make([]error, replicas)
	for i := range replicas {
		wg.Go(func() { started[i], errs[i] = tryStartCA(t, Config{Kube: env.cfg, Namespace: ns}) })
	}
	wg.Wait()
	for i := range replicas {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if string(started[i].RootsPEM()) != string(started[0].RootsPEM()) {
			t.Fatalf("replica %d uses another root than replica 0", i)
		}
	}
	secret, err := env.client.CoreV1().Secrets(ns).Get(ctxT(t), RootSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if string(secret.Data[pki.RootCertFile]) != string(started[0].RootsPEM()) {
		t.Fatal("the replicas' root is not the stored one")
	}
}

func testDamagedSecret(t *testing.T, env *kubeEnv) {
	for name, data := range map[string]map[string][]byte{
		"corrupt":      {pki.CACertFile: []byte("garbage"), pki.CAKeyFile: []byte("garbage")},
		"key missing":  {pki.CACertFile: mustRootPEM(t)},
		"empty Secret": {},
	} {
		t.Run(name, func(t *testing.T) {
			ns := env.namespace(t, "ca-damaged-"+strings.ToLower(strings.ReplaceAll(name, " ", "-")))
			_, err := env.client.CoreV1().Secrets(ns).Create(ctxT(t), &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: RootSecret}, Type: RootSecretType, Data: data,
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			before, _ := env.client.CoreV1().Secrets(ns).Get(ctxT(t), RootSecret, metav1.GetOptions{})
			_, err = tryStartCA(t, Config{Kube: env.cfg, Namespace: ns})
			if !errors.Is(err, ErrStoredCA) || !strings.Contains(err.Error(), "Secret "+ns+"/"+RootSecret) {
				t.Fatalf("start with a damaged Secret: %v, want ErrStoredCA naming it", err)
			}
			after, _ := env.client.CoreV1().Secrets(ns).Get(ctxT(t), RootSecret, metav1.GetOptions{})
			if after.ResourceVersion != before.ResourceVersion {
				t.Fatal("the refused start changed the Secret")
			}
		})
	}
}

func mustRootPEM(t *testing.T) []byte {
	a, err := pki.NewSelfSigned(pki.ECDSAP256, "x", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return pki.EncodeCerts(a.Cert)
}

func testPluggedSecret(t *testing.T, env *kubeEnv) {
	caNS := env.namespace(t, "ca-plugged")
	appNS := env.namespace(t, "plugged-app")
	root, files := writePlugged(t, "")
	if _, err := env.client.CoreV1().Secrets(caNS).Create(ctxT(t), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: PluggedSecret}, Data: files,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r := startCA(t, Config{Kube: env.cfg, Namespace: caNS})
	roots := pki.EncodeCerts(root.Cert)
	id := spiffe.ID{TrustDomain: "cluster.local", Namespace: appNS, ServiceAccount: "api"}
	_, csr := newCSR(t, pki.RSA2048, id)
	resp, err := r.client(t, roots, nil).CreateCertificate(withToken(ctxT(t), env.token(t, appNS, "api", "istio-ca")), &pb.IstioCertificateRequest{Csr: csr})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.CertChain) != 3 {
		t.Fatalf("chain of %d entries, want leaf, intermediate, root", len(resp.CertChain))
	}
	checkChain(t, resp, id, roots)
	if _, err := env.client.CoreV1().Secrets(caNS).Get(ctxT(t), RootSecret, metav1.GetOptions{}); err == nil {
		t.Fatal("a self-signed root was stored beside the plugged-in CA")
	}
}
