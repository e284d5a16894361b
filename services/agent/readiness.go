package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// Paths of the status server (ReadinessAddr, 15020).
const (
	// ReadyPath is Istio's readiness endpoint: the agent holds a certificate and, with
	// EnvoyReadiness, Envoy is ready too (pilot-agent's /healthz/ready).
	ReadyPath = "/healthz/ready"
	// AgentReadyPath is the agent alone: it holds a certificate, so Envoy's bootstrap is written.
	// The agent's own startup probe asks it, since Envoy starts only after that probe passes.
	AgentReadyPath = "/healthz/agent"
	// DrainPath (POST, from loopback only, as pilot-agent's) starts Envoy's drain.
	DrainPath = "/drain"
)

// serveReadiness answers ReadyPath, AgentReadyPath and DrainPath on ReadinessAddr and, as
// pilot-agent on 15020, the metrics at StatsPath and MetricsPath: Envoy's merged in when the
// agent writes its bootstrap.
func (a *Agent) serveReadiness(ctx context.Context) error {
	mux := http.NewServeMux()
	mux.HandleFunc(AgentReadyPath, func(w http.ResponseWriter, _ *http.Request) {
		if a.Current() == nil {
			http.Error(w, "no certificate yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.HandleFunc(ReadyPath, func(w http.ResponseWriter, r *http.Request) {
		if a.Current() == nil {
			http.Error(w, "no certificate yet", http.StatusServiceUnavailable)
			return
		}
		if a.cfg.EnvoyReadiness {
			if err := a.envoy.ready(r.Context()); err != nil {
				http.Error(w, "envoy: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.HandleFunc(DrainPath, a.handleDrain)
	var envoyStats string
	if a.cfg.EnvoyBootstrap != "" {
		envoyStats = "http://" + a.cfg.EnvoyAdmin + StatsPath
	}
	stats := a.statsHandler(a.deps.Metrics.Gatherer(), envoyStats)
	mux.Handle("GET "+StatsPath, stats)
	mux.Handle("GET "+MetricsPath, stats)
	lis, err := net.Listen("tcp", a.cfg.ReadinessAddr)
	if err != nil {
		return fmt.Errorf("readiness: %w", err)
	}
	a.mu.Lock()
	a.readinessAddr = lis.Addr()
	a.mu.Unlock()
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// ReadinessAddr is the readiness listener's address once it listens, nil before.
func (a *Agent) ReadinessAddr() net.Addr {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.readinessAddr
}
