package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// proxyConfig is a proxy's config dump, as one replica answered it.
type proxyConfig struct {
	replica string
	dump    *adminv3.ConfigDump
}

// fetchConfig asks every replica for proxy's config dump: the one it is connected to answers.
func (o *xdsOptions) fetchConfig(cmd *cobra.Command, proxy string) (*proxyConfig, error) {
	answers, err := o.askAll(cmd.Context(), &discoverygrpc.DiscoveryRequest{TypeUrl: typeConfigDump, ResourceNames: []string{proxy}})
	if err != nil {
		return nil, err
	}
	for _, a := range answers {
		if len(a.resp.GetResources()) > 0 {
			return &proxyConfig{replica: a.replica, dump: &adminv3.ConfigDump{Configs: a.resp.GetResources()}}, nil
		}
	}
	return nil, fmt.Errorf("proxy %q is not connected to %s (names are <pod>.<namespace>, as sailplanectl proxy-status lists them)", proxy, strings.Join(o.addrs, ", "))
}

// section is the dump's section of m's type, decoded into m (left empty when absent).
func section[T proto.Message](d *adminv3.ConfigDump, m T) (T, error) {
	for _, a := range d.GetConfigs() {
		if a.MessageIs(m) {
			return m, a.UnmarshalTo(m)
		}
	}
	return m, nil
}

func unmarshal[T proto.Message](a *anypb.Any, m T) (T, error) {
	if a == nil {
		return m, nil
	}
	return m, a.UnmarshalTo(m)
}

// configView is one proxy-config subcommand: its table, and what -o yaml|json prints.
type configView func(d *adminv3.ConfigDump) (table, any, error)

func proxyConfigCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "proxy-config",
		Aliases: []string{"pc"},
		Short:   "Show what xds-server last sent a proxy (and the proxy accepted)",
		Long: `Shows the configuration a proxy holds of what xds-server sent it — the responses it ACKed,
not one it NACKed — read from the xds-server replica it is connected to (Istio's
istio.io/debug/config_dump). This works for proxyless gRPC clients, which have no admin port.
Tables by default, like istioctl proxy-config; -o json the raw configuration (Envoy's admin
ConfigDump format: "all PROXY -o json" is a file istioctl proxy-status --file can compare).
Secrets never carry private keys: certificates come from the workload's agent (SDS, or files
for gRPC), and the secret table says which ones the configuration refers to.`,
	}
	for _, v := range []struct {
		name, short string
		view        configView
	}{
		{"cluster", "Clusters: FQDN, port, subset, direction, type", clusterView},
		{"listener", "Listeners, one row per filter chain: addresses, port, match, destination", listenerView},
		{"route", "Routes, one row per route: route configuration, virtual host, domains, match, destination", routeView},
		{"endpoint", "Endpoints: address, health, locality, priority, cluster", endpointView},
		{"secret", "Secrets the configuration names, and where each comes from", secretView},
		{"all", "Every section (-o json: the whole ConfigDump)", allView},
	} {
		var opts xdsOptions
		var format *string
		sub := &cobra.Command{
			Use:   v.name + " PROXY",
			Short: v.short,
			Args:  cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				pc, err := opts.fetchConfig(cmd, args[0])
				if err != nil {
					return err
				}
				t, data, err := v.view(pc.dump)
				if err != nil {
					return fmt.Errorf("proxy %s (replica %s): %w", args[0], pc.replica, err)
				}
				return writeOutput(cmd.OutOrStdout(), *format, t, data)
			},
		}
		opts.addFlags(sub)
		format = addOutputFlag(sub)
		cmd.AddCommand(sub)
	}
	return cmd
}

// raw is m for -o yaml|json, in its canonical JSON form.
func raw(m proto.Message) (any, error) {
	v, err := protoValue(m)
	if err != nil {
		return nil, fmt.Errorf("encoding as JSON: %w", err)
	}
	return v, nil
}

