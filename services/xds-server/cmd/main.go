// Command xds-server translates the config and registry it reads from the bus into xDS and serves
// it to Envoy and proxyless gRPC clients over ADS. Run as many replicas as the load needs.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"time"

	"github.com/spf13/cobra"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/cli"
	"sailplane.dev/shared/component"

	xdsserver "sailplane.dev/services/xds-server"
)

func main() {
	var (
		logOpts     cli.LogOptions
		configBus   string
		registryBus string
		cfg         xdsserver.Config
		pprofAddr   string
	)
	cmd := &cobra.Command{
		Use:           "xds-server",
		Short:         "Serve xDS to Envoy and proxyless gRPC clients",
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := logOpts.Logger()
			if err != nil {
				return err
			}
			srv, err := xdsserver.New(cfg, xdsserver.Deps{
				Logger:   log.With("component", "xds-server"),
				Config:   bus.Dial(configBus, bus.WithDialLogger(log.With("component", "config-bus"))),
				Registry: bus.Dial(registryBus, bus.WithDialLogger(log.With("component", "registry-bus"))),
			})
			if err != nil {
				return err
			}
			var m component.Manager
			m.Add("xds-server", srv)
			if pprofAddr != "" {
				m.Add("pprof", pprofServer{addr: pprofAddr, log: log})
			}
			ctx, stop := cli.SignalContext()
			defer stop()
			return m.Run(ctx)
		},
	}
	logOpts.AddFlags(cmd.Flags())
	cmd.Flags().StringVar(&configBus, "config-bus", "127.0.0.1:15051", "config-ingest's bus address")
	cmd.Flags().StringVar(&registryBus, "registry-bus", "127.0.0.1:15052", "endpoint-watcher's bus address")
	cmd.Flags().StringVar(&cfg.Listen, "xds-listen", "127.0.0.1:15010", "address serving ADS (plaintext)")
	cmd.Flags().DurationVar(&cfg.Debounce, "debounce", 100*time.Millisecond, "quiet period before changes are pushed")
	cmd.Flags().DurationVar(&cfg.DebounceMax, "debounce-max", time.Second, "longest a push waits for changes to settle")
	cmd.Flags().DurationVar(&cfg.EndpointDebounce, "endpoint-debounce", 10*time.Millisecond, "quiet period before endpoint-only changes are pushed")
	cmd.Flags().IntVar(&cfg.PushConcurrency, "push-concurrency", 16, "proxies pushed at once")
	cmd.Flags().DurationVar(&cfg.MaxConnectionAge, "max-connection-age", 30*time.Minute,
		"close client connections after this age (±10%) so they spread over replicas; 0 = never")
	cmd.Flags().StringVar(&pprofAddr, "pprof-addr", "", "serve Go profiles (/debug/pprof/) on this address; empty: off")
	if err := cmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

// pprofServer serves net/http/pprof on its own listener, opt-in: profiles expose internals.
type pprofServer struct {
	addr string
	log  *slog.Logger
}

func (p pprofServer) Run(ctx context.Context) error {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	lis, err := (&net.ListenConfig{}).Listen(ctx, "tcp", p.addr)
	if err != nil {
		return fmt.Errorf("pprof: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	p.log.Info("serving pprof", "addr", lis.Addr().String())
	if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("pprof: %w", err)
	}
	return nil
}
