package ca

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	pb "istio.io/api/security/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	securityv1 "sailplane.dev/proto/security/v1"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/spiffe"
)

// rotationCA is a ca started on dir for a rotation test, with the bus it publishes on.
type rotationCA struct {
	*running
	store *bus.Store
}

func startRotationCA(t *testing.T, cfg Config) rotationCA {
	t.Helper()
	store := bus.NewStore()
	r, err := tryStartCAWith(t, cfg, Deps{Publisher: store})
	if err != nil {
		t.Fatal(err)
	}
	return rotationCA{running: r, store: store}
}

// bundle is the roots on the bus, in order.
func (r rotationCA) bundle(t *testing.T) []*x509.Certificate {
	t.Helper()
	res, ok := r.store.Get(schema.TrustBundle.TypeURL, "cluster.local")
	if !ok {
		t.Fatal("no trust bundle on the bus")
	}
	var roots []*x509.Certificate
	for _, pemRoot := range res.Body.(*securityv1.TrustBundle).GetRootCertificates() {
		c, err := pki.ParseCerts([]byte(pemRoot))
		if err != nil {
			t.Fatal(err)
		}
		roots = append(roots, c...)
	}
	return roots
}

// waitBundle waits until the bus and RootsPEM hold want, in order, and the folder's root-cert.pem
// too.
func (r rotationCA) waitBundle(t *testing.T, dir string, want ...*x509.Certificate) {
	t.Helper()
	waitFor(t, func() error {
		got := r.bundle(t)
		if !sameCerts(got, want) {
			return fmt.Errorf("bus bundle has %d roots %v, want %v", len(got), serials(got), serials(want))
		}
		if string(r.RootsPEM()) != string(pki.EncodeCerts(want...)) {
			return fmt.Errorf("RootsPEM is not the bundle")
		}
		if file, _ := os.ReadFile(filepath.Join(dir, pki.RootCertFile)); dir != "" && string(file) != string(pki.EncodeCerts(want...)) {
			return fmt.Errorf("%s is not the bundle", pki.RootCertFile)
		}
		return nil
	})
}

func sameCerts(a, b []*x509.Certificate) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].Equal(b[i]) {
			return false
		}
	}
	return true
}

func serials(cs []*x509.Certificate) []string {
	var s []string
	for _, c := range cs {
		s = append(s, c.SerialNumber.Text(16)[:8])
	}
	return s
}

// sign asks r for a certificate for app, authenticated with client, and checks it chains to the
// bundle r returns; it returns the leaf.
func (r rotationCA) sign(t *testing.T, client *tls.Certificate) *x509.Certificate {
	t.Helper()
	roots := r.RootsPEM()
	_, csr := newCSR(t, pki.ECDSAP256, app)
	resp, err := r.client(t, roots, client).CreateCertificate(ctxT(t), &pb.IstioCertificateRequest{Csr: csr})
	if err != nil {
		t.Fatal(err)
	}
	return checkChain(t, resp, app, roots)
}

func signedBy(t *testing.T, leaf, root *x509.Certificate, want bool) {
	t.Helper()
	if got := leaf.CheckSignatureFrom(root) == nil; got != want {
		t.Fatalf("leaf signed by root %s: %v, want %v", root.SerialNumber.Text(16)[:8], got, want)
	}
}

// verifies checks leaf verifies against the roots.
func verifies(t *testing.T, leaf *x509.Certificate, roots []*x509.Certificate) {
	t.Helper()
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("leaf does not verify against the bundle: %v", err)
	}
}

func rotationPhase(t *testing.T, dir string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, RotationFile))
	if os.IsNotExist(err) {
		return "done"
	}
	var st rotationState
	if err == nil {
		err = json.Unmarshal(data, &st)
	}
	if err != nil {
		t.Fatal(err)
	}
	return st.Phase
}

