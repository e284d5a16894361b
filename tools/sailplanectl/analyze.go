package main

import (
	"cmp"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/shared/config"
	"sailplane.dev/shared/config/analyze"
	"sailplane.dev/shared/schema"
)

func analyzeCmd() *cobra.Command {
	var files fileFlags
	var configBus busFlags
	var registryBus string
	var warningsAsErrors bool
	var format *string
	cmd := &cobra.Command{
		Use:   "analyze (-f FILE|DIR|- | --bus ADDR)",
		Short: "Find problems across resources: missing subsets, gateways, hosts, parents and backends, conflicting rules",
		Long: `Analyze a set of Istio and Gateway API config for problems no single resource shows: a
VirtualService naming a subset no DestinationRule defines, a gateway that does not exist or does
not serve its hosts, a destination host no service has, two VirtualServices or DestinationRules
for one host; a route whose parentRef or backendRef names nothing, a route its parent's listeners
do not accept (as Sailplane binds it), a cross-namespace reference without its ReferenceGrant, a
ReferenceGrant nothing uses, a Gateway of a class Sailplane does not serve. Messages carry
Istio's codes and texts (istioctl analyze) where Istio has the check.

With -f, files are read and validated as by validate; Kubernetes Services in them count as
services, beside ServiceEntries. With --bus, the config a running control plane serves is read
from its config bus, and the services from its registry bus (--registry-bus; by default the same
address, as hyper serves both on one bus).
Exit code 1 when an Error is found (with --warnings-as-errors, also on warnings; Info never
fails); 0 otherwise.`,
		Example: `  sailplanectl analyze -f examples/etc/sailplane/conf/
  sailplanectl analyze --bus 127.0.0.1:15051 --registry-bus 127.0.0.1:15052`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(files.paths) == 0 && configBus.addr == "" {
				return errors.New("no input: give -f FILE|DIR|- or --bus ADDR")
			}
			var s analyze.Set
			msgs, n := files.read(&s, cmd.InOrStdin())
			var sources []string
			if n > 0 || configBus.addr == "" {
				sources = append(sources, plural(n, "file"))
			}
			if configBus.addr != "" {
				if err := readLive(cmd, &s, configBus, registryBus); err != nil {
					return err
				}
				sources = append(sources, "the config of bus "+configBus.addr)
			}
			msgs = analyze.Sort(append(msgs, analyze.Analyze(&s)...))
			return report(cmd, *format, msgs, strings.Join(sources, " and "), warningsAsErrors)
		},
	}
	files.add(cmd.Flags())
	configBus.add(cmd.Flags(), "bus", "", "config bus address (config-ingest's, or hyper's), e.g. 127.0.0.1:15051")
	cmd.Flags().StringVar(&registryBus, "registry-bus", "", "registry bus address (endpoint-watcher's, e.g. 127.0.0.1:15052; default: --bus)")
	cmd.Flags().BoolVar(&warningsAsErrors, "warnings-as-errors", false, "exit 1 on warnings too")
	format = addOutputFlag(cmd)
	return cmd
}

// readLive adds the config served on the config bus and the services of the registry bus to s.
// What a bus serves was validated by config-ingest already.
func readLive(cmd *cobra.Command, s *analyze.Set, f busFlags, registryBus string) error {
	snap, err := f.read(cmd.Context(), f.addr, schema.TypeURLs(schema.ConfigKinds))
	if err != nil {
		return err
	}
	for _, k := range schema.ConfigKinds {
		for _, r := range snap.all(k.TypeURL) {
			s.Configs = append(s.Configs, config.FromResource(k, r))
		}
	}
	addr := cmp.Or(registryBus, f.addr)
	reg, err := f.read(cmd.Context(), addr, []string{schema.Service.TypeURL})
	if err != nil {
		return err
	}
	for _, r := range reg.all(schema.Service.TypeURL) {
		if svc, ok := r.Body.(*discoveryv1.Service); ok {
			s.Services = append(s.Services, svc)
		}
	}
	if registryBus == "" && len(s.Services) == 0 {
		// A config bus of the microservices: its registry is endpoint-watcher's bus.
		s.NoRegistry = true
		fmt.Fprintf(cmd.ErrOrStderr(), "note: bus %s serves no services, so destination hosts and backends are not checked: give --registry-bus (endpoint-watcher's bus, e.g. 127.0.0.1:15052)\n", f.addr)
	}
	return nil
}
