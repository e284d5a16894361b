// Command xds-server translates the config and registry it reads from the bus into xDS and serves
// it to Envoy and proxyless gRPC clients over ADS. Run as many replicas as the load needs.
package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/cli"
	"sailplane.dev/shared/component"
	"sailplane.dev/shared/kube"
	"sailplane.dev/shared/monitoring"
	"sailplane.dev/shared/serviceid"
	"sailplane.dev/shared/telemetry"
	"sailplane.dev/shared/workloadcert"

	xdsserver "sailplane.dev/services/xds-server"
)

func main() {
	var (
		logOpts     cli.LogOptions
		tracing     telemetry.TracingFlags
		monitor     monitoring.Flags
		configBus   string
		registryBus string
		cfg         xdsserver.Config
		pprofAddr   string
		certDir     string
		caBus       string
		identity    serviceid.Flags
		useKube     string
		kubeconfig  string
		tokens      kube.TokenReviewOptions
		creds       string
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
			switch {
			case cfg.SecureListen == "":
			case certDir != "":
				deps.TLS = xdsserver.FolderTLS(certDir)
			case certs != nil:
				// The ca adds istiod's names to this service account's certificates.
				deps.TLS = xdsserver.ServingTLS(workloadcert.GetCertificate(certs))
			default:
				return errors.New("--xds-tls-listen needs a certificate: --ca-address (this server's own, with istiod's names) or --tls-cert-dir (the folder where the ca keeps one, ca --serving-cert-dir)")
			}
			tokens.TrustDomain = identity.Bus.TrustDomain
			if deps.Tokens, err = tokenReviewer(useKube, kubeconfig, tokens); err != nil {
				return err
			}
			if deps.Tokens != nil {
				log.Info("TLS xDS clients may authenticate with service-account tokens", "audiences", tokens.Audiences)
			}
			if deps.Credentials, err = cluster("--credentials", creds, kubeconfig); err != nil {
				return err
			}
			if deps.Credentials != nil {
				log.Info("serving credentialName secrets from Kubernetes")
			}
			srv, err := xdsserver.New(cfg, deps)
			if err != nil {
				return err
			}
			var m component.Manager
			if err := tracing.Add(&m, log, "xds-server"); err != nil {
				return err
			}
			if certs != nil {
				m.Add("certificate", certs)
			}
			m.Add("xds-server", srv)
			if pprofAddr != "" {
				m.Add("pprof", cli.Pprof{Addr: pprofAddr, Log: log})
			}
			if mon := monitor.Add(&m, log, srv.Ready()); mon != nil {
				mon.AddDebug("Sailplane xds-server "+cfg.PodName, srv.Debug())
			}
			return cli.RunUntilSignal(&m)
		},
	}
	logOpts.AddFlags(cmd.Flags())
	tracing.AddFlags(cmd.Flags())
	monitor.AddFlags(cmd.Flags(), monitoring.DefaultListen)
	cmd.Flags().StringVar(&configBus, "config-bus", "127.0.0.1:15051", "config-ingest's bus address")
	cmd.Flags().StringVar(&registryBus, "registry-bus", "127.0.0.1:15052", "endpoint-watcher's bus address")
	cfg.AddFlags(cmd.Flags())
	cmd.Flags().StringVar(&caBus, "ca-bus", "", "the ca's bus address (its --bus-listen), for the mesh's trust bundle; empty: none")
	cmd.Flags().StringVar(&cfg.SecureListen, "xds-tls-listen", "", "address serving ADS over TLS (istiod's 15012) with this server's own certificate from --ca-address (which carries istiod's names), or the one in --tls-cert-dir; empty: off")
	cmd.Flags().StringVar(&certDir, "tls-cert-dir", "", "folder holding the TLS listener's certificate (tls.crt, tls.key), kept by the ca (--serving-cert-dir) or a mounted kubernetes.io/tls Secret, instead of this server's own; re-read when it changes")
	identity.AddFlags(cmd.Flags())
	cmd.Flags().StringVar(&pprofAddr, "pprof-addr", "", "serve Go profiles (/debug/pprof/) on this address; empty: off")
	cmd.Flags().StringVar(&useKube, "kubernetes", "false", "review the service-account tokens of TLS xDS clients without a client certificate with this cluster (TokenReview; needs RBAC to create tokenreviews): true, auto (when a cluster is found) or false (such clients are refused)")
	cmd.Flags().StringVar(&creds, "credentials", "false", "serve credentialName secrets (kubernetes://<name>, and <name>-cacert) over SDS from this cluster's Secrets, "+
		"to the proxies allowed to read them (needs list and watch on secrets and create on subjectaccessreviews): true, auto (when a cluster is found) or false")
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file for --kubernetes and --credentials (default: in-cluster, $KUBECONFIG, ~/.kube/config)")
	cmd.Flags().StringSliceVar(&tokens.Audiences, "token-audiences", kube.DefaultTokenAudiences, "audiences a service-account token must be valid for (istiod's TOKEN_AUDIENCES)")
	cli.Execute(cmd)
}

// tokenReviewer is the reviewer of the TLS clients' tokens that --kubernetes asks for; nil
// for none.
func tokenReviewer(useKube, kubeconfig string, opts kube.TokenReviewOptions) (xdsserver.TokenReviewer, error) {
	c, err := cluster("--kubernetes", useKube, kubeconfig)
	if c == nil || err != nil {
		return nil, err
	}
	return kube.NewTokenReviewer(c, opts), nil
}

// cluster is the cluster a flag (--kubernetes, --credentials) of mode true, auto or false asks
// for; nil for none.
func cluster(flag, mode, kubeconfig string) (kubernetes.Interface, error) {
	switch mode {
	case "false":
		return nil, nil
	case "auto", "true":
	default:
		return nil, fmt.Errorf("%s %q: want auto, true or false", flag, mode)
	}
	found, err := kube.Discover(kubeconfig)
	switch {
	case errors.Is(err, kube.ErrNoCluster) && mode == "auto":
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	c, err := kubernetes.NewForConfig(kube.WithRateLimits(found.Config))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	return c, nil
}