// TestRootRotationResumesAcrossRestarts takes a rotation through its phases, each period set by
// the configuration of the start that ends it, and restarts the ca in every phase: the bundle goes
// {old} → {old,new} → {new,old} (new signing) → {new}; the restart never mints a third root.
func TestRootRotationResumesAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	long := Config{CertDir: dir, MaxCertTTL: time.Hour, DefaultCertTTL: time.Hour}

	first := startRotationCA(t, long)
	old := first.bundle(t)[0]
	oldLeaf := first.sign(t, issueClient(t, dir, app, pki.ECDSAP256))
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}

	// Phase 1: the new root joins the bundle; the old root still signs.
	rotate := long
	rotate.RotateRootBefore, rotate.RootRotationGrace = nextSecond(), time.Hour
	var next *x509.Certificate
	for run := range 2 {
		r := startRotationCA(t, rotate)
		waitFor(t, func() error {
			if got := r.bundle(t); len(got) != 2 {
				return fmt.Errorf("bundle has %d roots, want 2", len(got))
			}
			return nil
		})
		if run == 0 {
			next = r.bundle(t)[1]
		}
		r.waitBundle(t, dir, old, next)
		if p := rotationPhase(t, dir); p != phaseTrustNew {
			t.Fatalf("run %d: phase %s, want %s", run, p, phaseTrustNew)
		}
		leaf := r.sign(t, issueClient(t, dir, app, pki.ECDSAP256))
		signedBy(t, leaf, old, true)
		verifies(t, oldLeaf, r.bundle(t))
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
	}

	// Phase 2: the grace period is over: the new root signs, both are trusted.
	rotate.RootRotationGrace = time.Nanosecond
	var newLeaf *x509.Certificate
	for run := range 2 {
		r := startRotationCA(t, rotate)
		r.waitBundle(t, dir, next, old)
		if p := rotationPhase(t, dir); p != phaseSignNew {
			t.Fatalf("run %d: phase %s, want %s", run, p, phaseSignNew)
		}
		// The old root's certificate still authenticates, and its leaves still verify.
		newLeaf = r.sign(t, issueClient(t, dir, app, pki.ECDSAP256))
		signedBy(t, newLeaf, next, true)
		verifies(t, oldLeaf, r.bundle(t))
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
	}

	// Phase 3: the old root's leaves have expired (MaxCertTTL): it leaves the bundle. Restarts
	// with the same setting keep the new root.
	rotate.MaxCertTTL, rotate.DefaultCertTTL = time.Millisecond, time.Millisecond
	for run := range 2 {
		r := startRotationCA(t, rotate)
		r.waitBundle(t, dir, next)
		if p := rotationPhase(t, dir); p != "done" {
			t.Fatalf("run %d: phase %s, want done", run, p)
		}
		for _, f := range []string{NextCACertFile, NextCAKeyFile} {
			if _, err := os.Stat(filepath.Join(dir, f)); !os.IsNotExist(err) {
				t.Fatalf("%s left after the rotation: %v", f, err)
			}
		}
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
	}
	r := startRotationCA(t, Config{CertDir: dir, MaxCertTTL: time.Hour, DefaultCertTTL: time.Hour, RotateRootBefore: rotate.RotateRootBefore})
	verifies(t, newLeaf, []*x509.Certificate{next})
	signedBy(t, r.sign(t, issueClient(t, dir, app, pki.ECDSAP256)), next, true)
	if got := r.bundle(t); !sameCerts(got, []*x509.Certificate{next}) {
		t.Fatalf("a restart after the rotation changed the bundle to %v", serials(got))
	}
}

