package agent

import (
	"bytes"
	"context"
	"crypto/x509"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	pb "istio.io/api/security/v1alpha1"

	ca "sailplane.dev/services/ca"
	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/spiffe"
	"sailplane.dev/shared/telemetry/telemetrytest"
	"sailplane.dev/shared/testlog"
	"sailplane.dev/shared/testwait"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testCA is a real ca run in-process, its root in a folder.
type testCA struct {
	cfg      ca.Config
	svc      *ca.Service
	stop     func()
	RootFile string // the trust bundle, where an agent reads it
}

// startCA runs a ca with its root in dir on listen ("127.0.0.1:0" for any port).
func startCA(t *testing.T, cfg ca.Config) *testCA {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	svc, err := ca.New(cfg, ca.Deps{Logger: testlog.New(t, slog.LevelInfo).With("component", "ca")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	select {
	case <-svc.Ready():
	case err := <-done:
		cancel()
		t.Fatalf("ca stopped before serving: %v", err)
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatal("ca not ready after 30s")
	}
	var once sync.Once
	c := &testCA{cfg: cfg, svc: svc, RootFile: filepath.Join(t.TempDir(), "root-cert.pem")}
	c.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("ca: %v", err)
			}
		})
	}
	t.Cleanup(c.stop)
	if err := os.WriteFile(c.RootFile, svc.RootsPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	return c
}

// Addr is the ca's address.
func (c *testCA) Addr() string { return c.svc.Addr().String() }

// restart starts the ca again on the same address with the same root.
func (c *testCA) restart(t *testing.T) *testCA {
	cfg := c.cfg
	cfg.Listen = c.Addr()
	n := startCA(t, cfg)
	n.RootFile = c.RootFile
	return n
}

// runningAgent is an agent run for a test, with every request it sent to the ca.
type runningAgent struct {
	*Agent
	stop    func()
	metrics *telemetrytest.Metrics // what it records, never the process's

	mu       sync.Mutex
	requests []*pb.IstioCertificateRequest
	failures int    // requests that got no answer or an error
	auth     []bool // per request: whether it carried a bearer token
	warnings []string
}

// countingHandler keeps the agent's warnings, to count how often a problem is logged.
type countingHandler struct {
	slog.Handler
	r *runningAgent
}

func (h *countingHandler) Handle(ctx context.Context, rec slog.Record) error {
	if rec.Level >= slog.LevelWarn {
		h.r.mu.Lock()
		h.r.warnings = append(h.r.warnings, rec.Message)
		h.r.mu.Unlock()
	}
	return h.Handler.Handle(ctx, rec)
}

func (h *countingHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &countingHandler{Handler: h.Handler.WithAttrs(attrs), r: h.r}
}

func (h *countingHandler) WithGroup(name string) slog.Handler {
	return &countingHandler{Handler: h.Handler.WithGroup(name), r: h.r}
}

func (r *runningAgent) warned() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.warnings...)
}

func startAgent(t *testing.T, cfg Config) *runningAgent {
	t.Helper()
	r := &runningAgent{}
	record := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		r.mu.Lock()
		r.requests = append(r.requests, req.(*pb.IstioCertificateRequest))
		md, _ := metadata.FromOutgoingContext(ctx)
		r.auth = append(r.auth, len(md.Get("authorization")) > 0)
		if err != nil {
			r.failures++
		}
		r.mu.Unlock()
		return err
	}
	if cfg.RetryInitial == 0 {
		cfg.RetryInitial, cfg.RetryMax = 20*time.Millisecond, 200*time.Millisecond
	}
	log := slog.New(&countingHandler{Handler: testlog.New(t, slog.LevelDebug).Handler(), r: r}).With("component", "agent")
	r.metrics = telemetrytest.New(t)
	a, err := New(cfg, Deps{Logger: log, DialOptions: []grpc.DialOption{grpc.WithUnaryInterceptor(record)}, Metrics: r.metrics.Metrics})
	if err != nil {
		t.Fatal(err)
	}
	r.Agent = a
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("agent: %v", err)
			}
		})
	}
	t.Cleanup(r.stop)
	return r
}

// tokens is, per request sent, whether it carried the token.
func (r *runningAgent) tokens() []bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]bool(nil), r.auth...)
}

func (r *runningAgent) failed() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failures
}

func (r *runningAgent) sent() []*pb.IstioCertificateRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*pb.IstioCertificateRequest(nil), r.requests...)
}

// eventually waits until cond holds, failing t after a deadline.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testwait.Until(t, 30*time.Second, what, cond)
}

func waitReady(t *testing.T, a *runningAgent) *Credential {
	t.Helper()
	select {
	case <-a.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("agent got no certificate in 30s")
	}
	return a.Current()
}

// checkCredential checks the certificate names want, chains to the ca's roots, and that its key
// is the one written beside it.
func checkCredential(t *testing.T, c *Credential, want spiffe.ID, rootsPEM []byte) {
	t.Helper()
	leaf := c.Leaf()
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != want.String() {
		t.Errorf("certificate SANs %v, want exactly %s", leaf.URIs, want)
	}
	if !bytes.Equal(c.RootsPEM, rootsPEM) {
		t.Errorf("roots differ from the ca's")
	}
	roots, err := pki.ParseCerts(rootsPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("certificate does not verify with the ca's roots: %v", err)
	}
	if !pki.PublicKeysEqual(leaf.PublicKey, c.Key.Public()) {
		t.Error("certificate is not for the agent's key")
	}
}

// checkNoKeySent checks that every request carried a CSR for a public key and nothing private.
func checkNoKeySent(t *testing.T, reqs []*pb.IstioCertificateRequest) {
	t.Helper()
	if len(reqs) == 0 {
		t.Fatal("no request recorded")
	}
	for i, req := range reqs {
		if bytes.Contains([]byte(req.String()), []byte("PRIVATE KEY")) {
			t.Errorf("request %d carries a private key", i)
		}
		if _, err := pki.ParseCSR([]byte(req.GetCsr())); err != nil {
			t.Errorf("request %d: %v", i, err)
		}
	}
}
