package main

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/serviceid"
	"sailplane.dev/shared/workloadcert"
)

func busCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "bus", Short: "Read a Sailplane bus (MCP over xDS)"}
	var addr string
	var timeout time.Duration
	var showBody bool
	var certDir string
	var peers []string
	get := &cobra.Command{
		Use:   "get TYPE_URL_OR_KIND...",
		Short: "List the resources a bus serves, e.g. `sailplanectl bus get VirtualService`",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			types := make([]string, 0, len(args))
			for _, a := range args {
				types = append(types, typeURL(a))
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			sec, err := busSecurity(certDir, peers)
			if err != nil {
				return err
			}
			snap := &snapshot{resources: map[string]map[string]*bus.Resource{}, synced: make(chan struct{})}
			go func() {
				_ = bus.Dial(addr, bus.WithNodeID("sailplanectl"), bus.WithSecurity(sec)).Subscribe(ctx, types, snap)
			}()
			select {
			case <-snap.synced:
			case <-ctx.Done():
				return fmt.Errorf("bus %s: no full state within %v", addr, timeout)
			}
			cancel()
			return snap.print(cmd, types, showBody)
		},
	}
	get.Flags().StringVar(&addr, "bus", "127.0.0.1:15051", "bus address")
	get.Flags().DurationVar(&timeout, "timeout", 10*time.Second, "how long to wait for the full state")
	get.Flags().BoolVar(&showBody, "body", false, "print each resource's body as JSON")
	get.Flags().StringVar(&certDir, "cert-dir", "", "credential folder (cert-chain.pem, key.pem, root-cert.pem) for an mTLS bus, e.g. one the ca keeps with --service-cert-dir; empty: plaintext")
	get.Flags().StringSliceVar(&peers, "bus-peers", nil, "SPIFFE IDs the bus server may have (default: Sailplane's service accounts in the certificate's namespace)")
	cmd.AddCommand(get)
	return cmd
}

// busSecurity is mTLS with the credential in certDir, or plaintext without one.
func busSecurity(certDir string, peers []string) (bus.Security, error) {
	if certDir == "" {
		return bus.Security{}, nil
	}
	c, err := workloadcert.ReadFolder(certDir)
	if err != nil {
		return bus.Security{}, fmt.Errorf("--cert-dir: %w", err)
	}
	if len(c.Roots) == 0 {
		return bus.Security{}, fmt.Errorf("--cert-dir %s: no %s", certDir, workloadcert.RootCertFile)
	}
	f := serviceid.BusFlags{Peers: peers, TrustDomain: c.ID.TrustDomain, Namespace: c.ID.Namespace}
	return f.Security(staticCredential{c})
}

type staticCredential struct{ c *workloadcert.Credential }

func (s staticCredential) Current() *workloadcert.Credential { return s.c }

// typeURL accepts a bare kind ("VirtualService") as well as a full type URL.
func typeURL(arg string) string {
	for _, k := range schema.All {
		if k.Kind == arg {
			return k.TypeURL
		}
	}
	return arg
}

// snapshot is a bus.Handler that keeps the latest state of each type.
type snapshot struct {
	mu        sync.Mutex
	resources map[string]map[string]*bus.Resource
	synced    chan struct{}
}

func (s *snapshot) Apply(c bus.Change) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.resources[c.TypeURL]
	if m == nil {
		m = map[string]*bus.Resource{}
		s.resources[c.TypeURL] = m
	}
	for _, r := range c.Updated {
		m[r.Name] = r
	}
	for _, n := range c.Removed {
		delete(m, n)
	}
	return nil
}

func (s *snapshot) Synced() { close(s.synced) }

func (s *snapshot) print(cmd *cobra.Command, types []string, showBody bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := cmd.OutOrStdout()
	for _, t := range types {
		names := make([]string, 0, len(s.resources[t]))
		for n := range s.resources[t] {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(out, "# %s: %d\n", t, len(names))
		for _, n := range names {
			r := s.resources[t][n]
			fmt.Fprintf(out, "%s\t%s\n", n, r.Version)
			if showBody && r.Body != nil {
				b, err := protojson.Marshal(r.Body)
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "  %s\n", b)
			}
		}
	}
	return nil
}
