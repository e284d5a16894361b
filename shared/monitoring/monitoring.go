// Package monitoring serves a process's monitoring port (15014, as istiod's): GET /healthz/live
// answers 200 while the process runs, GET /healthz/ready 200 only once every piece the process
// serves has synced (503 before), for Kubernetes probes; GET /metrics the process's metrics
// (package telemetry) for Prometheus. Other handlers plug in with Handle; debug endpoints and
// the status page, for loopback callers only, with AddDebug.
package monitoring

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/spf13/pflag"

	"sailplane.dev/shared/cli"
	"sailplane.dev/shared/component"
	"sailplane.dev/shared/telemetry"
)

// DefaultListen is the monitoring port's address in hyper and xds-server, istiod's stand-ins;
// the other services have it off unless set, so that several run side by side on one host
// without a clash. The manifests pass :15014 to every one.
const DefaultListen = "127.0.0.1:15014"

// Flags is every binary's --monitoring-listen.
type Flags struct {
	Listen string
}

// AddFlags registers --monitoring-listen with the binary's default address ("" for off).
func (f *Flags) AddFlags(fs *pflag.FlagSet, def string) {
	fs.StringVar(&f.Listen, "monitoring-listen", def,
		"address serving Prometheus /metrics, and /healthz/ready (200 once synced, else 503) and /healthz/live for probes; empty: off")
}

// Add adds the monitoring server (Server) to m as "monitoring" and returns it (to add handlers
// to), unless --monitoring-listen is empty: then nil.
func (f Flags) Add(m *component.Manager, log *slog.Logger, ready ...<-chan struct{}) *Server {
	if f.Listen == "" {
		return nil
	}
	s := f.Server(log, ready...)
	m.Add("monitoring", s)
	return s
}

// Server is the monitoring server on --monitoring-listen, ready once every one of ready is
// closed, serving the process's metrics (telemetry.Global, installed by the first call) and its
// log levels (cli.ProcessLogLevels).
func (f Flags) Server(log *slog.Logger, ready ...<-chan struct{}) *Server {
	s := New(f.Listen, log, ready...)
	if metrics, err := telemetry.Global(); err != nil {
		log.Error("metrics off", "err", err)
	} else {
		s.Handle("GET /metrics", metrics.Handler())
	}
	if levels := cli.ProcessLogLevels(); levels != nil {
		s.HandleDebug("/debug/loglevel", levels) // GET shows, PUT sets --log-level
	}
	return s
}

// Server is the monitoring HTTP server, a Run(ctx) component.
type Server struct {
	addr      string
	log       *slog.Logger
	ready     []<-chan struct{}
	mux       *http.ServeMux
	listening func(net.Addr)
}

// New returns a server for addr that is ready once every one of ready is closed (each a
// service's Ready channel).
func New(addr string, log *slog.Logger, ready ...<-chan struct{}) *Server {
	s := &Server{addr: addr, log: log.With("component", "monitoring"), ready: ready, mux: http.NewServeMux()}
	s.mux.HandleFunc("GET /healthz/live", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = fmt.Fprintln(w, "ok")
	})
	s.mux.HandleFunc("GET /healthz/ready", s.serveReady)
	return s
}

// Handle adds a handler on the monitoring port (as http.ServeMux.Handle); call it before Run.
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// OnListening sets a function called with the bound address once the listener is open (tests
// listen on port 0).
func (s *Server) OnListening(f func(net.Addr)) { s.listening = f }

// Ready reports whether every ready channel is closed.
func (s *Server) Ready() bool {
	for _, ch := range s.ready {
		select {
		case <-ch:
		default:
			return false
		}
	}
	return true
}

func (s *Server) serveReady(w http.ResponseWriter, _ *http.Request) {
	if !s.Ready() {
		http.Error(w, "not ready: still syncing", http.StatusServiceUnavailable)
		return
	}
	_, _ = fmt.Fprintln(w, "ok")
}

// Run serves until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	lis, err := net.Listen("tcp", s.addr)
	if err != nil {
		return fmt.Errorf("monitoring: listen %s: %w", s.addr, err)
	}
	if s.listening != nil {
		s.listening(lis.Addr())
	}
	s.log.Info("serving monitoring", "addr", lis.Addr().String())
	srv := &http.Server{Handler: s.mux, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	select {
	case err := <-errc:
		return fmt.Errorf("monitoring: %w", err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		_ = srv.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("monitoring: %w", err)
	}
	return nil
}
