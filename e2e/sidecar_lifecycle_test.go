package e2e

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"slices"
	"sync"
	"testing"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/shared/spiffe"
)

// TestSidecarLifecycle runs the agent binary as the sidecar template does beside Envoy (its
// environment SAILPLANE_ENVOY_READINESS=true), Envoy's admin API faked on loopback:
// /healthz/agent (the agent's startup probe) answers once the certificate is there, while
// /healthz/ready (Envoy's startup probe, holding the application back) answers 503 until Envoy
// reports its listeners and clusters; `agent drain` (the agent's preStop hook) has Envoy drain
// its inbound listeners and keep running; stopping the agent (SIGTERM) asks Envoy nothing more.
func TestSidecarLifecycle(t *testing.T) {
	var (
		mu       sync.Mutex
		ready    bool
		requests []string
	)
	envoy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.URL.Path == "/stats" {
			if ready {
				_, _ = io.WriteString(w, "cluster_manager.cds.update_success: 1\nlistener_manager.lds.update_success: 1\nlistener_manager.workers_started: 1\nserver.state: 0\n")
			}
			return
		}
		requests = append(requests, r.Method+" "+r.URL.RequestURI())
	}))
	defer envoy.Close()
	got := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(requests)
	}

	ca := framework.StartCA(t, t.TempDir())
	a := framework.StartAgent(t, ca, framework.Agent{
		ID:   spiffe.ID{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "web"},
		Env:  []string{"SAILPLANE_ENVOY_READINESS=true"},
		Args: []string{"--envoy-admin-address", envoy.Listener.Addr().String()},
	})
	status := func(path string) int {
		t.Helper()
		resp, err := http.Get("http://" + a.Readiness + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := status("/healthz/agent"); code != http.StatusOK {
		t.Fatalf("/healthz/agent = %d with the certificate, want 200", code)
	}
	if code := status("/healthz/ready"); code != http.StatusServiceUnavailable {
		t.Errorf("/healthz/ready = %d before Envoy has its listeners, want 503: the application would start first", code)
	}
	mu.Lock()
	ready = true
	mu.Unlock()
	if code := status("/healthz/ready"); code != http.StatusOK {
		t.Errorf("/healthz/ready = %d with Envoy ready, want 200", code)
	}

	_, port, _ := net.SplitHostPort(a.Readiness)
	if out, err := exec.Command(framework.Binary(t, "agent"), "drain", "--status-port="+port).CombinedOutput(); err != nil {
		t.Fatalf("agent drain: %v: %s", err, out)
	}
	want := []string{"POST /drain_listeners?inboundonly&graceful&skip_exit"}
	if !slices.Equal(got(), want) {
		t.Errorf("after agent drain, Envoy was asked %q, want %q", got(), want)
	}
	a.Stop()
	if !slices.Equal(got(), want) {
		t.Errorf("after the agent stopped, Envoy was asked %q, want only the drain", got())
	}
	if exited, err := a.Exited(); !exited || err != nil {
		t.Errorf("the agent after SIGTERM: exited %v, %v; want a clean exit", exited, err)
	}
}
