// Command agent runs beside each workload, pod or VM: it generates the workload's key, gets its
// certificate from the ca (Istio's CreateCertificate API) and keeps it renewed, serving it as
// Envoy's SDS over a Unix socket and as files plus a gRPC xDS bootstrap for proxyless gRPC; for
// Envoy it writes the bootstrap and proxies ADS to the xDS server. It needs no Kubernetes client.
package main

import (
	"github.com/spf13/cobra"

	"sailplane.dev/shared/cli"
	"sailplane.dev/shared/component"

	agent "sailplane.dev/services/agent"
)

func main() {
	var (
		logOpts cli.LogOptions
		cfg     agent.Config
	)
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Sailplane agent: the workload's key and certificate (SDS, files for proxyless gRPC), Envoy bootstrap, xDS proxy",
		RunE: func(*cobra.Command, []string) error {
			log, err := logOpts.Logger()
			if err != nil {
				return err
			}
			a, err := agent.New(cfg, agent.Deps{Logger: log.With("component", "agent")})
			if err != nil {
				return err
			}
			var m component.Manager
			m.Add("agent", a)
			return cli.RunUntilSignal(&m)
		},
	}
	logOpts.AddFlags(cmd.Flags())
	cfg.AddFlags(cmd.Flags())
	cli.Execute(cmd)
}
