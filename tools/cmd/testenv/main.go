// Command testenv builds the cached etcd, kube-apiserver, consul and
// pilot-agent and istioctl binaries and runs them on 127.0.0.1 for a person.
package main

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"sailplane.dev/tools/testenv"
)

func main() {
	if err := rootCmd().Execute(); err != nil {
		os.Exit(1)
	}
}

func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "testenv",
		Short:         "Real etcd, kube-apiserver and consul on 127.0.0.1",
		SilenceUsage:  true,
		SilenceErrors: false,
	}
	root.AddCommand(buildCmd(), upCmd(), crdsCmd())
	return root
}

func logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, nil))
}

func buildCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "build",
		Short: "Build the binaries into the cache (only the missing ones) and print their paths",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			b, err := testenv.EnsureBinaries(ctx, logger())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "etcd           %s\n", b.Etcd)
			fmt.Fprintf(out, "kube-apiserver %s\n", b.KubeAPIServer)
			fmt.Fprintf(out, "consul         %s\n", b.Consul)
			fmt.Fprintf(out, "pilot-agent    %s\n", b.PilotAgent)
			fmt.Fprintf(out, "istioctl       %s\n", b.Istioctl)
			return nil
		},
	}
}

// crdsCmd prints the CRD file StartKube installs; `make crds` copies it into deploy/crds.
func crdsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "crds",
		Short: "Print Istio's CRDs (istio.io/api@" + testenv.IstioAPIVersion + "), the ones StartKube installs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path, err := testenv.IstioCRDFile(cmd.Context())
			if err != nil {
				return err
			}
			crds, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(crds)
			return err
		},
	}
}

func upCmd() *cobra.Command {
	var noKube, noConsul, noCRDs bool
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Start kube-apiserver (+etcd) and consul, print how to reach them, stop on Ctrl-C",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			log := logger()
			out := cmd.OutOrStdout()
			opts := []testenv.Option{testenv.WithLogger(log)}
			if noCRDs {
				opts = append(opts, testenv.WithoutIstioCRDs())
			}
			if !noKube {
				k, err := testenv.StartKube(ctx, opts...)
				if err != nil {
					return err
				}
				defer k.Stop()
				fmt.Fprintf(out, "kube-apiserver %s\nkubeconfig     %s\n", k.Host(), k.KubeconfigPath())
				fmt.Fprintf(out, "export KUBECONFIG=%s\n", k.KubeconfigPath())
			}
			if !noConsul {
				c, err := testenv.StartConsul(ctx, opts...)
				if err != nil {
					return err
				}
				defer c.Stop()
				fmt.Fprintf(out, "consul         http://%s (dns %s, grpc %s)\n", c.Addr(), c.DNSAddr(), c.GRPCAddr())
				fmt.Fprintf(out, "export CONSUL_HTTP_ADDR=%s\n", c.Addr())
			}
			fmt.Fprintln(out, "running; Ctrl-C stops everything")
			<-ctx.Done()
			fmt.Fprintln(out, "stopping")
			return nil
		},
	}
	cmd.Flags().BoolVar(&noKube, "no-kube", false, "do not start etcd and kube-apiserver")
	cmd.Flags().BoolVar(&noConsul, "no-consul", false, "do not start consul")
	cmd.Flags().BoolVar(&noCRDs, "no-istio-crds", false, "do not install Istio's CRDs")
	return cmd
}
