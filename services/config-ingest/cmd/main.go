// Command config-ingest reads Istio config (from the Kubernetes API server or from files),
// validates it, and publishes it on its bus for endpoint-watcher, xds-server and any
// MCP-over-xDS consumer such as istiod.
package main

import (
	"os"

	"github.com/spf13/cobra"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/cli"
	"sailplane.dev/shared/component"

	configingest "sailplane.dev/services/config-ingest"
)

func main() {
	var (
		logOpts    cli.LogOptions
		meshFile   string
		stateDir   string
		configDirs []string
		busListen  string
		kubeconfig string
		source     string
		namespace  string
		podName    string
	)
	cmd := &cobra.Command{
		Use:   "config-ingest",
		Short: "Read, validate and publish Istio config on the bus",
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := logOpts.Logger()
			if err != nil {
				return err
			}
			cfg := configingest.Config{MeshFile: meshFile, ConfigDirs: configDirs, StateDir: stateDir, Namespace: namespace, PodName: podName}
			kubeCfg, chosen, err := configingest.ResolveSource(source, kubeconfig)
			if err != nil {
				return err
			}
			log.Info("config source", "source", chosen)
			if kubeCfg != nil {
				cfg.Kube = kubeCfg
				// The mesh config comes from the istio ConfigMap unless a file is asked for.
				if !cmd.Flags().Changed("mesh-config") {
					cfg.MeshFile = ""
				}
			}
			store := bus.NewStore(bus.WithLogger(log.With("component", "bus")))
			ingest, err := configingest.New(cfg,
				configingest.Deps{Logger: log.With("component", "config-ingest"), Publisher: store})
			if err != nil {
				return err
			}
			store.SyncAfter(ingest.Ready(), configingest.PublishedTypes()...)

			var m component.Manager
			m.Add("config-ingest", ingest)
			m.Add("bus-server", bus.ServeGRPC(store, busListen, log))
			return cli.RunUntilSignal(&m)
		},
	}
	logOpts.AddFlags(cmd.Flags())
	cmd.Flags().StringVar(&meshFile, "mesh-config", "etc/sailplane/mesh.yaml", "mesh config file (Istio meshConfig format); with Kubernetes, only when set, instead of the istio ConfigMap")
	cmd.Flags().StringVar(&source, "config-source", configingest.SourceAuto, "where config comes from: auto (Kubernetes if a cluster is found, else files), kubernetes or files")
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster, $KUBECONFIG, ~/.kube/config)")
	cmd.Flags().StringVar(&namespace, "namespace", cli.EnvOr("POD_NAMESPACE", "istio-system"), "control plane namespace (Kubernetes): the istio ConfigMap and the status Lease")
	cmd.Flags().StringVar(&podName, "pod-name", os.Getenv("POD_NAME"), "identity in the status Lease (default: the host name)")
	cmd.Flags().StringVar(&stateDir, "state-dir", configingest.DefaultStateDir, "folder keeping the last valid version of every config file's resources across restarts (files mode); empty: none")
	cmd.Flags().StringSliceVar(&configDirs, "config-dir", nil, "config folders to read, overriding the mesh config's fs:// configSources")
	cmd.Flags().StringVar(&busListen, "bus-listen", "127.0.0.1:15051", "address serving the config bus (MCP over xDS)")
	cli.Execute(cmd)
}
