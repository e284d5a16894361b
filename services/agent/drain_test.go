package agent

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// fakeEnvoy is Envoy's admin API on loopback: /stats answers stats (settable), and every
// other request is recorded.
type fakeEnvoy struct {
	*httptest.Server
	mu       sync.Mutex
	stats    string
	requests []string // method and request URI
}

func newFakeEnvoy(t *testing.T) *fakeEnvoy {
	f := &fakeEnvoy{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if r.URL.Path == "/stats" {
			if r.URL.Query().Get("filter") != readyStats {
				http.Error(w, "unexpected filter", http.StatusBadRequest)
				return
			}
			_, _ = io.WriteString(w, f.stats)
			return
		}
		f.requests = append(f.requests, r.Method+" "+r.URL.RequestURI())
		_, _ = io.WriteString(w, "OK\n")
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeEnvoy) setStats(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stats = s
}

func (f *fakeEnvoy) got() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.requests...)
}

func get(t *testing.T, a *runningAgent, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + a.ReadinessAddr().String() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestEnvoyReadiness: with EnvoyReadiness, /healthz/ready (Envoy's startup probe, holding the
// application back) answers 503 until Envoy has accepted its first LDS and CDS updates and is
// LIVE with its workers started, as pilot-agent's, while /healthz/agent (the agent's own
// startup probe, before Envoy starts) answers once the certificate is there; once ready,
// Envoy is not asked again.
func TestEnvoyReadiness(t *testing.T) {
	envoy := newFakeEnvoy(t)
	_, cfg := provisionedAgent(t)
	cfg.EnvoyAdmin, cfg.EnvoyReadiness = envoy.Listener.Addr().String(), true
	a := startAgent(t, cfg)
	waitReady(t, a)
	eventually(t, "the readiness port", func() bool { return a.ReadinessAddr() != nil })
	if code, body := get(t, a, AgentReadyPath); code != http.StatusOK {
		t.Errorf("%s = %d %s with a certificate, want 200", AgentReadyPath, code, body)
	}
	for _, tc := range []struct{ stats, want string }{
		{"", "not received"},
		{"listener_manager.lds.update_success: 0\ncluster_manager.cds.update_success: 1\nserver.state: 0\nlistener_manager.workers_started: 1\n", "not received"},
		{"listener_manager.lds.update_success: 0\nlistener_manager.lds.update_rejected: 1\ncluster_manager.cds.update_success: 1\n", "rejected"},
		{"listener_manager.lds.update_success: 1\ncluster_manager.cds.update_success: 1\nserver.state: 2\nlistener_manager.workers_started: 0\n", "not live"},
		{"listener_manager.lds.update_success: 1\ncluster_manager.cds.update_success: 1\nserver.state: 0\nlistener_manager.workers_started: 0\n", "workers"},
	} {
		envoy.setStats(tc.stats)
		if code, body := get(t, a, ReadyPath); code != http.StatusServiceUnavailable || !strings.Contains(body, tc.want) {
			t.Errorf("Envoy stats %q: %s = %d %q, want 503 saying %q", tc.stats, ReadyPath, code, body, tc.want)
		}
	}
	envoy.setStats("listener_manager.lds.update_success: 1\ncluster_manager.cds.update_success: 2\nserver.state: 0\nlistener_manager.workers_started: 1\n")
	if code, body := get(t, a, ReadyPath); code != http.StatusOK {
		t.Fatalf("%s = %d %q with Envoy ready, want 200", ReadyPath, code, body)
	}
	envoy.setStats("")
	if code, _ := get(t, a, ReadyPath); code != http.StatusOK {
		t.Errorf("%s = %d once Envoy was ready, want 200 (not asked again)", ReadyPath, code)
	}
}

// TestDrain: `agent drain` (RequestDrain, the preStop hook) has the agent ask Envoy's admin to
// drain its inbound listeners gracefully and keep running (skip_exit: the kubelet stops Envoy
// after the application), and returns once Envoy has been asked; the agent refuses the request
// from another address than loopback and other methods than POST, and fails the hook when
// Envoy cannot be asked.
func TestDrain(t *testing.T) {
	envoy := newFakeEnvoy(t)
	_, cfg := provisionedAgent(t)
	cfg.EnvoyAdmin = envoy.Listener.Addr().String()
	a := startAgent(t, cfg)
	eventually(t, "the readiness port", func() bool { return a.ReadinessAddr() != nil })
	port := a.ReadinessAddr().(*net.TCPAddr).Port

	if code, _ := get(t, a, DrainPath); code != http.StatusMethodNotAllowed {
		t.Errorf("GET %s = %d, want 405", DrainPath, code)
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, DrainPath, nil)
	req.RemoteAddr = "198.18.0.7:40000" // a peer, through the pod's IP
	a.handleDrain(rec, req)
	if rec.Code != http.StatusForbidden {
		t.Errorf("POST %s from %s = %d, want 403", DrainPath, req.RemoteAddr, rec.Code)
	}
	if got := envoy.got(); len(got) != 0 {
		t.Fatalf("Envoy asked %v before the hook", got)
	}

	if err := RequestDrain(context.Background(), port); err != nil {
		t.Fatal(err)
	}
	if got, want := envoy.got(), []string{"POST /drain_listeners?inboundonly&graceful&skip_exit"}; !equalStrings(got, want) {
		t.Errorf("Envoy asked %q, want %q", got, want)
	}

	envoy.Close()
	if err := RequestDrain(context.Background(), port); err == nil || !strings.Contains(err.Error(), "502") {
		t.Errorf("drain with Envoy gone: %v, want a 502 error", err)
	}
	if err := RequestDrain(context.Background(), freePort(t)); err == nil {
		t.Error("drain with no agent listening succeeded")
	}
}

func equalStrings(a, b []string) bool {
	return strings.Join(a, "\n") == strings.Join(b, "\n") && len(a) == len(b)
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return port
}

// TestNoDrainOnStop: the agent stopping (SIGTERM, ctx cancelled) leaves Envoy alone. Envoy is
// its own container: on pod termination the kubelet stops it before the agent (native sidecars
// stop in reverse order), and when the agent alone restarts (a new image, a resize) draining
// would close the listeners of an Envoy that keeps running.
func TestNoDrainOnStop(t *testing.T) {
	envoy := newFakeEnvoy(t)
	_, cfg := provisionedAgent(t)
	cfg.EnvoyAdmin, cfg.EnvoyReadiness = envoy.Listener.Addr().String(), true
	a := startAgent(t, cfg)
	waitReady(t, a)
	a.stop()
	if got := envoy.got(); len(got) != 0 {
		t.Errorf("the stopping agent asked Envoy %q, want nothing", got)
	}
}