// parseClusterName reads istiod's "direction|port|subset|fqdn" names.
func parseClusterName(name string) (fqdn, port, subset, direction string) {
	parts := strings.Split(name, "|")
	if len(parts) != 4 {
		return name, "-", "-", "-"
	}
	return dash(parts[3]), dash(parts[1]), dash(parts[2]), parts[0]
}

func clusterView(d *adminv3.ConfigDump) (table, any, error) {
	cd, err := section(d, &adminv3.ClustersConfigDump{})
	if err != nil {
		return table{}, nil, err
	}
	t := table{header: []string{"SERVICE FQDN", "PORT", "SUBSET", "DIRECTION", "TYPE"}}
	for _, dc := range cd.GetDynamicActiveClusters() {
		c, err := unmarshal(dc.GetCluster(), &clusterv3.Cluster{})
		if err != nil {
			return table{}, nil, err
		}
		fqdn, port, subset, dir := parseClusterName(c.GetName())
		kind := c.GetType().String()
		if ct := c.GetClusterType(); ct != nil {
			kind = ct.GetName()
		}
		t.add(fqdn, port, subset, dir, kind)
	}
	data, err := raw(cd)
	return t, data, err
}

func listenerView(d *adminv3.ConfigDump) (table, any, error) {
	ld, err := section(d, &adminv3.ListenersConfigDump{})
	if err != nil {
		return table{}, nil, err
	}
	t := table{header: []string{"NAME", "ADDRESSES", "PORT", "MATCH", "DESTINATION"}}
	for _, dl := range ld.GetDynamicListeners() {
		l, err := unmarshal(dl.GetActiveState().GetListener(), &listenerv3.Listener{})
		if err != nil {
			return table{}, nil, err
		}
		addrs, port := listenerAddress(l)
		if api := l.GetApiListener().GetApiListener(); api != nil {
			// A proxyless gRPC client's listener: no socket, an HTTP connection manager.
			t.add(l.GetName(), "-", "-", "API listener", hcmDestination(api))
			continue
		}
		chains := l.GetFilterChains()
		if l.GetDefaultFilterChain() != nil {
			chains = append(slices.Clip(chains), l.GetDefaultFilterChain())
		}
		if len(chains) == 0 {
			t.add(l.GetName(), addrs, port, "ALL", "-")
		}
		for i, fc := range chains {
			match := chainMatch(fc.GetFilterChainMatch())
			if fc == l.GetDefaultFilterChain() && i == len(chains)-1 {
				match = "default"
			}
			t.add(l.GetName(), addrs, port, match, chainDestination(fc))
		}
	}
	data, err := raw(ld)
	return t, data, err
}

func listenerAddress(l *listenerv3.Listener) (string, string) {
	sa := l.GetAddress().GetSocketAddress()
	if sa == nil {
		return "-", "-"
	}
	addrs := []string{sa.GetAddress()}
	for _, a := range l.GetAdditionalAddresses() {
		addrs = append(addrs, a.GetAddress().GetSocketAddress().GetAddress())
	}
	return strings.Join(addrs, ","), strconv.FormatUint(uint64(sa.GetPortValue()), 10)
}

// chainMatch sums up a filter chain's match as istioctl does.
func chainMatch(m *listenerv3.FilterChainMatch) string {
	var parts []string
	if p := m.GetDestinationPort(); p != nil {
		parts = append(parts, "port "+strconv.FormatUint(uint64(p.GetValue()), 10))
	}
	for _, r := range m.GetPrefixRanges() {
		parts = append(parts, "addr "+r.GetAddressPrefix()+"/"+strconv.FormatUint(uint64(r.GetPrefixLen().GetValue()), 10))
	}
	if len(m.GetServerNames()) > 0 {
		parts = append(parts, "SNI "+strings.Join(m.GetServerNames(), ","))
	}
	if p := m.GetTransportProtocol(); p != "" {
		parts = append(parts, "trans "+p)
	}
	if len(m.GetApplicationProtocols()) > 0 {
		parts = append(parts, "app "+strings.Join(m.GetApplicationProtocols(), ","))
	}
	if len(parts) == 0 {
		return "ALL"
	}
	return strings.Join(parts, "; ")
}