// TestRootRotationRunsThrough: without restarts, short periods take the ca through every phase;
// every bundle seen on the bus is one of the phases', in order, and the serving certificate
// follows (a client trusting only the new root connects and gets a leaf of the new root).
func TestRootRotationRunsThrough(t *testing.T) {
	dir := t.TempDir()
	first := startRotationCA(t, Config{CertDir: dir})
	old := first.bundle(t)[0]
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}
	servingDir := t.TempDir()
	r := startRotationCA(t, Config{CertDir: dir, RotateRootBefore: nextSecond(), RootRotationGrace: 300 * time.Millisecond,
		MaxCertTTL: 300 * time.Millisecond, DefaultCertTTL: 300 * time.Millisecond, ServingCertDir: servingDir})
	var seen [][]*x509.Certificate
	waitFor(t, func() error {
		b := r.bundle(t)
		if len(seen) == 0 || !sameCerts(seen[len(seen)-1], b) {
			seen = append(seen, b)
		}
		if len(b) == 1 && !b[0].Equal(old) {
			return nil
		}
		return fmt.Errorf("bundle %v: the rotation has not ended", serials(b))
	})
	next := seen[len(seen)-1][0]
	phases := [][]*x509.Certificate{{old}, {old, next}, {next, old}, {next}}
	for _, b := range seen {
		for len(phases) > 0 && !sameCerts(phases[0], b) {
			phases = phases[1:]
		}
		if len(phases) == 0 {
			t.Fatalf("bundles seen out of order or unexpected: %v", seen)
		}
	}
	r.waitBundle(t, dir, next)
	// The serving certificate kept for xds-server follows: the new root signs it and is its ca.crt.
	waitFor(t, func() error {
		caCrt, _ := os.ReadFile(filepath.Join(servingDir, ServingRootFile))
		if string(caCrt) != string(pki.EncodeCerts(next)) {
			return fmt.Errorf("%s is not the new bundle", ServingRootFile)
		}
		data, err := os.ReadFile(filepath.Join(servingDir, ServingCertFile))
		if err != nil {
			return err
		}
		crt, err := pki.ParseCerts(data)
		if err != nil || len(crt) == 0 {
			return fmt.Errorf("%s: %v", ServingCertFile, err)
		}
		if crt[0].CheckSignatureFrom(next) != nil {
			return fmt.Errorf("%s is not signed by the new root", ServingCertFile)
		}
		return nil
	})
	// The client trusts only the new root: the serving certificate chains to it.
	_, csr := newCSR(t, pki.ECDSAP256, app)
	resp, err := r.client(t, pki.EncodeCerts(next), issueClient(t, dir, app, pki.ECDSAP256)).
		CreateCertificate(ctxT(t), &pb.IstioCertificateRequest{Csr: csr})
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := pki.ParseCerts([]byte(resp.GetCertChain()[0]))
	if err != nil {
		t.Fatal(err)
	}
	signedBy(t, leaf[0], next, true) // its 300 ms lifetime may be over: only the signature is checked
}

// nextSecond is a RotateRootBefore after a root created now (roots are dated to the second).
func nextSecond() time.Time { return time.Now().Truncate(time.Second).Add(time.Second) }

