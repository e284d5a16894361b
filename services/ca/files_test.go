package ca

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	pb "istio.io/api/security/v1alpha1"

	"sailplane.dev/shared/grpcserver"
	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/spiffe"
	"sailplane.dev/shared/telemetry/telemetrytest"
	"sailplane.dev/shared/testlog"
)

var app = spiffe.ID{TrustDomain: "cluster.local", Namespace: "app", ServiceAccount: "web"}

// issueClient signs a client certificate for id with the CA stored in dir, as a workload holds
// one from an earlier CreateCertificate.
func issueClient(t testing.TB, dir string, id spiffe.ID, alg pki.KeyAlgorithm) *tls.Certificate {
	t.Helper()
	auth := loadDir(t, dir)
	key, err := pki.GenerateKey(alg)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := auth.Issue(key.Public(), pki.LeafOptions{URIs: []*url.URL{id.URL()}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	c := &tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key}
	for _, x := range auth.Chain() {
		c.Certificate = append(c.Certificate, x.Raw)
	}
	return c
}

func loadDir(t testing.TB, dir string) *pki.Authority {
	t.Helper()
	files, err := readLayout(dir)
	if err != nil {
		t.Fatal(err)
	}
	auth, err := pki.FromIstioLayout(files)
	if err != nil {
		t.Fatal(err)
	}
	return auth
}

func TestFolderRootPersistsAcrossRestart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "etc", "certs")
	first := startCA(t, Config{CertDir: dir})
	roots := first.RootsPEM()
	for _, name := range layoutFiles {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Fatalf("root folder lacks %s: %v", name, err)
		}
	}
	if fi, _ := os.Stat(filepath.Join(dir, pki.CAKeyFile)); fi.Mode().Perm() != 0o600 {
		t.Fatalf("ca-key.pem mode %v, want 0600", fi.Mode().Perm())
	}
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}
	second := startCA(t, Config{CertDir: dir})
	if string(second.RootsPEM()) != string(roots) {
		t.Fatal("a restart changed the root")
	}
	// A certificate of the first run authenticates with the second.
	_, csr := newCSR(t, pki.ECDSAP256, app)
	cl := second.client(t, roots, issueClient(t, dir, app, pki.ECDSAP256))
	resp, err := cl.CreateCertificate(ctxT(t), &pb.IstioCertificateRequest{Csr: csr})
	if err != nil {
		t.Fatal(err)
	}
	checkChain(t, resp, app, roots)
}

func TestStoredFolderUnusableRefusesToStart(t *testing.T) {
	for name, damage := range map[string]func(dir string) error{
		"key missing": func(dir string) error { return os.Remove(filepath.Join(dir, pki.CAKeyFile)) },
		"cert missing": func(dir string) error {
			return os.Remove(filepath.Join(dir, pki.CACertFile))
		},
		"corrupt cert": func(dir string) error {
			return os.WriteFile(filepath.Join(dir, pki.CACertFile), []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), 0o600)
		},
		"key of another root": func(dir string) error {
			other, _ := pki.NewSelfSigned(pki.ECDSAP256, "x", time.Hour)
			key, _ := pki.EncodeKey(other.Key)
			return os.WriteFile(filepath.Join(dir, pki.CAKeyFile), key, 0o600)
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			r := startCA(t, Config{CertDir: dir})
			if err := r.stop(); err != nil {
				t.Fatal(err)
			}
			if err := damage(dir); err != nil {
				t.Fatal(err)
			}
			before, _ := readLayout(dir)
			_, err := tryStartCA(t, Config{CertDir: dir})
			if !errors.Is(err, ErrStoredCA) || !strings.Contains(err.Error(), dir) {
				t.Fatalf("start with a damaged root: %v, want ErrStoredCA naming %s", err, dir)
			}
			after, _ := readLayout(dir)
			if len(after) != len(before) {
				t.Fatal("the refused start changed the folder")
			}
			for k := range before {
				if string(after[k]) != string(before[k]) {
					t.Fatalf("the refused start rewrote %s", k)
				}
			}
		})
	}
}