// chainDestination is where a filter chain sends traffic: its HTTP routes or TCP cluster.
func chainDestination(fc *listenerv3.FilterChain) string {
	for _, f := range fc.GetFilters() {
		switch tc := f.GetTypedConfig(); {
		case tc.MessageIs(&hcmv3.HttpConnectionManager{}):
			return hcmDestination(tc)
		case tc.MessageIs(&tcpproxyv3.TcpProxy{}):
			tp, err := unmarshal(tc, &tcpproxyv3.TcpProxy{})
			if err != nil {
				return "?"
			}
			if c := tp.GetCluster(); c != "" {
				return "Cluster: " + c
			}
			var ws []string
			for _, w := range tp.GetWeightedClusters().GetClusters() {
				ws = append(ws, w.GetName()+" "+strconv.FormatUint(uint64(w.GetWeight()), 10))
			}
			return "Clusters: " + strings.Join(ws, ", ")
		}
	}
	if n := len(fc.GetFilters()); n > 0 {
		return fc.GetFilters()[n-1].GetName()
	}
	return "-"
}

func hcmDestination(a *anypb.Any) string {
	hcm, err := unmarshal(a, &hcmv3.HttpConnectionManager{})
	if err != nil {
		return "?"
	}
	if rds := hcm.GetRds(); rds != nil {
		return "Route: " + rds.GetRouteConfigName()
	}
	if rc := hcm.GetRouteConfig(); rc != nil {
		return "Inline Route: " + dash(rc.GetName())
	}
	return "HTTP"
}

func routeView(d *adminv3.ConfigDump) (table, any, error) {
	rd, err := section(d, &adminv3.RoutesConfigDump{})
	if err != nil {
		return table{}, nil, err
	}
	t := table{header: []string{"NAME", "VHOST", "DOMAINS", "MATCH", "DESTINATION"}}
	for _, dr := range rd.GetDynamicRouteConfigs() {
		rc, err := unmarshal(dr.GetRouteConfig(), &routev3.RouteConfiguration{})
		if err != nil {
			return table{}, nil, err
		}
		if len(rc.GetVirtualHosts()) == 0 {
			t.add(rc.GetName(), "-", "-", "-", "-")
		}
		for _, vh := range rc.GetVirtualHosts() {
			domains := "-"
			if ds := vh.GetDomains(); len(ds) > 0 {
				domains = ds[0]
				if len(ds) > 1 {
					domains += fmt.Sprintf(" +%d more", len(ds)-1)
				}
			}
			for _, r := range vh.GetRoutes() {
				t.add(rc.GetName(), vh.GetName(), domains, routeMatch(r.GetMatch()), routeDestination(r))
			}
		}
	}
	data, err := raw(rd)
	return t, data, err
}

func routeMatch(m *routev3.RouteMatch) string {
	var s string
	switch {
	case m.GetPrefix() != "" || m.GetPathSpecifier() == nil:
		s = dash(m.GetPrefix()) + "*"
	case m.GetPath() != "":
		s = m.GetPath()
	case m.GetSafeRegex() != nil:
		s = "regex " + m.GetSafeRegex().GetRegex()
	case m.GetPathSeparatedPrefix() != "":
		s = m.GetPathSeparatedPrefix() + "/*"
	default:
		s = "path template"
	}
	for _, h := range m.GetHeaders() {
		s += " [" + h.GetName() + "]"
	}
	return s
}

