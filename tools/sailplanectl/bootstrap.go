package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"
)

// grpcBootstrap is the bootstrap gRPC's xDS support reads from $GRPC_XDS_BOOTSTRAP.
type grpcBootstrap struct {
	XDSServers []xdsServer `json:"xds_servers"`
	Node       node        `json:"node"`
}

type xdsServer struct {
	ServerURI      string           `json:"server_uri"`
	ChannelCreds   []map[string]any `json:"channel_creds"`
	ServerFeatures []string         `json:"server_features"`
}

type node struct {
	ID       string            `json:"id"`
	Metadata map[string]string `json:"metadata"`
	// grpc-node refuses a node without a locality, so an empty one is always written.
	Locality map[string]string `json:"locality"`
}

func bootstrapCmd() *cobra.Command {
	var xdsAddr, namespace, pod, ip string
	cmd := &cobra.Command{
		Use:   "bootstrap",
		Short: "Print client bootstraps",
	}
	grpcCmd := &cobra.Command{
		Use:   "grpc",
		Short: "Print a gRPC xDS bootstrap (GRPC_XDS_BOOTSTRAP) for a proxyless client",
		RunE: func(cmd *cobra.Command, _ []string) error {
			b := grpcBootstrap{
				XDSServers: []xdsServer{{
					ServerURI:      xdsAddr,
					ChannelCreds:   []map[string]any{{"type": "insecure"}},
					ServerFeatures: []string{"xds_v3"},
				}},
				Node: node{
					ID:       fmt.Sprintf("sidecar~%s~%s.%s~%s.svc.cluster.local", ip, pod, namespace, namespace),
					Metadata: map[string]string{"GENERATOR": "grpc", "NAMESPACE": namespace, "CLUSTER_ID": "Kubernetes"},
					Locality: map[string]string{},
				},
			}
			out, err := json.MarshalIndent(b, "", "  ")
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), string(out))
			return err
		},
	}
	grpcCmd.Flags().StringVar(&xdsAddr, "xds-address", "127.0.0.1:15010", "Sailplane's xDS address")
	grpcCmd.Flags().StringVar(&namespace, "namespace", "default", "the client's namespace")
	grpcCmd.Flags().StringVar(&pod, "pod", "client", "the client's pod (or workload) name")
	grpcCmd.Flags().StringVar(&ip, "ip", "127.0.0.1", "the client's IP")
	cmd.AddCommand(grpcCmd)
	return cmd
}
