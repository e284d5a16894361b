package monitoring_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"testing"

	"go.opentelemetry.io/otel"
	"go.uber.org/goleak"

	"sailplane.dev/shared/monitoring"
	"sailplane.dev/shared/telemetry/telemetrytest"
	"sailplane.dev/shared/testlog"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// start runs s on a loopback port until the test ends and returns its base URL.
func start(t *testing.T, s *monitoring.Server) string {
	t.Helper()
	addr := make(chan net.Addr, 1)
	s.OnListening(func(a net.Addr) { addr <- a })
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := s.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	select {
	case a := <-addr:
		return "http://" + a.String()
	case <-t.Context().Done():
		t.Fatal("never listened")
		return ""
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestReadyFollowsEveryService: /healthz/ready is 503 until every ready channel is closed, then
// 200 "ok"; /healthz/live is 200 throughout.
func TestReadyFollowsEveryService(t *testing.T) {
	first, second := make(chan struct{}), make(chan struct{})
	base := start(t, monitoring.New("127.0.0.1:0", testlog.New(t, slog.LevelDebug), first, second))

	steps := []struct {
		name  string
		close chan struct{}
		ready int
	}{
		{name: "none synced", ready: http.StatusServiceUnavailable},
		{name: "one of two synced", close: first, ready: http.StatusServiceUnavailable},
		{name: "both synced", close: second, ready: http.StatusOK},
	}
	for _, step := range steps {
		if step.close != nil {
			close(step.close)
		}
		if code, body := get(t, base+"/healthz/ready"); code != step.ready {
			t.Errorf("%s: /healthz/ready = %d %q, want %d", step.name, code, body, step.ready)
		} else if code == http.StatusOK && body != "ok\n" {
			t.Errorf("%s: /healthz/ready body %q, want ok", step.name, body)
		}
		if code, _ := get(t, base+"/healthz/live"); code != http.StatusOK {
			t.Errorf("%s: /healthz/live = %d, want 200", step.name, code)
		}
	}
	if code, _ := get(t, base+"/metrics"); code != http.StatusNotFound {
		t.Errorf("/metrics = %d before anything serves it, want 404", code)
	}
}

// TestHandleExtends: a handler added before Run is served beside the probes.
func TestHandleExtends(t *testing.T) {
	s := monitoring.New("127.0.0.1:0", testlog.New(t, slog.LevelDebug))
	s.Handle("GET /extra", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "extra") }))
	base := start(t, s)
	if code, body := get(t, base+"/extra"); code != http.StatusOK || body != "extra" {
		t.Errorf("/extra = %d %q", code, body)
	}
	if code, _ := get(t, base+"/healthz/ready"); code != http.StatusOK {
		t.Errorf("/healthz/ready with nothing to wait for = %d, want 200", code)
	}
}

// TestListenError: a taken address is Run's error, naming the monitoring port.
func TestListenError(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	err = monitoring.New(lis.Addr().String(), testlog.New(t, slog.LevelDebug)).Run(t.Context())
	if err == nil {
		t.Fatal("Run on a taken address: no error")
	}
}

// TestFlagsServeMetrics: the server --monitoring-listen starts serves the process's metrics
// (the otel global) in the Prometheus text format, Go runtime metrics included.
func TestFlagsServeMetrics(t *testing.T) {
	s := monitoring.Flags{Listen: "127.0.0.1:0"}.Server(testlog.New(t, slog.LevelDebug))
	base := start(t, s)
	counter, err := otel.Meter("sailplane.dev/test").Int64Counter("sailplane_test_events")
	if err != nil {
		t.Fatal(err)
	}
	counter.Add(t.Context(), 3)
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics = %d", resp.StatusCode)
	}
	families, err := telemetrytest.Parse(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := families.Value("sailplane_test_events"); v != 3 {
		t.Errorf("sailplane_test_events = %v, want 3", v)
	}
	if _, ok := families.Value("go_goroutines"); !ok {
		t.Error("no go_goroutines")
	}
}