func routeDestination(r *routev3.Route) string {
	switch a := r.GetAction().(type) {
	case *routev3.Route_Route:
		if c := a.Route.GetCluster(); c != "" {
			return c
		}
		var ws []string
		for _, w := range a.Route.GetWeightedClusters().GetClusters() {
			ws = append(ws, w.GetName()+" "+strconv.FormatUint(uint64(w.GetWeight().GetValue()), 10))
		}
		if len(ws) > 0 {
			return strings.Join(ws, ", ")
		}
		return "-"
	case *routev3.Route_Redirect:
		return "redirect"
	case *routev3.Route_DirectResponse:
		return "direct response " + strconv.FormatUint(uint64(a.DirectResponse.GetStatus()), 10)
	case *routev3.Route_NonForwardingAction:
		return "non-forwarding (gRPC server)"
	}
	return "-"
}

func endpointView(d *adminv3.ConfigDump) (table, any, error) {
	ed, err := section(d, &adminv3.EndpointsConfigDump{})
	if err != nil {
		return table{}, nil, err
	}
	t := table{header: []string{"ENDPOINT", "STATUS", "LOCALITY", "PRIORITY", "CLUSTER"}}
	for _, de := range ed.GetDynamicEndpointConfigs() {
		cla, err := unmarshal(de.GetEndpointConfig(), &endpointv3.ClusterLoadAssignment{})
		if err != nil {
			return table{}, nil, err
		}
		for _, lep := range cla.GetEndpoints() {
			loc := lep.GetLocality()
			locality := dash(strings.Trim(strings.Join([]string{loc.GetRegion(), loc.GetZone(), loc.GetSubZone()}, "/"), "/"))
			for _, ep := range lep.GetLbEndpoints() {
				sa := ep.GetEndpoint().GetAddress().GetSocketAddress()
				addr := sa.GetAddress() + ":" + strconv.FormatUint(uint64(sa.GetPortValue()), 10)
				if p := ep.GetEndpoint().GetAddress().GetPipe(); p != nil {
					addr = "unix://" + p.GetPath()
				}
				t.add(addr, ep.GetHealthStatus().String(), locality, strconv.FormatUint(uint64(lep.GetPriority()), 10), cla.GetClusterName())
			}
		}
	}
	data, err := raw(ed)
	return t, data, err
}

// secretRef is a certificate or root the configuration names, and where the proxy gets it.
type secretRef struct {
	Name   string   `json:"name"`
	Kind   string   `json:"kind"`
	Source string   `json:"source"`
	UsedBy []string `json:"usedBy,omitempty"`
}

// Where a proxy gets what its configuration names.
const (
	sourceSent     = "sent by xds-server (key redacted)"
	sourceSDS      = "SDS (the workload's agent)"
	sourceProvider = "certificate provider (gRPC bootstrap)"
)

