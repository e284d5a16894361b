// Command config-ingest reads Istio config (from the Kubernetes API server or from files),
// validates it, and publishes it on its bus for endpoint-watcher, xds-server and any
// MCP-over-xDS consumer such as istiod.
package main

import (
	"github.com/spf13/cobra"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/cli"
	"sailplane.dev/shared/component"
	"sailplane.dev/shared/monitoring"
	"sailplane.dev/shared/serviceid"
	"sailplane.dev/shared/telemetry"

	configingest "sailplane.dev/services/config-ingest"
)

func main() {
	var (
		logOpts   cli.LogOptions
		tracing   telemetry.TracingFlags
		monitor   monitoring.Flags
		cfg       configingest.Config
		source    configingest.SourceFlags
		busListen string
		identity  serviceid.Flags
	)
	cmd := &cobra.Command{
		Use:   "config-ingest",
		Short: "Read, validate and publish Istio config on the bus",
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := logOpts.Logger()
			if err != nil {
				return err
			}
			kubeCfg, chosen, err := source.Resolve()
			if err != nil {
				return err
			}
			log.Info("config source", "source", chosen)
			certs, sec, err := identity.Identity(log)
			if err != nil {
				return err
			}
			cfg.UseSource(kubeCfg, cmd.Flags())
			cfg.ClusterID = identity.CA.ClusterID
			store := bus.NewStore(bus.WithLogger(log.With("component", "bus")))
			deps := configingest.Deps{Logger: log.With("component", "config-ingest"), Publisher: store}
			if certs != nil {
				deps.Identity = certs // xds:// config sources are read over mTLS with it
			}
			ingest, err := configingest.New(cfg, deps)
			if err != nil {
				return err
			}
			// Before anything listens: without its mesh file, config-ingest cannot run.
			if err := ingest.CheckMesh(); err != nil {
				return err
			}
			store.SyncAfter(ingest.Ready(), configingest.PublishedTypes()...)

			busServer, err := bus.ServeGRPC(store, busListen, log, sec)
			if err != nil {
				return err
			}
			var m component.Manager
			if err := tracing.Add(&m, log, "config-ingest"); err != nil {
				return err
			}
			if certs != nil {
				m.Add("certificate", certs)
			}
			m.Add("config-ingest", ingest)
			m.Add("bus-server", busServer)
			if mon := monitor.Add(&m, log, ingest.Ready()); mon != nil {
				mon.AddDebug("Sailplane config-ingest", ingest.Debug())
			}
			return cli.RunUntilSignal(&m)
		},
	}
	logOpts.AddFlags(cmd.Flags())
	tracing.AddFlags(cmd.Flags())
	monitor.AddFlags(cmd.Flags(), "")
	cfg.AddFlags(cmd.Flags())
	// Not in hyper yet: its other services still watch the whole cluster (deploy/single-namespace).
	cli.WatchNamespaceVar(cmd.Flags(), &cfg.WatchNamespace)
	source.AddFlags(cmd.Flags())
	cmd.Flags().StringVar(&busListen, "bus-listen", "127.0.0.1:15051", "address serving the config bus (MCP over xDS); mTLS with --ca-address, else plaintext (loopback only unless --bus-plaintext)")
	identity.AddFlags(cmd.Flags())
	cli.Execute(cmd)
}
