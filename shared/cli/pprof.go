package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// Pprof serves Go's profiles (/debug/pprof/) on its own listener. It is opt-in (a flag) because
// profiles expose internals; bind it to loopback.
type Pprof struct {
	Addr string
	Log  *slog.Logger
}

// Run serves until ctx ends.
func (p Pprof) Run(ctx context.Context) error {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	lis, err := (&net.ListenConfig{}).Listen(ctx, "tcp", p.Addr)
	if err != nil {
		return fmt.Errorf("pprof: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	p.Log.Info("serving pprof", "addr", lis.Addr().String())
	if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("pprof: %w", err)
	}
	return nil
}