func secretView(d *adminv3.ConfigDump) (table, any, error) {
	refs := map[string]*secretRef{}
	add := func(name, kind, source, user string) {
		key := source + "\x00" + kind + "\x00" + name
		r := refs[key]
		if r == nil {
			r = &secretRef{Name: name, Kind: kind, Source: source}
			refs[key] = r
		}
		if user != "" && !slices.Contains(r.UsedBy, user) {
			r.UsedBy = append(r.UsedBy, user)
		}
	}
	sd, err := section(d, &adminv3.SecretsConfigDump{})
	if err != nil {
		return table{}, nil, err
	}
	for _, s := range sd.GetDynamicActiveSecrets() {
		sec, err := unmarshal(s.GetSecret(), &tlsv3.Secret{})
		if err != nil {
			return table{}, nil, err
		}
		kind := "certificate"
		if sec.GetValidationContext() != nil {
			kind = "root"
		}
		add(s.GetName(), kind, sourceSent, "")
	}
	cd, err := section(d, &adminv3.ClustersConfigDump{})
	if err != nil {
		return table{}, nil, err
	}
	for _, dc := range cd.GetDynamicActiveClusters() {
		c, err := unmarshal(dc.GetCluster(), &clusterv3.Cluster{})
		if err != nil {
			return table{}, nil, err
		}
		sockets := []*corev3.TransportSocket{c.GetTransportSocket()}
		for _, m := range c.GetTransportSocketMatches() {
			sockets = append(sockets, m.GetTransportSocket())
		}
		for _, ts := range sockets {
			tlsRefs(ts, "cluster "+c.GetName(), add)
		}
	}
	ld, err := section(d, &adminv3.ListenersConfigDump{})
	if err != nil {
		return table{}, nil, err
	}
	for _, dl := range ld.GetDynamicListeners() {
		l, err := unmarshal(dl.GetActiveState().GetListener(), &listenerv3.Listener{})
		if err != nil {
			return table{}, nil, err
		}
		for _, fc := range append(slices.Clip(l.GetFilterChains()), l.GetDefaultFilterChain()) {
			tlsRefs(fc.GetTransportSocket(), "listener "+l.GetName(), add)
		}
	}
	keys := slices.Sorted(maps.Keys(refs))
	t := table{header: []string{"NAME", "KIND", "SOURCE", "USED BY"}}
	var data []secretRef
	for _, k := range keys {
		r := refs[k]
		used := "-"
		if len(r.UsedBy) > 0 {
			used = r.UsedBy[0]
			if len(r.UsedBy) > 1 {
				used += fmt.Sprintf(" +%d more", len(r.UsedBy)-1)
			}
		}
		t.add(r.Name, r.Kind, r.Source, used)
		data = append(data, *r)
	}
	return t, data, nil
}

// tlsRefs reports the certificates and roots a TLS transport socket names.
func tlsRefs(ts *corev3.TransportSocket, user string, add func(name, kind, source, user string)) {
	a := ts.GetTypedConfig()
	var common *tlsv3.CommonTlsContext
	switch {
	case a.MessageIs(&tlsv3.UpstreamTlsContext{}):
		c, err := unmarshal(a, &tlsv3.UpstreamTlsContext{})
		if err != nil {
			return
		}
		common = c.GetCommonTlsContext()
	case a.MessageIs(&tlsv3.DownstreamTlsContext{}):
		c, err := unmarshal(a, &tlsv3.DownstreamTlsContext{})
		if err != nil {
			return
		}
		common = c.GetCommonTlsContext()
	default:
		return
	}
	for _, s := range common.GetTlsCertificateSdsSecretConfigs() {
		add(s.GetName(), "certificate", sourceSDS, user)
	}
	if p := common.GetTlsCertificateProviderInstance(); p != nil {
		add(p.GetInstanceName(), "certificate", sourceProvider, user)
	}
	if s := common.GetValidationContextSdsSecretConfig(); s != nil {
		add(s.GetName(), "root", sourceSDS, user)
	}
	cvc := common.GetCombinedValidationContext()
	if s := cvc.GetValidationContextSdsSecretConfig(); s != nil {
		add(s.GetName(), "root", sourceSDS, user)
	}
	for _, vc := range []*tlsv3.CertificateValidationContext{common.GetValidationContext(), cvc.GetDefaultValidationContext()} {
		if p := vc.GetCaCertificateProviderInstance(); p != nil {
			add(p.GetInstanceName(), "root", sourceProvider, user)
		}
	}
}

// allView prints every section's table; -o yaml|json the whole dump.
func allView(d *adminv3.ConfigDump) (table, any, error) {
	t := table{header: []string{"SECTION", "NAME", "DETAIL"}}
	for _, v := range []struct {
		name string
		view configView
	}{{"cluster", clusterView}, {"listener", listenerView}, {"route", routeView}, {"endpoint", endpointView}, {"secret", secretView}} {
		sub, _, err := v.view(d)
		if err != nil {
			return table{}, nil, err
		}
		for _, r := range sub.rows {
			t.add(v.name, r[0], strings.Join(r[1:], "  "))
		}
	}
	b, err := protoValue(d)
	if err != nil {
		return table{}, nil, fmt.Errorf("encoding as JSON: %w", err)
	}
	return t, json.RawMessage(b), nil
}
