package endpointwatcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/endpoint-watcher/internal/bustest"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/testlog"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.kube != nil {
		shared.kube.Stop()
	}
	if code == 0 {
		// klog starts its flush daemon in init (client-go imports klog): process-global.
		if err := goleak.Find(goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

const timeout = 10 * time.Second

func testLogger(t testing.TB) *slog.Logger {
	return testlog.New(t, slog.LevelDebug)
}

// fakeSource is a bus.Source that delivers the initial changes, waits for release, calls
// Synced, then delivers changes sent on its channel until ctx is done.
type fakeSource struct {
	initial []bus.Change
	release chan struct{} // closed to let Synced be called
	applied chan struct{} // closed once the initial changes are applied
	changes chan bus.Change
	fail    error // returned at once by Subscribe when set

	mu      sync.Mutex
	types   []string
	applyEr []error
}

var _ bus.Source = (*fakeSource)(nil)

func newFakeSource(initial ...bus.Change) *fakeSource {
	return &fakeSource{
		initial: initial,
		release: make(chan struct{}),
		applied: make(chan struct{}),
		changes: make(chan bus.Change),
	}
}

func (s *fakeSource) apply(h bus.Handler, c bus.Change) {
	if err := h.Apply(c); err != nil {
		s.mu.Lock()
		s.applyEr = append(s.applyEr, err)
		s.mu.Unlock()
	}
}

func (s *fakeSource) Subscribe(ctx context.Context, typeURLs []string, h bus.Handler) error {
	if s.fail != nil {
		return s.fail
	}
	s.mu.Lock()
	s.types = slices.Clone(typeURLs)
	s.mu.Unlock()
	for _, c := range s.initial {
		s.apply(h, c)
	}
	close(s.applied)
	select {
	case <-s.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	h.Synced()
	for {
		select {
		case c := <-s.changes:
			s.apply(h, c)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// send delivers one change after sync.
func (s *fakeSource) send(t *testing.T, c bus.Change) {
	t.Helper()
	select {
	case s.changes <- c:
	case <-time.After(timeout):
		t.Fatal("source not consuming changes")
	}
}

func parse(t *testing.T, doc string) bus.Change {
	t.Helper()
	byType, err := bustest.ParseYAML([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	for typeURL, rs := range byType {
		return bus.Change{TypeURL: typeURL, Updated: rs}
	}
	t.Fatal("no document")
	return bus.Change{}
}

const (
	seYAML = `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: reviews, namespace: vm}
spec:
  hosts: [reviews.vm.example]
  location: MESH_INTERNAL
  ports: [{name: http, number: 9080, protocol: HTTP}]
  workloadSelector: {labels: {app: reviews}}
`
	weYAML = `
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: reviews-1, namespace: vm}
spec: {address: 10.0.0.1, labels: {app: reviews}}
`
	we2YAML = `
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: reviews-2, namespace: vm}
spec: {address: 10.0.0.2, labels: {app: reviews}}
`
	badYAML = `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: bad, namespace: vm}
spec: {hosts: [bad.vm.example], ports: [{number: 80}]}
`
)

// start runs a Watcher on src until the test ends, checking that Run returns nil on cancel.
func start(t *testing.T, src bus.Source, rec bus.Publisher) *Watcher {
	t.Helper()
	return startWith(t, Config{}, src, rec)
}

func startWith(t *testing.T, cfg Config, src bus.Source, rec bus.Publisher) *Watcher {
	t.Helper()
	w, err := New(cfg, Deps{Logger: testLogger(t), Config: src, Publisher: rec})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v on cancel, want nil", err)
			}
		case <-time.After(timeout):
			t.Error("Run did not return after cancel")
		}
	})
	return w
}

func waitReady(t *testing.T, w *Watcher) {
	t.Helper()
	select {
	case <-w.Ready():
	case <-time.After(timeout):
		t.Fatal("Ready not closed")
	}
}

func TestWatcher(t *testing.T) {
	t.Run("publishes the full state at sync, then changes", func(t *testing.T) {
		src := newFakeSource(parse(t, seYAML), parse(t, weYAML))
		rec := bustest.NewRecorder()
		w := start(t, src, rec)

		select {
		case <-src.applied:
		case <-time.After(timeout):
			t.Fatal("initial changes not applied")
		}
		select {
		case <-w.Ready():
			t.Fatal("Ready closed before sync")
		default:
		}
		if calls := rec.Calls(); len(calls) != 0 {
			t.Fatalf("published before sync: %+v", calls)
		}
		src.mu.Lock()
		types := src.types
		src.mu.Unlock()
		if !slices.Equal(types, []string{schema.ServiceEntry.TypeURL, schema.WorkloadEntry.TypeURL}) {
			t.Errorf("subscribed to %v", types)
		}

		close(src.release)
		waitReady(t, w)
		svc := rec.State(schema.Service.TypeURL)["vm/reviews.vm.example"]
		eps := rec.State(schema.Endpoints.TypeURL)["vm/reviews.vm.example"]
		if svc == nil || eps == nil {
			t.Fatalf("not published at Ready: %+v", rec.Calls())
		}
		if got := svc.Body.(*discoveryv1.Service).GetClusterId(); got != DefaultClusterID {
			t.Errorf("cluster_id = %q, want %q", got, DefaultClusterID)
		}
		if n := len(eps.Body.(*discoveryv1.Endpoints).GetEndpoints()); n != 1 {
			t.Errorf("%d endpoints, want 1", n)
		}

		rec.Reset()
		src.send(t, parse(t, we2YAML))
		rec.WaitFor(t, timeout, func(calls []bustest.Call) bool { return len(calls) > 0 })
		eps = rec.State(schema.Endpoints.TypeURL)["vm/reviews.vm.example"]
		if n := len(eps.Body.(*discoveryv1.Endpoints).GetEndpoints()); n != 2 {
			t.Errorf("%d endpoints after adding a WE, want 2", n)
		}

		rec.Reset()
		src.send(t, bus.Change{TypeURL: schema.ServiceEntry.TypeURL, Removed: []string{"vm/reviews"}})
		rec.WaitFor(t, timeout, func(calls []bustest.Call) bool { return len(calls) == 2 })
		if len(rec.State(schema.Service.TypeURL)) != 0 || len(rec.State(schema.Endpoints.TypeURL)) != 0 {
			t.Errorf("not deleted: %+v", rec.Calls())
		}
	})

	t.Run("skips what it cannot translate and never NACKs", func(t *testing.T) {
		bad := parse(t, badYAML)
		good := parse(t, seYAML)
		mixed := bus.Change{TypeURL: "networking.istio.io/v1alpha3/ServiceEntry", // legacy URL accepted
			Updated: append(bad.Updated, good.Updated...)}
		src := newFakeSource(mixed, bus.Change{TypeURL: "networking.istio.io/v1/Gateway", Removed: []string{"x/y"}})
		close(src.release)
		rec := bustest.NewRecorder()
		w := start(t, src, rec)
		waitReady(t, w)
		if got := len(rec.State(schema.Service.TypeURL)); got != 1 {
			t.Errorf("%d services, want 1", got)
		}
		src.mu.Lock()
		defer src.mu.Unlock()
		if len(src.applyEr) != 0 {
			t.Errorf("Apply returned errors: %v", src.applyEr)
		}
	})

	t.Run("Run returns the source's error", func(t *testing.T) {
		src := newFakeSource()
		src.fail = errors.New("boom")
		w, err := New(Config{ClusterID: "c1"}, Deps{Config: src, Publisher: bustest.NewRecorder()})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Run(context.Background()); !errors.Is(err, src.fail) {
			t.Errorf("Run = %v, want %v", err, src.fail)
		}
	})
}

func TestNewMissingDeps(t *testing.T) {
	for _, c := range []struct {
		name string
		deps Deps
	}{
		{"no source", Deps{Publisher: bustest.NewRecorder()}},
		{"no publisher", Deps{Config: newFakeSource()}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := New(Config{}, c.deps); !errors.Is(err, ErrMissingDependency) {
				t.Errorf("err = %v, want ErrMissingDependency", err)
			}
		})
	}
}
