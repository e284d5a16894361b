package consul

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"sailplane.dev/shared/telemetry/telemetrytest"
)

// TestWatchIndexHandling drives watch with scripted answers to check the blocking-query rules
// Consul documents: deliver only when the index changes, reset to 0 when it goes backwards,
// never wait on index 0 after an answer, and resync from 0 after an error.
func TestWatchIndexHandling(t *testing.T) {
	type answer struct {
		index uint64
		err   error
		value string
	}
	script := []answer{
		{index: 10, value: "first"},
		{index: 10, value: "timeout, unchanged"},
		{index: 12, value: "changed"},
		{index: 5, value: "went backwards"},
		{index: 0, value: "zero index"},
		{err: errors.New("connection refused")},
		{index: 12, value: "after error"},
	}
	logs := &logCapture{t: t}
	metrics := telemetrytest.New(t)
	s := &Source{
		cfg:         Config{Backoff: Backoff{Initial: time.Millisecond, Max: 2 * time.Millisecond}, WaitTime: time.Second, MinWait: -1},
		log:         slog.New(slog.NewTextHandler(logs, nil)),
		watchErrors: newWatchErrors(metrics.Provider()),
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		mu        sync.Mutex
		waitIdx   []uint64
		delivered []string
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		watch(ctx, s, "test", false, func(q *api.QueryOptions) (string, *api.QueryMeta, error) {
			mu.Lock()
			n := len(waitIdx)
			waitIdx = append(waitIdx, q.WaitIndex)
			mu.Unlock()
			if n >= len(script) {
				<-q.Context().Done()
				return "", nil, q.Context().Err()
			}
			a := script[n]
			if a.err != nil {
				return "", nil, a.err
			}
			return a.value, &api.QueryMeta{LastIndex: a.index}, nil
		}, func(v string) bool {
			mu.Lock()
			delivered = append(delivered, v)
			mu.Unlock()
			return true
		})
	}()
	eventually(t, "the script is consumed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(waitIdx) > len(script)
	})
	cancel()
	<-done

	wantIdx := []uint64{0, 10, 10, 12, 0, 1, 0, 12}
	wantDelivered := []string{"first", "changed", "went backwards", "after error"}
	if !slices.Equal(waitIdx, wantIdx) {
		t.Errorf("wait indexes = %v, want %v", waitIdx, wantIdx)
	}
	if !slices.Equal(delivered, wantDelivered) {
		t.Errorf("delivered = %q, want %q", delivered, wantDelivered)
	}
	if !logs.contains("level=WARN", "consul query failed", "connection refused") {
		t.Errorf("the failure was not logged at WARN:\n%s", logs.String())
	}
	if n := metrics.Value("sailplane_consul_watch_errors_total", "query", "service"); n != 1 {
		t.Errorf("sailplane_consul_watch_errors_total{query=service} = %v after one failure, want 1", n)
	}
}

// A watch that reaches Consul again wakes the others waiting out their backoff: after an
// outage every watch resyncs at once, not up to Backoff.Max later (found by e2e's TestFaults,
// Consul down 30 s).
func TestWatchesResyncTogether(t *testing.T) {
	reachable := &wakeup{}
	metrics := telemetrytest.New(t)
	source := func(b Backoff) *Source {
		return &Source{cfg: Config{Backoff: b, WaitTime: time.Second, MinWait: -1},
			log: slog.New(slog.NewTextHandler(&logCapture{t: t}, nil)), reachable: reachable,
			watchErrors: newWatchErrors(metrics.Provider())}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	// fails the first query, then answers; delivers on back.
	run := func(s *Source, failed chan<- struct{}, back chan<- string) {
		n := 0
		watch(ctx, s, "test", false, func(q *api.QueryOptions) (string, *api.QueryMeta, error) {
			n++
			switch {
			case n == 1:
				close(failed)
				return "", nil, errors.New("connection refused")
			case n > 2:
				<-q.Context().Done()
				return "", nil, q.Context().Err()
			}
			return "back", &api.QueryMeta{LastIndex: 7}, nil
		}, func(v string) bool {
			back <- v
			return true
		})
	}
	// slow would wait an hour to retry; fast retries at once, and wakes it when it succeeds.
	slowFailed, fastFailed := make(chan struct{}), make(chan struct{})
	slowBack, fastBack := make(chan string, 1), make(chan string, 1)
	wg.Go(func() { run(source(Backoff{Initial: time.Hour, Max: time.Hour}), slowFailed, slowBack) })
	<-slowFailed
	wg.Go(func() { run(source(Backoff{Initial: time.Millisecond, Max: time.Millisecond}), fastFailed, fastBack) })
	for name, back := range map[string]chan string{"fast": fastBack, "slow": slowBack} {
		select {
		case <-back:
		case <-time.After(10 * time.Second):
			t.Fatalf("the %s watch did not resync", name)
		}
	}
}

func TestBackoff(t *testing.T) {
	b := Backoff{Initial: 100 * time.Millisecond, Max: time.Second}
	for _, tc := range []struct {
		failures int
		max      time.Duration
	}{{1, 100 * time.Millisecond}, {2, 200 * time.Millisecond}, {4, 800 * time.Millisecond}, {5, time.Second}, {50, time.Second}} {
		for range 20 {
			if d := backoff(b, tc.failures); d < tc.max/2 || d >= tc.max {
				t.Fatalf("backoff(%d) = %s, want in [%s, %s)", tc.failures, d, tc.max/2, tc.max)
			}
		}
	}
}

func TestRedact(t *testing.T) {
	err := redact(errors.New(`Get "http://x/?token=s3cr3t": refused (s3cr3t)`), "s3cr3t")
	if got, want := err.Error(), `Get "http://x/?token=[redacted]": refused ([redacted])`; got != want {
		t.Errorf("redact = %q, want %q", got, want)
	}
	if errors.Unwrap(err) != nil {
		t.Error("a redacted error must not unwrap to the original text")
	}
	plain := errors.New("refused")
	if redact(plain, "s3cr3t") != plain || redact(plain, "") != plain {
		t.Error("errors without the token must be returned as they are")
	}
}

func TestNewConfig(t *testing.T) {
	pub := newRecorder()
	for _, tc := range []struct {
		name string
		cfg  Config
		pub  *recorder
	}{
		{name: "nil publisher", cfg: Config{}},
		{name: "backoff max below initial", cfg: Config{Backoff: Backoff{Initial: time.Second, Max: time.Millisecond}}, pub: pub},
		{name: "wait time too long", cfg: Config{WaitTime: time.Hour}, pub: pub},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.pub == nil {
				_, err = New(tc.cfg, nil, nil) // a typed nil would not be a nil interface
			} else {
				_, err = New(tc.cfg, tc.pub, nil)
			}
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("New = %v, want an ErrConfig", err)
			}
		})
	}
}

func TestRunOnce(t *testing.T) {
	s, err := New(Config{Address: "127.0.0.1:1"}, newRecorder(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Run(ctx); err != nil {
		t.Fatalf("Run with a done context = %v, want nil", err)
	}
	if err := s.Run(context.Background()); !errors.Is(err, ErrAlreadyRun) {
		t.Fatalf("second Run = %v, want ErrAlreadyRun", err)
	}
}
