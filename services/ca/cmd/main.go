// Command ca is Sailplane's certificate authority: it keeps the mesh's root of trust and signs
// workload certificates over Istio's CreateCertificate API (port 15012), so Istio's own
// istio-agent can use it unchanged. It links nothing of xds-server or config-ingest.
package main

import (
	"errors"

	"github.com/spf13/cobra"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/cli"
	"sailplane.dev/shared/component"
	"sailplane.dev/shared/kube"
	"sailplane.dev/shared/monitoring"
	"sailplane.dev/shared/serviceid"
	"sailplane.dev/shared/spiffe"
	"sailplane.dev/shared/telemetry"

	ca "sailplane.dev/services/ca"
)

func main() {
	var (
		logOpts    cli.LogOptions
		tracing    telemetry.TracingFlags
		monitor    monitoring.Flags
		cfg        ca.Config
		kubeconfig string
		useKube    string
		busListen  string
		configBus  string
		busFlags   serviceid.BusFlags
	)
	cmd := &cobra.Command{
		Use:   "ca",
		Short: "Sailplane ca: keeps the root of trust and signs workload certificates (Istio's CreateCertificate API)",
		RunE: func(*cobra.Command, []string) error {
			log, err := logOpts.Logger()
			if err != nil {
				return err
			}
			switch useKube {
			case "auto", "true":
				found, err := kube.Discover(kubeconfig)
				switch {
				case err == nil:
					cfg.Kube = found.Config
					log.Info("kubernetes", "source", found.Source)
				case errors.Is(err, kube.ErrNoCluster) && useKube == "auto":
					log.Info("no Kubernetes cluster found: no token authentication, root in a folder")
				default:
					return err
				}
			case "false":
			default:
				return errors.New(`--kubernetes: want auto, true or false`)
			}
			cfg.UseKube(cfg.Kube, ".")
			store := bus.NewStore(bus.WithLogger(log.With("component", "bus")))
			deps := ca.Deps{Logger: log.With("component", "ca"), Publisher: store}
			svc, err := ca.New(cfg, deps)
			if err != nil {
				return err
			}
			// The ca signs its own bus certificate in-process.
			sec, err := busFlags.Security(svc.Own(spiffe.ID{TrustDomain: cfg.TrustDomain, Namespace: cfg.Namespace, ServiceAccount: ca.ServiceAccount}))
			if err != nil {
				return err
			}
			if configBus != "" {
				svc.UseMesh(bus.Dial(configBus, bus.WithDialLogger(log.With("component", "config-bus")), bus.WithSecurity(sec)))
			}
			store.SyncAfter(svc.Ready(), ca.PublishedTypes()...)
			var m component.Manager
			if err := tracing.Add(&m, log, "ca"); err != nil {
				return err
			}
			m.Add("ca", svc)
			if busListen != "" {
				busServer, err := bus.ServeGRPC(store, busListen, log, sec)
				if err != nil {
					return err
				}
				m.Add("bus-server", busServer)
			}
			monitor.Add(&m, log, svc.Ready())
			return cli.RunUntilSignal(&m)
		},
	}
	logOpts.AddFlags(cmd.Flags())
	tracing.AddFlags(cmd.Flags())
	monitor.AddFlags(cmd.Flags(), "")
	cfg.AddFlags(cmd.Flags())
	cmd.Flags().StringVar(&busListen, "bus-listen", "127.0.0.1:15053", "address serving the trust bundle (TrustBundle) on the bus, over mTLS with the ca's own certificate (spiffe://<trust-domain>/ns/<namespace>/sa/ca) unless --bus-plaintext; empty to disable")
	busFlags.AddFlags(cmd.Flags())
	cmd.Flags().StringVar(&configBus, "config-bus", "", "config-ingest's bus address, for the mesh config's discoverySelectors (which namespaces get istio-ca-root-cert); empty: every namespace")
	cmd.Flags().StringVar(&useKube, "kubernetes", "auto", "use Kubernetes (token reviews, root in a Secret): auto (when a cluster is found), true or false")
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster, $KUBECONFIG, ~/.kube/config)")
	cli.Execute(cmd)
}
