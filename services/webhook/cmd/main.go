// Command webhook serves the Kubernetes API server's admission webhooks for Sailplane: sidecar
// injection (/inject) and validation of Istio config (/validate), over HTTPS with a certificate
// from the ca (--ca-address) or a self-managed one, and keeps its revision's webhook
// configurations' caBundle current.
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
	"sailplane.dev/shared/telemetry"

	"sailplane.dev/services/webhook"
)

func main() {
	var (
		logOpts    cli.LogOptions
		tracing    telemetry.TracingFlags
		monitor    monitoring.Flags
		cfg        webhook.Config
		kubeconfig string
		identity   serviceid.Flags
		configBus  string
		pprofAddr  string
	)
	cmd := &cobra.Command{
		Use:   "webhook",
		Short: "Inject sidecars into pods and validate Istio config for the Kubernetes API server",
		RunE: func(*cobra.Command, []string) error {
			log, err := logOpts.Logger()
			if err != nil {
				return err
			}
			found, err := kube.Discover(kubeconfig)
			switch {
			case errors.Is(err, kube.ErrNoCluster):
				log.Info("no Kubernetes cluster: serving without one (no configuration is patched)")
			case err != nil:
				return err
			default:
				cfg.Kube = found.Config
				log.Info("kubernetes", "from", found.Source)
			}
			certs, sec, err := identity.Identity(log)
			if err != nil {
				return err
			}
			var m component.Manager
			if err := tracing.Add(&m, log, "webhook"); err != nil {
				return err
			}
			deps := webhook.Deps{Logger: log.With("component", "webhook")}
			if configBus != "" {
				deps.Mesh = bus.Dial(configBus, bus.WithDialLogger(log.With("component", "config-bus")), bus.WithSecurity(sec))
			}
			if certs != nil {
				// The ca adds the webhook Service's names to this service account's certificates.
				deps.Certificate = webhook.WorkloadCertificate(certs)
				m.Add("certificate", certs)
			}
			srv, err := webhook.New(cfg, deps)
			if err != nil {
				return err
			}
			m.Add("webhook", srv)
			if pprofAddr != "" {
				m.Add("pprof", cli.Pprof{Addr: pprofAddr, Log: log})
			}
			monitor.Add(&m, log, srv.Ready())
			return cli.RunUntilSignal(&m)
		},
	}
	logOpts.AddFlags(cmd.Flags())
	tracing.AddFlags(cmd.Flags())
	monitor.AddFlags(cmd.Flags(), "")
	cfg.AddFlags(cmd.Flags())
	cli.KubeconfigVar(cmd.Flags(), &kubeconfig)
	cmd.Flags().StringVar(&configBus, "config-bus", "", "config-ingest's bus address, for the mesh config (its defaultConfig is the base of injected pods' ProxyConfig); empty: Istio's defaults")
	identity.AddFlags(cmd.Flags())
	cmd.Flags().StringVar(&pprofAddr, "pprof-addr", "", "serve Go profiles (/debug/pprof/) on this address; empty: off")
	cli.Execute(cmd)
}
