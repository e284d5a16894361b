// Command xds-server translates the config and registry it reads from the bus into xDS and serves
// it to Envoy and proxyless gRPC clients over ADS. Run as many replicas as the load needs.
package main

import (
	"errors"

	"github.com/spf13/cobra"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/cli"
	"sailplane.dev/shared/component"
	"sailplane.dev/shared/serviceid"

	xdsserver "sailplane.dev/services/xds-server"
)

func main() {
	var (
		logOpts     cli.LogOptions
		configBus   string
		registryBus string
		cfg         xdsserver.Config
		pprofAddr   string
		certDir     string
		caBus       string
		identity    serviceid.Flags
	)
	cmd := &cobra.Command{
		Use:   "xds-server",
		Short: "Serve xDS to Envoy and proxyless gRPC clients",
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := logOpts.Logger()
			if err != nil {
				return err
			}
			certs, sec, err := identity.Identity(log)
			if err != nil {
				return err
			}
			deps := xdsserver.Deps{
				Logger:   log.With("component", "xds-server"),
				Config:   bus.Dial(configBus, bus.WithDialLogger(log.With("component", "config-bus")), bus.WithSecurity(sec)),
				Registry: bus.Dial(registryBus, bus.WithDialLogger(log.With("component", "registry-bus")), bus.WithSecurity(sec)),
			}
			if caBus != "" {
				deps.Bundle = bus.Dial(caBus, bus.WithDialLogger(log.With("component", "ca-bus")), bus.WithSecurity(sec))
			}
			if cfg.SecureListen != "" {
				if certDir == "" {
					return errors.New("--xds-tls-listen needs --tls-cert-dir: the folder where the ca keeps this server's certificate (ca --serving-cert-dir)")
				}
				deps.TLS = xdsserver.FolderTLS(certDir)
			}
			srv, err := xdsserver.New(cfg, deps)
			if err != nil {
				return err
			}
			var m component.Manager
			if certs != nil {
				m.Add("certificate", certs)
			}
			m.Add("xds-server", srv)
			if pprofAddr != "" {
				m.Add("pprof", cli.Pprof{Addr: pprofAddr, Log: log})
			}
			return cli.RunUntilSignal(&m)
		},
	}
	logOpts.AddFlags(cmd.Flags())
	cmd.Flags().StringVar(&configBus, "config-bus", "127.0.0.1:15051", "config-ingest's bus address")
	cmd.Flags().StringVar(&registryBus, "registry-bus", "127.0.0.1:15052", "endpoint-watcher's bus address")
	cfg.AddFlags(cmd.Flags())
	cmd.Flags().StringVar(&caBus, "ca-bus", "", "the ca's bus address (its --bus-listen), for the mesh's trust bundle; empty: none")
	cmd.Flags().StringVar(&cfg.SecureListen, "xds-tls-listen", "", "address serving ADS over TLS (istiod's 15012) with the certificate in --tls-cert-dir; empty: off")
	cmd.Flags().StringVar(&certDir, "tls-cert-dir", "", "folder holding the TLS listener's certificate (tls.crt, tls.key), kept by the ca (--serving-cert-dir) or a mounted kubernetes.io/tls Secret; re-read when it changes")
	identity.AddFlags(cmd.Flags())
	cmd.Flags().StringVar(&pprofAddr, "pprof-addr", "", "serve Go profiles (/debug/pprof/) on this address; empty: off")
	cli.Execute(cmd)
}
