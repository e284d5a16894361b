// Command hyper is the whole Sailplane control plane in one process, like istiod: config-ingest,
// endpoint-watcher, xds-server and the ca linked together over an in-process bus (no
// serialization). As istiod, it serves xDS and the ca's CreateCertificate over TLS on one port
// (15012) and plaintext xDS on 15010.
// Run with no flags, it uses the Kubernetes cluster it finds (in-cluster, $KUBECONFIG,
// ~/.kube/config) or, with none, the folder's etc/sailplane/mesh.yaml and etc/sailplane/conf/.
package main

import (
	"net"
	"path/filepath"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/cli"
	"sailplane.dev/shared/component"
	"sailplane.dev/shared/kube"
	"sailplane.dev/shared/mesh"
	"sailplane.dev/shared/monitoring"
	"sailplane.dev/shared/serviceid"
	"sailplane.dev/shared/spiffe"
	"sailplane.dev/shared/telemetry"

	ca "sailplane.dev/services/ca"
	configingest "sailplane.dev/services/config-ingest"
	endpointwatcher "sailplane.dev/services/endpoint-watcher"
	"sailplane.dev/services/webhook"
	xdsserver "sailplane.dev/services/xds-server"
)

func main() { cli.Execute(newCommand()) }

// ServiceAccount is hyper's service account (deploy/hyper), its identity on an mTLS bus.
const ServiceAccount = "sailplane"

