package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// gatewayObject is one entry of config-ingest's /debug/gateway_status.
type gatewayObject struct {
	Kind       string          `json:"kind"`
	Namespace  string          `json:"namespace,omitempty"`
	Name       string          `json:"name"`
	OK         bool            `json:"ok"`
	Conditions []string        `json:"conditions"`
	Status     json.RawMessage `json:"status"`
}

func gatewayStatusCmd() *cobra.Command {
	var (
		address string
		timeout time.Duration
		format  *string
	)
	cmd := &cobra.Command{
		Use:   "gateway-status [kind/[namespace/]name]",
		Short: "Print the Kubernetes Gateway API status config-ingest computed",
		Long: `Print the status config-ingest computed for each Kubernetes Gateway API object of Sailplane's
classes (GatewayClass, Gateway, ListenerSet, routes, BackendTLSPolicy): in Kubernetes the status it
writes (the leader does), in files mode — where there is no API server to write it to — the status
the objects would carry. It reads config-ingest's (or hyper's) /debug/gateway_status on the
monitoring port, which answers loopback callers only (kubectl port-forward to reach a pod). The
table has one line per condition, scoped by listener or parent; -o yaml|json prints the whole
status. An argument keeps only the objects whose kind/namespace/name starts with it.`,
		Example: `  sailplanectl gateway-status
  sailplanectl gateway-status HTTPRoute/demo/ -o yaml
  sailplanectl gateway-status --monitoring-address 127.0.0.1:15014`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			objs, err := fetchGatewayStatus(ctx, address)
			if err != nil {
				return err
			}
			if len(args) == 1 {
				var kept []gatewayObject
				for _, o := range objs {
					if strings.HasPrefix(objectName(o), args[0]) {
						kept = append(kept, o)
					}
				}
				objs = kept
			}
			t := table{header: []string{"KIND", "NAME", "OK", "CONDITIONS"}}
			for _, o := range objs {
				name := o.Name
				if o.Namespace != "" {
					name = o.Namespace + "/" + o.Name
				}
				ok := "yes"
				if !o.OK {
					ok = "NO"
				}
				if len(o.Conditions) == 0 {
					t.add(o.Kind, name, ok, "-")
				}
				for i, c := range o.Conditions {
					if i == 0 {
						t.add(o.Kind, name, ok, c)
					} else {
						t.add("", "", "", c)
					}
				}
			}
			if objs == nil {
				objs = []gatewayObject{}
			}
			return writeOutput(cmd.OutOrStdout(), *format, t, objs)
		},
	}
	cmd.Flags().StringVar(&address, "monitoring-address", "127.0.0.1:15014", "config-ingest's (or hyper's) monitoring address (--monitoring-listen)")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Second, "how long to wait for the answer")
	format = addOutputFlag(cmd)
	return cmd
}

func objectName(o gatewayObject) string {
	if o.Namespace == "" {
		return o.Kind + "/" + o.Name
	}
	return o.Kind + "/" + o.Namespace + "/" + o.Name
}

func fetchGatewayStatus(ctx context.Context, address string) ([]gatewayObject, error) {
	url := "http://" + address + "/debug/gateway_status"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("gateway status from %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("gateway status from %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("gateway status from %s: %s: %s (is it config-ingest or hyper?)", url, resp.Status, strings.TrimSpace(string(body)))
	}
	var objs []gatewayObject
	if err := json.Unmarshal(body, &objs); err != nil {
		return nil, fmt.Errorf("gateway status from %s: %w", url, err)
	}
	return objs, nil
}
