// Command endpoint-watcher turns where workloads run (ServiceEntry and WorkloadEntry, and
// Kubernetes when a cluster is found) into the service registry, published on its bus for
// xds-server.
package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/cli"
	"sailplane.dev/shared/component"
	"sailplane.dev/shared/kube"
	"sailplane.dev/shared/monitoring"
	"sailplane.dev/shared/serviceid"
	"sailplane.dev/shared/telemetry"

	endpointwatcher "sailplane.dev/services/endpoint-watcher"
)

func main() {
	var (
		logOpts   cli.LogOptions
		tracing   telemetry.TracingFlags
		monitor   monitoring.Flags
		cfg       endpointwatcher.Config
		configBus string
		busListen string
		kubecfg   string
		kubeMode  string
		identity  serviceid.Flags
	)
	cmd := &cobra.Command{
		Use:   "endpoint-watcher",
		Short: "Publish the mesh's services and endpoints on the bus",
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := logOpts.Logger()
			if err != nil {
				return err
			}
			switch kubeMode {
			case "auto", "on":
				found, err := kube.Discover(kubecfg)
				switch {
				case err == nil:
					cfg.Kube = found.Config
					log.Info("Kubernetes discovery on", "cluster", found.Source)
				case errors.Is(err, kube.ErrNoCluster) && kubeMode == "auto":
					log.Info("no Kubernetes cluster found; Kubernetes discovery off")
				default:
					return err
				}
			case "off":
			default:
				return fmt.Errorf("--kubernetes: want auto, on or off, got %q", kubeMode)
			}
			store := bus.NewStore(bus.WithLogger(log.With("component", "bus")))
			certs, sec, err := identity.Identity(log)
			if err != nil {
				return err
			}
			busServer, err := bus.ServeGRPC(store, busListen, log, sec)
			if err != nil {
				return err
			}
			watcher, err := endpointwatcher.New(
				cfg,
				endpointwatcher.Deps{
					Logger:    log.With("component", "endpoint-watcher"),
					Config:    bus.Dial(configBus, bus.WithDialLogger(log.With("component", "config-bus")), bus.WithSecurity(sec)),
					Publisher: store,
				})
			if err != nil {
				return err
			}
			store.SyncAfter(watcher.Ready(), endpointwatcher.PublishedTypes()...)

			var m component.Manager
			if err := tracing.Add(&m, log, "endpoint-watcher"); err != nil {
				return err
			}
			if certs != nil {
				m.Add("certificate", certs)
			}
			m.Add("endpoint-watcher", watcher)
			m.Add("bus-server", busServer)
			monitor.Add(&m, log, watcher.Ready())
			return cli.RunUntilSignal(&m)
		},
	}
	logOpts.AddFlags(cmd.Flags())
	tracing.AddFlags(cmd.Flags())
	monitor.AddFlags(cmd.Flags(), "")
	cfg.AddFlags(cmd.Flags())
	// Not in hyper yet: its other services still watch the whole cluster (deploy/single-namespace).
	cli.WatchNamespaceVar(cmd.Flags(), &cfg.WatchNamespace)
	cmd.Flags().StringVar(&configBus, "config-bus", "127.0.0.1:15051", "config-ingest's bus address")
	cmd.Flags().StringVar(&busListen, "bus-listen", "127.0.0.1:15052", "address serving the registry bus (MCP over xDS); mTLS with --ca-address, else plaintext (loopback only unless --bus-plaintext)")
	cmd.Flags().StringVar(&kubeMode, "kubernetes", "auto",
		"Kubernetes discovery: auto (when --kubeconfig, in-cluster config, $KUBECONFIG or ~/.kube/config is found), on, off")
	cli.KubeconfigVar(cmd.Flags(), &kubecfg)
	identity.AddFlags(cmd.Flags())
	cli.Execute(cmd)
}
