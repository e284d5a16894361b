// Command endpoint-watcher turns where workloads run (ServiceEntry and WorkloadEntry, for now)
// into the service registry, published on its bus for xds-server.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/cli"
	"sailplane.dev/shared/component"
	"sailplane.dev/shared/grpcserver"

	endpointwatcher "sailplane.dev/services/endpoint-watcher"
)

func main() {
	var (
		logOpts   cli.LogOptions
		configBus string
		busListen string
		clusterID string
	)
	cmd := &cobra.Command{
		Use:           "endpoint-watcher",
		Short:         "Publish the mesh's services and endpoints on the bus",
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := logOpts.Logger()
			if err != nil {
				return err
			}
			store := bus.NewStore(bus.WithLogger(log.With("component", "bus")))
			watcher, err := endpointwatcher.New(
				endpointwatcher.Config{ClusterID: clusterID},
				endpointwatcher.Deps{
					Logger:    log.With("component", "endpoint-watcher"),
					Config:    bus.Dial(configBus, bus.WithDialLogger(log.With("component", "config-bus"))),
					Publisher: store,
				})
			if err != nil {
				return err
			}
			store.SyncAfter(watcher.Ready(), endpointwatcher.PublishedTypes()...)
			gs := grpcserver.New(log)
			bus.NewServer(store, bus.WithServerLogger(log.With("component", "bus-server"))).Register(gs)

			var m component.Manager
			m.Add("endpoint-watcher", watcher)
			m.Add("bus-server", &grpcserver.Server{Addr: busListen, GRPC: gs, Logger: log.With("component", "bus-server")})
			ctx, stop := cli.SignalContext()
			defer stop()
			return m.Run(ctx)
		},
	}
	logOpts.AddFlags(cmd.Flags())
	cmd.Flags().StringVar(&configBus, "config-bus", "127.0.0.1:15051", "config-ingest's bus address")
	cmd.Flags().StringVar(&busListen, "bus-listen", "127.0.0.1:15052", "address serving the registry bus (MCP over xDS)")
	cmd.Flags().StringVar(&clusterID, "cluster-id", "Kubernetes", "cluster ID stamped on discovered endpoints")
	if err := cmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}
