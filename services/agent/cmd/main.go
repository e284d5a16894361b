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
	"sailplane.dev/services/agent/capture"
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
	cmd.AddCommand(captureCommand(), drainCommand())
	cli.Execute(cmd)
}

// captureCommand is `agent capture`, the init container of an injected pod (as Istio's
// istio-init): it installs the traffic capture rules in the pod's network namespace and exits.
func captureCommand() *cobra.Command {
	var (
		logOpts cli.LogOptions
		opts    capture.CommandOptions
	)
	cmd := &cobra.Command{
		Use:   "capture",
		Short: "Install the pod's traffic capture (Istio's istio-iptables flags): outbound TCP to 15001, inbound to 15006, DNS to 15053",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := logOpts.Logger()
			if err != nil {
				return err
			}
			ctx, cancel := cli.SignalContext()
			defer cancel()
			return opts.Run(ctx, log.With("component", "capture"), cmd.OutOrStdout())
		},
	}
	logOpts.AddFlags(cmd.Flags())
	opts.AddFlags(cmd)
	return cmd
}

// drainCommand is `agent drain`, the preStop hook of the agent's container: it asks the running
// agent (POST /drain on its status port, over loopback) to start Envoy's drain as the pod's
// termination begins, as Istio's `pilot-agent request POST drain`.
func drainCommand() *cobra.Command {
	var port int
	cmd := &cobra.Command{
		Use:   "drain",
		Short: "Ask the agent of this pod to drain Envoy's inbound listeners (the preStop hook)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			ctx, cancel := cli.SignalContext()
			defer cancel()
			return agent.RequestDrain(ctx, port)
		},
	}
	cmd.Flags().IntVar(&port, "status-port", 15020, "the agent's status port (ProxyConfig statusPort)")
	return cmd
}
