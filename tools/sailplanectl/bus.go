package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/serviceid"
	"sailplane.dev/shared/workloadcert"
)

func busCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "bus", Short: "Read a Sailplane bus (MCP over xDS)"}
	cmd.AddCommand(busListCmd(), busGetCmd())
	return cmd
}

// busFlags are how a command reaches a bus.
type busFlags struct {
	addr    string
	timeout time.Duration
	certDir string
	peers   []string
}

func (f *busFlags) add(fs *pflag.FlagSet, name, def, usage string) {
	fs.StringVar(&f.addr, name, def, usage)
	fs.DurationVar(&f.timeout, "timeout", 10*time.Second, "how long to wait for a bus's full state")
	f.addSecurity(fs)
}

// addSecurity registers the flags of an mTLS bus.
func (f *busFlags) addSecurity(fs *pflag.FlagSet) {
	fs.StringVar(&f.certDir, "cert-dir", "", "credential folder (cert-chain.pem, key.pem, root-cert.pem) for an mTLS bus, e.g. one the ca keeps with --service-cert-dir; empty: plaintext")
	fs.StringSliceVar(&f.peers, "bus-peers", nil, "SPIFFE IDs the bus server may have (default: Sailplane's service accounts in the certificate's namespace)")
}

// read returns the full state of types on the bus at addr.
func (f *busFlags) read(ctx context.Context, addr string, types []string) (*snapshot, error) {
	sec, err := busSecurity(f.certDir, f.peers)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	snap := &snapshot{resources: map[string]map[string]*bus.Resource{}, synced: make(chan struct{})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = bus.Dial(addr, bus.WithNodeID("sailplanectl"), bus.WithSecurity(sec)).Subscribe(ctx, types, snap)
	}()
	defer func() { cancel(); <-done }()
	select {
	case <-snap.synced:
		return snap, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("bus %s: no full state within %v", addr, f.timeout)
	}
}

func busListCmd() *cobra.Command {
	var f busFlags
	var format *string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the types a bus serves, with how many resources of each",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			snap, err := f.read(cmd.Context(), f.addr, schema.TypeURLs(schema.All))
			if err != nil {
				return err
			}
			type row struct {
				Kind      string `json:"kind"`
				TypeURL   string `json:"typeUrl"`
				Resources int    `json:"resources"`
			}
			t := table{header: []string{"KIND", "TYPE URL", "RESOURCES"}}
			var rows []row
			for _, k := range schema.All {
				n := snap.count(k.TypeURL)
				if n == 0 {
					continue // a bus answers every type; one it does not publish is empty
				}
				rows = append(rows, row{k.Kind, k.TypeURL, n})
				t.add(k.Kind, k.TypeURL, strconv.Itoa(n))
			}
			return writeOutput(cmd.OutOrStdout(), *format, t, rows)
		},
	}
	f.add(cmd.Flags(), "bus", "127.0.0.1:15051", "bus address")
	format = addOutputFlag(cmd)
	return cmd
}

func busGetCmd() *cobra.Command {
	var f busFlags
	var format *string
	var showBody bool
	cmd := &cobra.Command{
		Use:   "get KIND_OR_TYPE_URL...",
		Short: "List the resources a bus serves, e.g. `sailplanectl bus get VirtualService`",
		Args:  cobra.MinimumNArgs(1),
		ValidArgsFunction: func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
			kinds := make([]string, len(schema.All))
			for i, k := range schema.All {
				kinds[i] = k.Kind
			}
			return kinds, cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			types := make([]string, 0, len(args))
			for _, a := range args {
				types = append(types, typeURL(a))
			}
			snap, err := f.read(cmd.Context(), f.addr, types)
			if err != nil {
				return err
			}
			return snap.print(cmd, *format, types, showBody)
		},
	}
	f.add(cmd.Flags(), "bus", "127.0.0.1:15051", "bus address")
	cmd.Flags().BoolVar(&showBody, "body", false, "show each resource's body (always in yaml and json output)")
	format = addOutputFlag(cmd)
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

func (s *snapshot) count(typeURL string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.resources[typeURL])
}

// all returns the resources of typeURL sorted by name.
func (s *snapshot) all(typeURL string) []*bus.Resource {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*bus.Resource, 0, len(s.resources[typeURL]))
	for _, r := range s.resources[typeURL] {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// busResource is a resource as `bus get -o yaml|json` prints it.
type busResource struct {
	TypeURL     string            `json:"typeUrl"`
	Name        string            `json:"name"`
	Version     string            `json:"version"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Body        json.RawMessage   `json:"body"`
}

func (s *snapshot) print(cmd *cobra.Command, format string, types []string, showBody bool) error {
	t := table{header: []string{"TYPE", "NAME", "VERSION"}}
	if showBody {
		t.header = append(t.header, "BODY")
	}
	var data []busResource
	for _, typ := range types {
		kind := typ
		if k, ok := schema.ByTypeURL(typ); ok {
			kind = k.Kind
		}
		for _, r := range s.all(typ) {
			body, err := protoValue(r.Body)
			if err != nil {
				return fmt.Errorf("%s %s: %w", typ, r.Name, err)
			}
			data = append(data, busResource{typ, r.Name, r.Version, r.Labels, r.Annotations, body})
			row := []string{kind, r.Name, r.Version}
			if showBody {
				row = append(row, string(body))
			}
			t.add(row...)
		}
	}
	return writeOutput(cmd.OutOrStdout(), format, t, data)
}
