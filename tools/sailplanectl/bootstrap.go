package main

import (
	"github.com/spf13/cobra"

	"sailplane.dev/shared/grpcbootstrap"
)

func bootstrapCmd() *cobra.Command {
	var p grpcbootstrap.Workload
	cmd := &cobra.Command{
		Use:   "bootstrap",
		Short: "Print client bootstraps",
	}
	grpcCmd := &cobra.Command{
		Use:   "grpc",
		Short: "Print a gRPC xDS bootstrap (GRPC_XDS_BOOTSTRAP) for a proxyless client",
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := grpcbootstrap.New(p)
			if err != nil {
				return err
			}
			out, err := b.JSON()
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(out)
			return err
		},
	}
	grpcCmd.Flags().StringVar(&p.XDSAddress, "xds-address", "127.0.0.1:15010", "Sailplane's xDS address")
	grpcCmd.Flags().StringVar(&p.Namespace, "namespace", "default", "the client's namespace")
	grpcCmd.Flags().StringVar(&p.Pod, "pod", "client", "the client's pod (or workload) name")
	grpcCmd.Flags().StringVar(&p.IP, "ip", "127.0.0.1", "the client's IP")
	cmd.AddCommand(grpcCmd)
	return cmd
}
