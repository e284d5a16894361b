// Command xds-server translates the config and registry it reads from the bus into xDS and serves
// it to Envoy and proxyless gRPC clients over ADS. Run as many replicas as the load needs.
package main

import (
	"fmt"
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
	cmd.Flags().IntVar(&cfg.PushConcurrency, "push-concurrency", 16, "proxies pushed at once")
	cmd.Flags().DurationVar(&cfg.MaxConnectionAge, "max-connection-age", 30*time.Minute,
		"close client connections after this age (±10%) so they spread over replicas; 0 = never")
	if err := cmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}
