// Command hyper is the whole Sailplane control plane in one process, like istiod: config-ingest,
// endpoint-watcher and xds-server linked together over an in-process bus (no serialization).
// Run with no flags, it uses the Kubernetes cluster it finds (in-cluster, $KUBECONFIG,
// ~/.kube/config) or, with none, the folder's etc/sailplane/mesh.yaml and etc/sailplane/conf/.
package main

import (
	"os"

	"github.com/spf13/cobra"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/cli"
	"sailplane.dev/shared/component"

	configingest "sailplane.dev/services/config-ingest"
	endpointwatcher "sailplane.dev/services/endpoint-watcher"
	xdsserver "sailplane.dev/services/xds-server"
)

func main() {
	var (
		logOpts    cli.LogOptions
		meshFile   string
		stateDir   string
		configDirs []string
		xdsCfg     xdsserver.Config
		pprofAddr  string
		busListen  string
		clusterID  string
		kubeconfig string
		source     string
		namespace  string
		podName    string
		consulAddr string
		consulDC   string
	)
	cmd := &cobra.Command{
		Use:   "hyper",
		Short: "The whole Sailplane control plane in one process",
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := logOpts.Logger()
			if err != nil {
				return err
			}
			// One store carries config and registry: their types never overlap, and external
			// MCP consumers then find everything on one bus address.
			store := bus.NewStore(bus.WithLogger(log.With("component", "bus")))
			local := bus.Local(store)

			ingestCfg := configingest.Config{MeshFile: meshFile, ConfigDirs: configDirs, StateDir: stateDir, Namespace: namespace, PodName: podName}
			watcherCfg := endpointwatcher.Config{ClusterID: clusterID, Namespace: namespace}
			if consulAddr != "" {
				// The ACL token comes from CONSUL_HTTP_TOKEN only, never a flag: flags show in ps.
				watcherCfg.Consul = &endpointwatcher.ConsulConfig{Address: consulAddr, Datacenter: consulDC}
			}
			kubeCfg, chosen, err := configingest.ResolveSource(source, kubeconfig)
			if err != nil {
				return err
			}
			log.Info("config source", "source", chosen)
			if kubeCfg != nil {
				// One cluster for config and discovery; the mesh config comes from the istio
				// ConfigMap unless a file is asked for.
				ingestCfg.Kube, watcherCfg.Kube = kubeCfg, kubeCfg
				if !cmd.Flags().Changed("mesh-config") {
					ingestCfg.MeshFile = ""
				}
			}
			ingest, err := configingest.New(ingestCfg,
				configingest.Deps{Logger: log.With("component", "config-ingest"), Publisher: store})
			if err != nil {
				return err
			}
			watcher, err := endpointwatcher.New(watcherCfg,
				endpointwatcher.Deps{Logger: log.With("component", "endpoint-watcher"), Config: local, Publisher: store})
			if err != nil {
				return err
			}
			xds, err := xdsserver.New(xdsCfg,
				xdsserver.Deps{Logger: log.With("component", "xds-server"), Config: local, Registry: local})
			if err != nil {
				return err
			}
			// Consumers (in-process and external) see each producer's state only once it is whole.
			store.SyncAfter(ingest.Ready(), configingest.PublishedTypes()...)
			store.SyncAfter(watcher.Ready(), endpointwatcher.PublishedTypes()...)

			var m component.Manager
			m.Add("config-ingest", ingest)
			m.Add("endpoint-watcher", watcher)
			m.Add("xds-server", xds)
			if busListen != "" {
				m.Add("bus-server", bus.ServeGRPC(store, busListen, log))
			}
			if pprofAddr != "" {
				m.Add("pprof", cli.Pprof{Addr: pprofAddr, Log: log})
			}
			return cli.RunUntilSignal(&m)
		},
	}
	logOpts.AddFlags(cmd.Flags())
	cmd.Flags().StringVar(&meshFile, "mesh-config", "etc/sailplane/mesh.yaml", "mesh config file (Istio meshConfig format); with Kubernetes, only when set, instead of the istio ConfigMap")
	cmd.Flags().StringVar(&source, "config-source", configingest.SourceAuto, "where config and workloads come from: auto (Kubernetes if a cluster is found, else files), kubernetes or files")
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster, $KUBECONFIG, ~/.kube/config)")
	cmd.Flags().StringVar(&namespace, "namespace", cli.EnvOr("POD_NAMESPACE", "istio-system"), "control plane namespace (Kubernetes): the istio ConfigMap, the status Lease, remote-cluster Secrets")
	cmd.Flags().StringVar(&podName, "pod-name", os.Getenv("POD_NAME"), "identity in the status Lease (default: the host name)")
	cmd.Flags().StringVar(&stateDir, "state-dir", configingest.DefaultStateDir, "folder keeping the last valid version of every config file's resources across restarts (files mode); empty: none")
	cmd.Flags().StringSliceVar(&configDirs, "config-dir", nil, "config folders to read, overriding the mesh config's fs:// configSources")
	xdsCfg.AddFlags(cmd.Flags())
	cmd.Flags().StringVar(&pprofAddr, "pprof-addr", "", "serve Go profiles (/debug/pprof/) on this address; empty: off")
	cmd.Flags().StringVar(&busListen, "bus-listen", "127.0.0.1:15051", "address serving the bus to external MCP consumers; empty to disable")
	cmd.Flags().StringVar(&consulAddr, "consul", "", "Consul HTTP address to discover services from (empty: no Consul); token from CONSUL_HTTP_TOKEN")
	cmd.Flags().StringVar(&consulDC, "consul-datacenter", "", "Consul datacenter (default: the agent's)")
	cmd.Flags().StringVar(&clusterID, "cluster-id", "Kubernetes", "cluster ID stamped on discovered endpoints")
	cli.Execute(cmd)
}