// writePlugged writes Istio's cacerts layout (an intermediate under a new root) to a folder and
// returns the root.
func writePlugged(t testing.TB, dir string) (*pki.Authority, map[string][]byte) {
	t.Helper()
	root, err := pki.NewSelfSigned(pki.ECDSAP256, "plugged root", 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := pki.GenerateKey(pki.ECDSAP256)
	inter, err := root.IssueCA(key.Public(), "plugged", 12*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, _ := pki.EncodeKey(key)
	files := map[string][]byte{
		pki.CACertFile:    pki.EncodeCerts(inter),
		pki.CAKeyFile:     keyPEM,
		pki.CertChainFile: pki.EncodeCerts(inter, root.Cert),
		pki.RootCertFile:  pki.EncodeCerts(root.Cert),
	}
	if dir != "" {
		for name, data := range files {
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	return root, files
}

func TestPluggedFolderSignsThroughIntermediate(t *testing.T) {
	dir := t.TempDir()
	root, _ := writePlugged(t, dir)
	r := startCA(t, Config{PluggedCertDir: dir})
	roots := pki.EncodeCerts(root.Cert)
	if string(r.RootsPEM()) != string(roots) {
		t.Fatal("the trust bundle is not the plugged root")
	}
	_, csr := newCSR(t, pki.ECDSAP256, app)
	resp, err := r.client(t, roots, issueClient(t, dir, app, pki.ECDSAP256)).CreateCertificate(ctxT(t), &pb.IstioCertificateRequest{Csr: csr})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(resp.CertChain); n != 3 {
		t.Fatalf("chain of %d entries, want leaf, intermediate, root", n)
	}
	checkChain(t, resp, app, roots)

	// An incomplete plugged-in folder is refused, never replaced by a generated root.
	if err := os.Remove(filepath.Join(dir, pki.RootCertFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := tryStartCA(t, Config{PluggedCertDir: dir}); !errors.Is(err, ErrStoredCA) || !strings.Contains(err.Error(), "root-cert.pem") {
		t.Fatalf("incomplete plugged-in CA: %v", err)
	}
	if _, err := tryStartCA(t, Config{PluggedCertDir: t.TempDir()}); !errors.Is(err, ErrStoredCA) {
		t.Fatalf("empty plugged-in folder: %v", err)
	}
}

func TestCertificateAuthErrors(t *testing.T) {
	dir := t.TempDir()
	metrics := telemetrytest.New(t)
	r, err := tryStartCAWith(t, Config{CertDir: dir, MaxCertTTL: 48 * time.Hour}, Deps{MeterProvider: metrics.Provider()})
	if err != nil {
		t.Fatal(err)
	}
	roots := r.RootsPEM()
	auth := loadDir(t, dir)
	good := issueClient(t, dir, app, pki.ECDSAP256)

	expired := func() *tls.Certificate {
		key, _ := pki.GenerateKey(pki.ECDSAP256)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(7), NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour),
			URIs: []*url.URL{app.URL()}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, auth.Cert, key.Public(), auth.Key)
		if err != nil {
			t.Fatal(err)
		}
		return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	}()
	foreignDir := t.TempDir()
	foreignCA, _ := pki.NewSelfSigned(pki.ECDSAP256, "foreign", time.Hour)
	files, _ := pki.IstioLayout(foreignCA)
	for name, data := range files {
		_ = os.WriteFile(filepath.Join(foreignDir, name), data, 0o600)
	}
	foreign := issueClient(t, foreignDir, app, pki.ECDSAP256)
	noSPIFFE := func() *tls.Certificate {
		key, _ := pki.GenerateKey(pki.ECDSAP256)
		leaf, _ := auth.Issue(key.Public(), pki.LeafOptions{DNSNames: []string{"web.app"}, TTL: time.Hour})
		return &tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key}
	}()

	_, goodCSR := newCSR(t, pki.ECDSAP256, app)
	_, otherCSR := newCSR(t, pki.ECDSAP256, spiffe.ID{TrustDomain: "cluster.local", Namespace: "app", ServiceAccount: "admin"})
	_, otherTDCSR := newCSR(t, pki.ECDSAP256, spiffe.ID{TrustDomain: "old.domain", Namespace: "app", ServiceAccount: "web"})
	for _, tc := range []struct {
		name     string
		cert     *tls.Certificate
		req      *pb.IstioCertificateRequest
		code     codes.Code
		contains string
	}{
		{"no credentials", nil, &pb.IstioCertificateRequest{Csr: goodCSR}, codes.Unauthenticated, "neither a client certificate"},
		{"expired client certificate", expired, &pb.IstioCertificateRequest{Csr: goodCSR}, codes.Unauthenticated, "expired"},
		{"foreign client certificate", foreign, &pb.IstioCertificateRequest{Csr: goodCSR}, codes.Unauthenticated, "unknown authority"},
		{"client certificate without SPIFFE ID", noSPIFFE, &pb.IstioCertificateRequest{Csr: goodCSR}, codes.Unauthenticated, "0 URI SANs"},
		{"CSR for another identity", good, &pb.IstioCertificateRequest{Csr: otherCSR}, codes.PermissionDenied, "spiffe://cluster.local/ns/app/sa/admin"},
		{"malformed CSR", good, &pb.IstioCertificateRequest{Csr: "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"}, codes.InvalidArgument, "certificate signing request"},
		{"empty CSR", good, &pb.IstioCertificateRequest{}, codes.InvalidArgument, "no PEM"},
		{"oversized CSR", good, &pb.IstioCertificateRequest{Csr: goodCSR + strings.Repeat("x", MaxCSRBytes)}, codes.InvalidArgument, "exceeds the limit"},
		{"oversized request", good, &pb.IstioCertificateRequest{Csr: strings.Repeat("x", maxRequestBytes+1)}, codes.ResourceExhausted, "larger than max"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := r.client(t, roots, tc.cert).CreateCertificate(ctxT(t), tc.req)
			wantCode(t, err, tc.code, tc.contains)
		})
	}
	if got := r.Stats(); got.Unauthenticated != 4 || got.PermissionDenied != 1 || got.InvalidArgument != 3 || got.Signed != 0 {
		t.Fatalf("stats %+v", got)
	}
	// The same, as istiod's metrics and Sailplane's (the oversized request never reaches the ca).
	scrape := metrics.Scrape()
	for _, want := range []struct {
		name   string
		labels []string
		value  float64
	}{
		{"citadel_server_csr_count", nil, 8},
		{"citadel_server_authentication_failure_count", nil, 4},
		{"citadel_server_csr_parsing_err_count", nil, 3},
		{"sailplane_ca_csr_refused_total", []string{"code", "PermissionDenied"}, 1},
		{"sailplane_ca_csr_refused_total", []string{"code", "Unauthenticated"}, 4},
		{"sailplane_ca_csr_duration_seconds", []string{"code", "InvalidArgument"}, 3},
		{"citadel_server_success_cert_issuance_count", nil, 0},
	} {
		if got, _ := scrape.Value(want.name, want.labels...); got != want.value {
			t.Errorf("%s%v = %v, want %v", want.name, want.labels, got, want.value)
		}
	}

	// The trust domain of the CSR may be stale; the certificate is in the ca's.
	for _, tc := range []struct {
		name string
		csr  string
		ttl  int64
		want time.Duration
	}{
		{"default TTL", goodCSR, 0, 24 * time.Hour},
		{"requested TTL", goodCSR, 3600, time.Hour},
		{"TTL capped", goodCSR, 1000 * 3600, 48 * time.Hour},
		{"other trust domain in CSR", otherTDCSR, 0, 24 * time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := r.client(t, roots, good).CreateCertificate(ctxT(t), &pb.IstioCertificateRequest{Csr: tc.csr, ValidityDuration: tc.ttl})
			if err != nil {
				t.Fatal(err)
			}
			leaf := checkChain(t, resp, app, roots)
			if got := time.Until(leaf.NotAfter); got > tc.want || got < tc.want-time.Minute {
				t.Fatalf("lifetime %s, want %s", got, tc.want)
			}
		})
	}
	if got := metrics.Value("citadel_server_success_cert_issuance_count"); got != 4 {
		t.Errorf("citadel_server_success_cert_issuance_count = %v after 4 certificates, want 4", got)
	}
	if sum := metrics.Scrape().Sum("sailplane_ca_csr_duration_seconds", "code", "OK"); sum <= 0 {
		t.Errorf("no time recorded for the certificates issued: %v", sum)
	}
	if got, want := metrics.Value("citadel_server_root_cert_expiry_timestamp"), float64(auth.Roots[0].NotAfter.Unix()); got != want {
		t.Errorf("citadel_server_root_cert_expiry_timestamp = %v, want the root's expiry %v", got, want)
	}
	if got, want := metrics.Value("citadel_server_cert_chain_expiry_timestamp"), float64(auth.Cert.NotAfter.Unix()); got != want {
		t.Errorf("citadel_server_cert_chain_expiry_timestamp = %v, want the signing certificate's expiry %v", got, want)
	}
}

// The listener is TLS, so the plaintext refusal is checked on a plaintext server with the same handler.
func TestBearerTokenOverPlaintextRefused(t *testing.T) {
	svc, err := New(Config{CertDir: t.TempDir()}, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := svc.loadAuthority(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	svc.auth = st.auth
	g := grpcserver.New(testlog.New(t, slog.LevelInfo), grpcserver.WithAuth(grpcserver.Anyone))
	svc.Register(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(lis) }()
	defer g.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, csr := newCSR(t, pki.ECDSAP256, app)
	_, err = pb.NewIstioCertificateServiceClient(conn).CreateCertificate(withToken(ctxT(t), "a-token"), &pb.IstioCertificateRequest{Csr: csr})
	wantCode(t, err, codes.Unauthenticated, "plaintext")
}
