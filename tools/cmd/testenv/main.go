// Command testenv builds the cached etcd, kube-apiserver, kubectl, consul, pilot-discovery,
// pilot-agent and istioctl binaries and runs them on 127.0.0.1 for a person.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
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
			fmt.Fprintf(out, "pilot-discovery %s\n", b.PilotDiscovery)
			fmt.Fprintf(out, "kubectl        %s\n", b.Kubectl)
			return nil
		},
	}
}

// crdsCmd prints the CRD file StartKube installs, or copies the Gateway API's CRD files into a
// folder; `make crds` writes both into deploy/crds.
func crdsCmd() *cobra.Command {
	var gatewayAPIDir string
	cmd := &cobra.Command{
		Use:   "crds",
		Short: "Print Istio's CRDs (istio.io/api@" + testenv.IstioAPIVersion + "), the ones StartKube installs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if gatewayAPIDir != "" {
				return copyGatewayAPICRDs(cmd.Context(), gatewayAPIDir)
			}
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
	cmd.Flags().StringVar(&gatewayAPIDir, "gateway-api", "", "instead, copy the Gateway API's standard-channel CRD files (sigs.k8s.io/gateway-api@"+
		testenv.GatewayAPIVersion+") into this folder, replacing those it has")
	return cmd
}

func copyGatewayAPICRDs(ctx context.Context, dir string) error {
	files, err := testenv.GatewayAPICRDFiles(ctx)
	if err != nil {
		return err
	}
	old, err := filepath.Glob(filepath.Join(dir, "gateway.networking.k8s.io_*.yaml"))
	if err != nil {
		return err
	}
	for _, f := range old {
		if err := os.Remove(f); err != nil {
			return err
		}
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		// The module cache's files are read-only; the copies are the repo's.
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func upCmd() *cobra.Command {
	var noKube, noConsul, noCRDs bool
	var kubeconfigCopy, kubectlLink string
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
				kubeconfig := k.KubeconfigPath()
				if kubeconfigCopy != "" {
					if err := copyFile(kubeconfig, kubeconfigCopy); err != nil {
						return err
					}
					// A kubeconfig naming a stopped API server would only confuse.
					defer os.Remove(kubeconfigCopy)
					kubeconfig = kubeconfigCopy
				}
				fmt.Fprintf(out, "kube-apiserver %s\nkubeconfig     %s\n", k.Host(), kubeconfig)
				if kubectlLink != "" {
					kubectl, err := testenv.EnsureKubectl(ctx, log)
					if err != nil {
						return err
					}
					if err := link(kubectl, kubectlLink); err != nil {
						return err
					}
					fmt.Fprintf(out, "kubectl        %s\n", kubectlLink)
				}
				fmt.Fprintf(out, "export KUBECONFIG=%s\n", kubeconfig)
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
	cmd.Flags().StringVar(&kubeconfigCopy, "kubeconfig", "", "also write the kubeconfig here (removed on exit), a path that stays the same from run to run")
	cmd.Flags().StringVar(&kubectlLink, "kubectl", "", "link the cached kubectl (built if missing) here")
	return cmd
}

// copyFile writes src's content to dst.
func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o600)
}

// link makes path a symbolic link to target, replacing what was there.
func link(target, path string) error {
	tmp := path + ".tmp"
	_ = os.Remove(tmp)
	if err := os.Symlink(target, tmp); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