// newCommand is hyper's command: every linked service's flags, registered by the service's own
// AddFlags, and hyper's own.
func newCommand() *cobra.Command {
	var (
		logOpts    cli.LogOptions
		tracing    telemetry.TracingFlags
		ingestCfg  configingest.Config
		source     configingest.SourceFlags
		watcherCfg endpointwatcher.Config
		xdsCfg     xdsserver.Config
		caCfg      ca.Config
		webhookCfg webhook.Config
		pprofAddr  string
		monitor    monitoring.Flags
		busListen  string
		busFlags   serviceid.BusFlags
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
			// Each linked service consumes under its own name, in rejections and metrics.
			local := func(consumer string) bus.Source { return bus.Local(store, bus.WithLocalConsumer(consumer)) }

			kubeCfg, chosen, err := source.Resolve()
			if err != nil {
				return err
			}
			log.Info("config source", "source", chosen)
			// One cluster for config and discovery.
			ingestCfg.UseSource(kubeCfg, cmd.Flags())
			watcherCfg.Kube = kubeCfg
			// The CA root, as the saved config state, belongs to the mesh file's configuration.
			caCfg.UseKube(kubeCfg, mesh.Root(ingestCfg.MeshFile))
			// The ca shares the secure xDS port unless given its own.
			if !cmd.Flags().Changed("ca-listen") {
				caCfg.Listen = xdsCfg.SecureListen
			}
			caCfg.Embedded = caCfg.Listen != "" && caCfg.Listen == xdsCfg.SecureListen
			authority, err := ca.New(caCfg, ca.Deps{Logger: log.With("component", "ca"), Publisher: store, Mesh: local("ca")})
			if err != nil {
				return err
			}
			xdsDeps := xdsserver.Deps{Logger: log.With("component", "xds-server"), Config: local("xds-server"), Registry: local("xds-server"), Bundle: local("xds-server")}
			if xdsCfg.SecureListen != "" {
				xdsDeps.TLS = authority.ServerTLS()
				// One token reviewer (audiences, cache) for the ca and xDS: pilot-agent sends
				// the same token to both. Nil (no Kubernetes) leaves TLS xDS to certificates.
				if r := authority.TokenReviewer(); r != nil {
					xdsDeps.Tokens = r
				}
			}
			if caCfg.Embedded {
				xdsDeps.SecureServices = authority.Register
			}
			// As istiod, credentialName secrets come from the cluster config comes from.
			if kubeCfg != nil {
				if xdsDeps.Credentials, err = kubernetes.NewForConfig(kube.WithRateLimits(kubeCfg)); err != nil {
					return err
				}
			}
			// xds:// config sources are read over mTLS with hyper's own certificate, as its bus.
			ingestCfg.ClusterID = watcherCfg.ClusterID
			ingest, err := configingest.New(ingestCfg, configingest.Deps{
				Logger: log.With("component", "config-ingest"), Publisher: store,
				Identity: authority.Own(spiffe.ID{TrustDomain: caCfg.TrustDomain, Namespace: caCfg.Namespace, ServiceAccount: ServiceAccount}),
			})
			if err != nil {
				return err
			}
			watcher, err := endpointwatcher.New(watcherCfg,
				endpointwatcher.Deps{Logger: log.With("component", "endpoint-watcher"), Config: local("endpoint-watcher"), Publisher: store})
			if err != nil {
				return err
			}
			xds, err := xdsserver.New(xdsCfg, xdsDeps)
			if err != nil {
				return err
			}
			// Nothing is written (a CA root, a state folder) before the configuration is found.
			if err := ingest.CheckMesh(); err != nil {
				return err
			}
			// Consumers (in-process and external) see each producer's state only once it is whole.
			store.SyncAfter(ingest.Ready(), configingest.PublishedTypes()...)
			store.SyncAfter(watcher.Ready(), endpointwatcher.PublishedTypes()...)
			store.SyncAfter(authority.Ready(), ca.PublishedTypes()...)

			var m component.Manager
			if err := tracing.Add(&m, log, "hyper"); err != nil {
				return err
			}
			m.Add("config-ingest", ingest)
			m.Add("endpoint-watcher", watcher)
			m.Add("xds-server", xds)
			m.Add("ca", authority)
			ready := []<-chan struct{}{ingest.Ready(), watcher.Ready(), xds.Ready(), authority.Ready()}
			if busListen != "" {
				// Loopback stays plaintext (local tools); elsewhere mTLS with a certificate the
				// linked ca signs for hyper's own service account, unless plaintext is asked for.
				var sec bus.Security
				if !bus.IsLoopback(busListen) {
					own := authority.Own(spiffe.ID{TrustDomain: caCfg.TrustDomain, Namespace: caCfg.Namespace, ServiceAccount: ServiceAccount})
					if sec, err = busFlags.Security(own); err != nil {
						return err
					}
				}
				busServer, err := bus.ServeGRPC(store, busListen, log, sec)
				if err != nil {
					return err
				}
				m.Add("bus-server", busServer)
			}
			// The webhook serves the Kubernetes API server; without one, only when asked for.
			if kubeCfg != nil || cmd.Flags().Changed("webhook-listen") {
				webhookCfg.Kube = kubeCfg
				if !cmd.Flags().Changed("injection-dir") && ingestCfg.MeshFile != "" {
					// Files mode: the templates are beside mesh.yaml.
					webhookCfg.InjectionDir = filepath.Join(filepath.Dir(ingestCfg.MeshFile), "injection")
				}
				hook, err := webhook.New(webhookCfg, webhook.Deps{
					Logger: log.With("component", "webhook"), Certificate: webhookCertificate(authority, caCfg, webhookCfg), Mesh: local("webhook"),
				})
				if err != nil {
					return err
				}
				m.Add("webhook", hook)
				ready = append(ready, hook.Ready())
			}
			if mon := monitor.Add(&m, log, ready...); mon != nil {
				mon.AddDebug("Sailplane hyper "+xdsCfg.PodName, xds.Debug(), ingest.Debug())
			}
			if pprofAddr != "" {
				m.Add("pprof", cli.Pprof{Addr: pprofAddr, Log: log})
			}
			return cli.RunUntilSignal(&m)
		},
	}
	logOpts.AddFlags(cmd.Flags())
	tracing.AddFlags(cmd.Flags())
	monitor.AddFlags(cmd.Flags(), monitoring.DefaultListen)
	ingestCfg.AddFlags(cmd.Flags())
	source.AddFlags(cmd.Flags())
	watcherCfg.AddFlags(cmd.Flags())
	xdsCfg.AddFlags(cmd.Flags())
	cmd.Flags().StringVar(&xdsCfg.SecureListen, "xds-tls-listen", "127.0.0.1:15012",
		"address serving ADS over TLS with the ca's serving certificate, and the ca's CreateCertificate unless --ca-listen differs; empty: off")
	caCfg.AddFlags(cmd.Flags())
	webhookCfg.AddFlags(cmd.Flags())
	cmd.Flags().StringVar(&pprofAddr, "pprof-addr", "", "serve Go profiles (/debug/pprof/) on this address; empty: off")
	cmd.Flags().StringVar(&busListen, "bus-listen", "127.0.0.1:15051", "address serving the bus to external MCP consumers: plaintext on loopback, else mTLS with hyper's own certificate (spiffe://<trust-domain>/ns/<namespace>/sa/"+ServiceAccount+"), consumers checked against --bus-peers, unless --bus-plaintext; empty to disable")
	busFlags.AddFlags(cmd.Flags())
	return cmd
}

// webhookCertificate is the webhook's serving certificate, signed in-process by the linked ca for
// the webhook Service's names (--webhook-dns-names) and the listen host.
func webhookCertificate(authority *ca.Service, caCfg ca.Config, cfg webhook.Config) *webhook.Certificate {
	names := caCfg.WebhookDNSNames
	if len(names) == 0 {
		names = webhook.DNSNames(cfg.Namespace)
	}
	if host, _, err := net.SplitHostPort(cfg.Listen); err == nil && host != "" {
		names = append(names, host)
	}
	return &webhook.Certificate{Get: authority.ServingCertificate(names), Roots: authority.RootsPEM, Ready: authority.Ready()}
}
