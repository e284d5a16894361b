package ca

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	pb "istio.io/api/security/v1alpha1"

	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/spiffe"
	"sailplane.dev/shared/testlog"
)

// running is a ca started for a test.
type running struct {
	*Service
	stop func() error // cancels Run and returns its error
}

// startCA runs a ca on a free loopback port and waits until it serves.
func startCA(t testing.TB, cfg Config) *running {
	t.Helper()
	r, err := tryStartCA(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// tryStartCA is startCA returning Run's error when the ca stops before serving.
func tryStartCA(t testing.TB, cfg Config) (*running, error) {
	t.Helper()
	return tryStartCAWith(t, cfg, Deps{})
}

// tryStartCAWith is tryStartCA with deps (their Logger is the test's).
func tryStartCAWith(t testing.TB, cfg Config, deps Deps) (*running, error) {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	deps.Logger = testlog.New(t, slog.LevelInfo)
	svc, err := New(cfg, deps)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	select {
	case <-svc.Ready():
	case err := <-done:
		cancel()
		return nil, err
	case <-time.After(30 * time.Second):
		cancel()
		return nil, errors.New("ca not ready after 30s")
	}
	var stopped bool
	var runErr error
	r := &running{Service: svc, stop: func() error {
		if !stopped {
			stopped = true
			cancel()
			runErr = <-done
		}
		return runErr
	}}
	t.Cleanup(func() { _ = r.stop() })
	return r, nil
}

// client dials the ca over TLS, verifying its serving certificate with roots; clientCert, when
// set, is presented.
func (r *running) client(t testing.TB, roots []byte, clientCert *tls.Certificate) pb.IstioCertificateServiceClient {
	t.Helper()
	return pb.NewIstioCertificateServiceClient(r.conn(t, roots, clientCert))
}

// conn is client's connection, for the other services on the ca's port.
func (r *running) conn(t testing.TB, roots []byte, clientCert *tls.Certificate) *grpc.ClientConn {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(roots) {
		t.Fatal("no roots")
	}
	tc := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if clientCert != nil {
		tc.Certificates = []tls.Certificate{*clientCert}
	}
	conn, err := grpc.NewClient(r.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func withToken(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

func newCSR(t testing.TB, alg pki.KeyAlgorithm, id spiffe.ID) (crypto.Signer, string) {
	t.Helper()
	key, err := pki.GenerateKey(alg)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.CreateCSR(key, id)
	if err != nil {
		t.Fatal(err)
	}
	return key, string(csr)
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// checkChain checks a CreateCertificate response: the leaf first with exactly want as its only
// SAN, the roots last equal to roots, and the leaf verifying to them through the entries between.
func checkChain(t testing.TB, resp *pb.IstioCertificateResponse, want spiffe.ID, roots []byte) *x509.Certificate {
	t.Helper()
	entries := resp.GetCertChain()
	if len(entries) < 2 {
		t.Fatalf("cert_chain has %d entries, want leaf … root", len(entries))
	}
	if entries[len(entries)-1] != string(roots) {
		t.Fatalf("last entry is not the trust bundle:\n%s\nwant\n%s", entries[len(entries)-1], roots)
	}
	var certs [][]*x509.Certificate
	for i, e := range entries {
		c, err := pki.ParseCerts([]byte(e))
		if err != nil || len(c) == 0 {
			t.Fatalf("entry %d: %v", i, err)
		}
		if i < len(entries)-1 && len(c) != 1 {
			t.Fatalf("entry %d holds %d certificates, want one", i, len(c))
		}
		certs = append(certs, c)
	}
	leaf := certs[0][0]
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != want.String() || len(leaf.DNSNames)+len(leaf.IPAddresses)+len(leaf.EmailAddresses) != 0 {
		t.Fatalf("leaf SANs: URIs %v DNS %v IPs %v; want exactly %s", leaf.URIs, leaf.DNSNames, leaf.IPAddresses, want)
	}
	if leaf.IsCA {
		t.Fatal("leaf is a CA")
	}
	rootPool, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range certs[len(certs)-1] {
		rootPool.AddCert(r)
	}
	for _, c := range certs[1 : len(certs)-1] {
		inter.AddCert(c[0])
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: rootPool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("leaf does not verify to the root: %v", err)
	}
	return leaf
}

// tlsCert is a client certificate from a CreateCertificate response and its key.
func tlsCert(resp *pb.IstioCertificateResponse, key crypto.Signer) *tls.Certificate {
	c := &tls.Certificate{PrivateKey: key}
	for _, e := range resp.GetCertChain()[:len(resp.GetCertChain())-1] {
		certs, _ := pki.ParseCerts([]byte(e))
		c.Certificate = append(c.Certificate, certs[0].Raw)
	}
	return c
}

func wantCode(t testing.TB, err error, code codes.Code, contains string) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != code || !strings.Contains(st.Message(), contains) {
		t.Fatalf("got %v, want %s containing %q", err, code, contains)
	}
}
