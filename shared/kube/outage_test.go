package kube

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"sailplane.dev/shared/testlog"
)

// server is an HTTP server on a fixed 127.0.0.1 port that can be stopped and started again,
// like an API server; /readyz answers with ready's status.
type server struct {
	t     *testing.T
	addr  string
	ready atomic.Int32

	mu  sync.Mutex
	srv *http.Server
	wg  sync.WaitGroup
}

func newServer(t *testing.T) *server {
	s := &server{t: t, addr: "127.0.0.1:0"}
	s.ready.Store(http.StatusOK)
	s.start()
	t.Cleanup(s.stop)
	return s
}

func (s *server) start() {
	s.t.Helper()
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		s.t.Fatal(err)
	}
	s.addr = ln.Addr().String()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			w.WriteHeader(int(s.ready.Load()))
			return
		}
		w.WriteHeader(http.StatusOK)
	})}
	s.mu.Lock()
	s.srv = srv
	s.mu.Unlock()
	s.wg.Go(func() { _ = srv.Serve(ln) })
}

func (s *server) stop() {
	s.mu.Lock()
	srv := s.srv
	s.mu.Unlock()
	_ = srv.Close()
	s.wg.Wait()
}

// TestOutages: a failed request starts probing; the server answering not-ready keeps it
// probing; once ready, resync runs, the problem clears and the recovery is logged once. A
// failure during resync interrupts it and probing starts over.
func TestOutages(t *testing.T) {
	srv := newServer(t)
	log, logs := testlog.NewRecording(t, slog.LevelDebug)
	o := NewOutages(srv.addr, log)
	cfg := &rest.Config{Host: "http://" + srv.addr}
	cfg.Wrap(o.Wrap)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	client := cs.Discovery().RESTClient()

	resyncs := make(chan chan error)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		o.Run(ctx, client, func(until context.Context) error {
			done := make(chan error)
			select {
			case resyncs <- done:
			case <-until.Done():
				return until.Err()
			}
			select {
			case err := <-done:
				return err
			case <-until.Done():
				return until.Err()
			}
		})
	})
	defer func() {
		cancel()
		wg.Wait()
	}()
	nextResync := func() chan error {
		t.Helper()
		select {
		case done := <-resyncs:
			return done
		case <-time.After(10 * time.Second):
			t.Fatal("no resync within 10s of the server answering ready")
			return nil
		}
	}
	get := func() error { return client.Get().AbsPath("/api").Do(ctx).Error() }

	if err := get(); err != nil || o.Err() != nil {
		t.Fatalf("server up: %v, %v", err, o.Err())
	}
	srv.stop()
	if err := get(); err == nil {
		t.Fatal("request to a stopped server succeeded")
	}
	if err := o.Err(); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("Err() = %v, want ErrUnreachable", err)
	}

	srv.ready.Store(http.StatusInternalServerError)
	probes := logs.Count("API server probe failed")
	srv.start()
	waitLog(t, logs, "API server probe failed", probes+2) // answers, not ready: still probing
	select {
	case <-resyncs:
		t.Fatal("resync before the server was ready")
	default:
	}
	srv.ready.Store(http.StatusOK)

	// A failure during resync: the resync is interrupted, probing starts over.
	nextResync()
	srv.stop()
	_ = get()
	waitLog(t, logs, "resync after an API server outage interrupted", 1)
	srv.start()
	nextResync() <- nil
	waitLog(t, logs, "API server reachable again, resynced in", 1)
	if err := o.Err(); err != nil {
		t.Errorf("Err() after the resync = %v", err)
	}
	if n := logs.Count("kubernetes API server unreachable"); n != 1 {
		t.Errorf("the outage was logged %d times, want once", n)
	}
}

func waitLog(t *testing.T, logs *testlog.Messages, msg string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for logs.Count(msg) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%q not logged %d times within 10s", msg, n)
		}
		<-tick.C
	}
}