// TestRootRotationSwitchCutShort: a ca stopped while it switched signing (the rotation file says
// sign-new, ca-key.pem already the new root's key, ca-cert.pem still the old root) starts, signs
// with the new root, trusts both, and finishes the switch on disk.
func TestRootRotationSwitchCutShort(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{CertDir: dir, MaxCertTTL: time.Hour, DefaultCertTTL: time.Hour}
	first := startRotationCA(t, cfg)
	old := first.bundle(t)[0]
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}
	cfg.RotateRootBefore, cfg.RootRotationGrace = nextSecond(), time.Hour
	r := startRotationCA(t, cfg)
	waitFor(t, func() error {
		if rotationPhase(t, dir) != phaseTrustNew || len(r.bundle(t)) != 2 {
			return fmt.Errorf("rotation not begun")
		}
		return nil
	})
	next := r.bundle(t)[1]
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	// The first two writes of the switch.
	data, _ := json.Marshal(rotationState{Phase: phaseSignNew, Since: time.Now()})
	key, err := os.ReadFile(filepath.Join(dir, NextCAKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{RotationFile: data, pki.CAKeyFile: key} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	r = startRotationCA(t, cfg)
	r.waitBundle(t, dir, next, old)
	signedBy(t, r.sign(t, issueClient(t, dir, app, pki.ECDSAP256)), next, true)
	if cert, _ := os.ReadFile(filepath.Join(dir, pki.CACertFile)); string(cert) != string(pki.EncodeCerts(next)) {
		t.Fatalf("%s is not the new root after the switch was finished", pki.CACertFile)
	}
}

// testRootRotationSecret: with the root in istio-ca-secret, a rotation goes through its phases,
// kept in the Secret (restarts between them included, two replicas stepping at once in the
// switch), and istio-ca-root-cert follows.
func testRootRotationSecret(t *testing.T, env *kubeEnv) {
	ns := env.namespace(t, "rotation-ca")
	cfg := Config{Kube: env.cfg, Namespace: ns, MaxCertTTL: time.Hour, DefaultCertTTL: time.Hour}
	secretPhase := func() string {
		t.Helper()
		secret, err := env.client.CoreV1().Secrets(ns).Get(ctxT(t), RootSecret, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var st rotationState
		if data := secret.Data[RotationFile]; data != nil {
			if err := json.Unmarshal(data, &st); err != nil {
				t.Fatal(err)
			}
		}
		return phaseName(st.Phase)
	}
	configMapHolds := func(want ...*x509.Certificate) {
		t.Helper()
		waitFor(t, func() error {
			cm, err := env.client.CoreV1().ConfigMaps(ns).Get(ctxT(t), RootCertConfigMap, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if got := cm.Data[RootCertKey]; got != string(pki.EncodeCerts(want...)) {
				return fmt.Errorf("%s/%s does not hold the roots %v", ns, RootCertConfigMap, serials(want))
			}
			return nil
		})
	}
	start := func(cfg Config) rotationCA {
		t.Helper()
		r := startRotationCA(t, cfg)
		t.Cleanup(func() { _ = r.stop() })
		return r
	}
	r := start(cfg)
	old := r.bundle(t)[0]
	configMapHolds(old)

	cfg.RotateRootBefore, cfg.RootRotationGrace = nextSecond(), time.Hour
	r = start(cfg)
	waitFor(t, func() error {
		if len(r.bundle(t)) != 2 {
			return fmt.Errorf("rotation not begun")
		}
		return nil
	})
	next := r.bundle(t)[1]
	configMapHolds(old, next)
	if p := secretPhase(); p != phaseTrustNew {
		t.Fatalf("Secret phase %s, want %s", p, phaseTrustNew)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}

	// Two replicas switch at once: one stores the step, the other adopts it.
	cfg.RootRotationGrace = time.Nanosecond
	a, b := start(cfg), start(cfg)
	configMapHolds(next, old)
	for _, r := range []rotationCA{a, b} {
		waitFor(t, func() error {
			if got := r.bundle(t); !sameCerts(got, []*x509.Certificate{next, old}) {
				return fmt.Errorf("a replica's bundle is %v, want %v", serials(got), serials([]*x509.Certificate{next, old}))
			}
			return nil
		})
		id := spiffe.ID{TrustDomain: "cluster.local", Namespace: ns, ServiceAccount: "web"}
		_, csr := newCSR(t, pki.ECDSAP256, id)
		resp, err := r.client(t, r.RootsPEM(), nil).CreateCertificate(withToken(ctxT(t), env.token(t, ns, "web", "istio-ca")), &pb.IstioCertificateRequest{Csr: csr})
		if err != nil {
			t.Fatal(err)
		}
		signedBy(t, checkChain(t, resp, id, r.RootsPEM()), next, true)
	}
	if p := secretPhase(); p != phaseSignNew {
		t.Fatalf("Secret phase %s, want %s", p, phaseSignNew)
	}
	for _, r := range []rotationCA{a, b} {
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
	}
	// With a short MaxCertTTL, the old root leaves the ConfigMaps once it has passed since the
	// switch (while the ca runs, or at once).
	cfg.MaxCertTTL, cfg.DefaultCertTTL = time.Second, time.Second
	r = start(cfg)
	configMapHolds(next)
	r.waitBundle(t, "", next)
	if p := secretPhase(); p != "done" {
		t.Fatalf("Secret phase %s, want done", p)
	}
}
