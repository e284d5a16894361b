package xdsdiff

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
)

// Noise: properties left out of the comparison because they do not change where or how traffic
// flows (telemetry, names of generated internals, references that are followed instead).
var (
	// noiseNames are dropped wherever a field of that name appears.
	noiseNames = map[protoreflect.Name]bool{
		"stat_prefix": true, "alt_stat_name": true, "shadow_rules_stat_prefix": true, "access_log": true, "access_log_options": true,
	}
	// noiseFields are dropped in the one message that has them.
	noiseFields = map[protoreflect.FullName]bool{
		// Keys, or names of generated internals.
		"envoy.config.cluster.v3.Cluster.name":                      true,
		"envoy.config.listener.v3.Listener.name":                    true,
		"envoy.config.listener.v3.FilterChain.name":                 true,
		"envoy.config.route.v3.RouteConfiguration.name":             true,
		"envoy.config.route.v3.Route.name":                          true,
		"envoy.config.cluster.v3.Cluster.TransportSocketMatch.name": true,
		"envoy.config.core.v3.TransportSocket.name":                 true,
		// Followed references: compared as the resource they point to.
		"envoy.config.cluster.v3.Cluster.eds_cluster_config":                                             true,
		"envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager.rds":          true,
		"envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager.route_config": true,
		// Telemetry and metadata.
		"envoy.config.cluster.v3.Cluster.metadata":                                                  true,
		"envoy.config.cluster.v3.Cluster.track_cluster_stats":                                       true,
		"envoy.config.listener.v3.Listener.metadata":                                                true,
		"envoy.config.listener.v3.FilterChain.metadata":                                             true,
		"envoy.config.route.v3.Route.metadata":                                                      true,
		"envoy.config.route.v3.Route.decorator":                                                     true,
		"envoy.config.route.v3.Route.tracing":                                                       true,
		"envoy.config.route.v3.VirtualHost.metadata":                                                true,
		"envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager.tracing": true,
	}
	// telemetryFilters are network, HTTP and upstream filters left out of filter lists (and of
	// typed_per_filter_config): Istio's stats and peer metadata exchange.
	telemetryFilters = map[string]bool{
		"istio.stats": true, "istio.metadata_exchange": true, "envoy.filters.http.grpc_stats": true,
		"istio.peer_metadata": true, "upstream_hbone_peer_metadata": true,
		"waypoint_downstream_peer_metadata": true, "waypoint_upstream_peer_metadata": true,
	}
)

// listRules says how the items of a repeated message field are identified. Lists not named here
// keep their order and are keyed by index; lists of plain values are one leaf.
type listRule struct {
	key     protoreflect.Name // the field identifying an item, shown in its key rather than in it; "" = the whole item
	ordered bool              // Envoy honours the order (first match wins, filters run in sequence)
}

var listRules = map[protoreflect.FullName]listRule{
	"envoy.config.listener.v3.Listener.filter_chains":                                                      {key: "filter_chain_match"},
	"envoy.config.listener.v3.Listener.listener_filters":                                                   {key: "name", ordered: true},
	"envoy.config.listener.v3.FilterChain.filters":                                                         {key: "name", ordered: true},
	"envoy.config.cluster.v3.Cluster.filters":                                                              {key: "name", ordered: true},
	"envoy.config.cluster.v3.Cluster.transport_socket_matches":                                             {key: "match", ordered: true},
	"envoy.config.cluster.v3.CircuitBreakers.thresholds":                                                   {key: "priority"},
	"envoy.config.route.v3.RouteConfiguration.virtual_hosts":                                               {key: "name"},
	"envoy.config.route.v3.VirtualHost.routes":                                                             {key: "match", ordered: true},
	"envoy.config.route.v3.WeightedCluster.clusters":                                                       {key: "name"},
	"envoy.config.route.v3.RouteAction.request_mirror_policies":                                            {key: "cluster"},
	"envoy.config.route.v3.RouteMatch.headers":                                                             {key: "name"},
	"envoy.config.route.v3.RouteMatch.query_parameters":                                                    {key: "name"},
	"envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy.WeightedCluster.clusters":                      {key: "name"},
	"envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager.http_filters":       {key: "name", ordered: true},
	"envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager.upgrade_configs":    {key: "upgrade_type"},
	"envoy.extensions.transport_sockets.tls.v3.CertificateValidationContext.match_subject_alt_names":       {},
	"envoy.extensions.transport_sockets.tls.v3.CertificateValidationContext.match_typed_subject_alt_names": {},
}

// unorderedValues are lists of plain values that are sets to Envoy: compared sorted.
var unorderedValues = map[protoreflect.FullName]bool{
	"envoy.config.route.v3.VirtualHost.domains":                             true,
	"envoy.config.listener.v3.FilterChainMatch.server_names":                true,
	"envoy.config.listener.v3.FilterChainMatch.application_protocols":       true,
	"envoy.config.listener.v3.FilterChainMatch.prefix_ranges":               true,
	"envoy.config.listener.v3.FilterChainMatch.source_prefix_ranges":        true,
	"envoy.config.listener.v3.FilterChainMatch.direct_source_prefix_ranges": true,
	"envoy.config.listener.v3.FilterChainMatch.source_ports":                true,
}

// statedDefaults are fields whose value, when it is Envoy's default, means what leaving them out
// means: stated or not, they compare equal. "{}" is an empty message.
var statedDefaults = map[protoreflect.FullName]string{
	"envoy.config.route.v3.RouteMatch.case_sensitive":                                                         "true",
	"envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext.require_client_certificate":               "false",
	"envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager.http_protocol_options": "{}",
}

// commaSets are strings Envoy reads as comma-separated sets: compared sorted.
var commaSets = map[protoreflect.FullName]bool{
	"envoy.config.route.v3.RetryPolicy.retry_on":                      true,
	"envoy.extensions.filters.http.cors.v3.CorsPolicy.allow_methods":  true,
	"envoy.extensions.filters.http.cors.v3.CorsPolicy.allow_headers":  true,
	"envoy.extensions.filters.http.cors.v3.CorsPolicy.expose_headers": true,
}

// chainMatchAlias shortens filter chain match fields in keys: filter_chains[port=80 sni=a.com].
var chainMatchAlias = map[string]string{
	"destination_port": "port", "server_names": "sni", "transport_protocol": "transport",
	"application_protocols": "alpn", "prefix_ranges": "ip", "source_prefix_ranges": "src",
	"direct_source_prefix_ranges": "dsrc", "source_type": "srctype", "source_ports": "srcport",
}

const rawBufferType = "type.googleapis.com/envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer"

// routeRef is how an HTTP connection manager names its route configuration.
type routeRef struct {
	rds    string // RDS name, or
	inline *routev3.RouteConfiguration
}

// projector turns messages into trees. While projecting listeners it records, by the path of
// each HTTP connection manager, the route configuration it uses (refs).
type projector struct {
	refs map[string]routeRef
}

func (p *projector) project(path string, msg proto.Message) any {
	return p.message(path, msg.ProtoReflect())
}

func (p *projector) message(path string, m protoreflect.Message) any {
	switch v := m.Interface().(type) {
	case *anypb.Any:
		return p.any(path, v)
	case *durationpb.Duration:
		return v.AsDuration().String()
	case *structpb.Struct:
		return plain(v.AsMap())
	case *structpb.Value:
		return plain(v.AsInterface())
	case *structpb.ListValue:
		return plain(v.AsSlice())
	case *corev3.Address:
		return address(v)
	case *corev3.CidrRange:
		return fmt.Sprintf("%s/%d", v.GetAddressPrefix(), v.GetPrefixLen().GetValue())
	case *endpointv3.ClusterLoadAssignment:
		return p.endpoints(path, v)
	case *corev3.TransportSocket:
		// Plain TCP is what Envoy does without a transport socket: the same config.
		if v.GetTypedConfig().GetTypeUrl() == rawBufferType {
			return nil
		}
	case *hcmv3.HttpConnectionManager:
		if p.refs != nil {
			p.refs[path] = routeRef{rds: v.GetRds().GetRouteConfigName(), inline: v.GetRouteConfig()}
		}
	}
	if isWrapper(m.Descriptor().FullName()) {
		fd := m.Descriptor().Fields().ByName("value")
		return scalar(fd, m.Get(fd))
	}
	out := fields{}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if noiseNames[fd.Name()] || noiseFields[fd.FullName()] {
			return true
		}
		name := string(fd.Name())
		sub := join(path, name)
		if name == "typed_config" {
			sub = path // merged into this message, below
		}
		x := p.field(sub, fd, v)
		if x == nil || isStatedDefault(fd, x) {
			return true
		}
		// A typed config is shown as properties of what it configures:
		// filters[tcp_proxy].cluster rather than filters[tcp_proxy].typed_config.cluster.
		if inner, ok := x.(fields); ok && name == "typed_config" {
			for k, v := range inner {
				out[k] = v
			}
			return true
		}
		out[name] = x
		return true
	})
	return out
}

func (p *projector) field(path string, fd protoreflect.FieldDescriptor, v protoreflect.Value) any {
	switch {
	case fd.IsMap():
		out := keyed{}
		v.Map().Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
			key := k.String()
			if fd.Name() == "typed_per_filter_config" { // keyed by filter name
				if telemetryFilters[key] {
					return true
				}
				key = shortName(key)
			}
			if x := p.value(path+"["+key+"]", fd.MapValue(), v); x != nil {
				out[key] = x
			}
			return true
		})
		if len(out) == 0 {
			return nil // only telemetry filters' configs
		}
		return out
	case fd.IsList():
		return p.list(path, fd, v.List())
	}
	return p.value(path, fd, v)
}

func (p *projector) value(path string, fd protoreflect.FieldDescriptor, v protoreflect.Value) any {
	if fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind {
		return p.message(path, v.Message())
	}
	return scalar(fd, v)
}

func (p *projector) list(path string, fd protoreflect.FieldDescriptor, l protoreflect.List) any {
	rule, ruled := listRules[fd.FullName()]
	isMsg := fd.Kind() == protoreflect.MessageKind
	if !ruled {
		rule.ordered = true
	}
	o := &ordered{}
	var leaves []string
	for i := range l.Len() {
		v := l.Get(i)
		key := strconv.Itoa(i)
		if isMsg {
			if n := nameOf(v.Message()); n != "" && telemetryFilters[n] {
				continue
			}
			if ruled {
				key = itemKey(rule.key, v.Message())
			}
		}
		x := p.value(path+"["+key+"]", fd, v)
		if x == nil {
			continue
		}
		if f, ok := x.(fields); ok && rule.key != "" {
			delete(f, string(rule.key))
		}
		if s, ok := x.(string); ok && !ruled {
			leaves = append(leaves, s)
			continue
		}
		o.add(key, x)
	}
	if leaves != nil {
		// Plain values (or messages shown as one value, like CIDR ranges) make one leaf.
		if unorderedValues[fd.FullName()] {
			slices.Sort(leaves)
		}
		return strings.Join(leaves, ",")
	}
	switch {
	case len(o.keys) == 0:
		return nil // only telemetry filters: as if there were none
	case rule.ordered:
		return o
	}
	return keyed(o.items)
}

// any decodes an Any with the global registry. A type this binary does not know is compared
// by type URL and a hash of its bytes, and says so.
func (p *projector) any(path string, a *anypb.Any) any {
	m, err := a.UnmarshalNew()
	if err != nil {
		sum := sha256.Sum256(a.GetValue())
		what := "undecodable"
		if errors.Is(err, protoregistry.NotFound) {
			what = "unregistered type"
		}
		return fmt.Sprintf("<%s %s sha256:%s>", what, a.GetTypeUrl(), hex.EncodeToString(sum[:6]))
	}
	typ := string(m.ProtoReflect().Descriptor().FullName())
	var x any
	if ts, ok := m.(typedStruct); ok {
		// A TypedStruct is a config in JSON form: Envoy reads it as the message it names, and
		// so is it compared (as its JSON when that message is not registered here).
		typ = ts.GetTypeUrl()[strings.LastIndex(ts.GetTypeUrl(), "/")+1:]
		if mt, err := protoregistry.GlobalTypes.FindMessageByURL(ts.GetTypeUrl()); err == nil {
			msg := mt.New().Interface()
			if js, err := protojson.Marshal(ts.GetValue()); err == nil && protojson.Unmarshal(js, msg) == nil {
				x = p.project(path, msg)
			}
		}
		if x == nil {
			x = plain(ts.GetValue().AsMap())
		}
	} else {
		x = p.project(path, m)
	}
	if f, ok := x.(fields); ok {
		f["@type"] = typ
	}
	return x
}

// typedStruct is udpa.type.v1.TypedStruct or xds.type.v3.TypedStruct.
type typedStruct interface {
	GetTypeUrl() string
	GetValue() *structpb.Struct
}

// endpoints flattens a load assignment into its endpoints by address: what a request can reach
// and with which weight, locality, health and mTLS mode. Envoy's defaults are left out, so that
// stating them equals not: an empty locality, weight 1, health UNKNOWN or HEALTHY (Envoy
// routes to both).
func (p *projector) endpoints(path string, cla *endpointv3.ClusterLoadAssignment) any {
	eps := keyed{}
	for _, loc := range cla.GetEndpoints() {
		for _, lb := range loc.GetLbEndpoints() {
			ep := fields{}
			if l := loc.GetLocality(); l.GetRegion()+l.GetZone()+l.GetSubZone() != "" {
				ep["locality"] = l.GetRegion() + "/" + l.GetZone() + "/" + l.GetSubZone()
			}
			setNum(ep, "priority", uint64(loc.GetPriority()))
			setNum(ep, "locality_weight", uint64(loc.GetLoadBalancingWeight().GetValue()))
			if w := lb.GetLoadBalancingWeight().GetValue(); w > 1 {
				setNum(ep, "weight", uint64(w))
			}
			if h := lb.GetHealthStatus(); h != corev3.HealthStatus_UNKNOWN && h != corev3.HealthStatus_HEALTHY {
				ep["health_status"] = h.String()
			}
			if h := lb.GetEndpoint().GetHostname(); h != "" {
				ep["hostname"] = h
			}
			tm := lb.GetMetadata().GetFilterMetadata()["envoy.transport_socket_match"]
			if v := tm.GetFields()["tlsMode"].GetStringValue(); v != "" {
				ep["tls_mode"] = v
			}
			key := absent
			if lb.GetEndpoint() != nil {
				key = address(lb.GetEndpoint().GetAddress())
			} else if lb.GetEndpointName() != "" {
				key = "named:" + lb.GetEndpointName()
			}
			addKeyed(eps, key, ep)
		}
	}
	out := fields{"endpoints": eps}
	if cla.GetPolicy() != nil {
		out["policy"] = p.project(join(path, "policy"), cla.GetPolicy())
	}
	return out
}

func setNum(f fields, name string, n uint64) {
	if n != 0 {
		f[name] = strconv.FormatUint(n, 10)
	}
}

func address(a *corev3.Address) string {
	switch {
	case a.GetSocketAddress() != nil:
		s := a.GetSocketAddress()
		out := s.GetAddress() + ":" + strconv.Itoa(int(s.GetPortValue()))
		if s.GetNamedPort() != "" {
			out = s.GetAddress() + ":" + s.GetNamedPort()
		}
		if s.GetProtocol() == corev3.SocketAddress_UDP {
			out += "/udp"
		}
		return out
	case a.GetPipe() != nil:
		return "pipe:" + a.GetPipe().GetPath()
	case a.GetEnvoyInternalAddress() != nil:
		return "internal:" + a.GetEnvoyInternalAddress().GetServerListenerName()
	}
	return absent
}

// Keys of list items.

// itemKey identifies a list item by one of its fields (all of it when field is ""), as text.
func itemKey(field protoreflect.Name, m protoreflect.Message) string {
	if field == "" {
		return keyText((&projector{}).message("", m), nil)
	}
	fd := m.Descriptor().Fields().ByName(field)
	if fd.Kind() == protoreflect.MessageKind && !m.Has(fd) {
		return "*" // no match: matches everything
	}
	v := (&projector{}).field("", fd, m.Get(fd))
	if s, ok := v.(string); ok && field == "name" {
		return shortName(s)
	}
	var alias map[string]string
	if field == "filter_chain_match" {
		alias = chainMatchAlias
	}
	return keyText(v, alias)
}

// keyText renders a projected value as a key: leaves as name=value, space separated.
func keyText(v any, alias map[string]string) string {
	var parts []string
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch v := v.(type) {
		case string:
			if prefix == "" {
				parts = append(parts, v)
			} else {
				parts = append(parts, prefix+"="+v)
			}
		case fields:
			if len(v) == 0 && prefix != "" {
				parts = append(parts, prefix) // a set empty message, like a gRPC route match
			}
			for _, k := range unionKeys(v, nil) {
				name := k
				if a, ok := alias[k]; ok && prefix == "" {
					name = a
				}
				walk(join(prefix, name), v[k])
			}
		case keyed:
			for _, k := range unionKeys(v, nil) {
				walk(prefix+"["+k+"]", v[k])
			}
		case *ordered:
			for _, k := range v.keys {
				walk(prefix+"["+k+"]", v.items[k])
			}
		}
	}
	walk("", v)
	if len(parts) == 0 {
		return "*"
	}
	return strings.Join(parts, " ")
}

// nameOf is the "name" field of a filter-like message, or "".
func nameOf(m protoreflect.Message) string {
	fd := m.Descriptor().Fields().ByName("name")
	if fd == nil || fd.Kind() != protoreflect.StringKind || fd.IsList() {
		return ""
	}
	return m.Get(fd).String()
}

// shortName drops the envoy.filters.<kind>. prefix of well-known filter names.
func shortName(n string) string {
	for _, p := range []string{"envoy.filters.network.", "envoy.filters.http.", "envoy.filters.listener."} {
		if s, ok := strings.CutPrefix(n, p); ok {
			return s
		}
	}
	return n
}

func isWrapper(n protoreflect.FullName) bool {
	return n.Parent() == "google.protobuf" && strings.HasSuffix(string(n.Name()), "Value") &&
		n != "google.protobuf.Value" && n != "google.protobuf.ListValue"
}

func scalar(fd protoreflect.FieldDescriptor, v protoreflect.Value) any {
	switch fd.Kind() {
	case protoreflect.StringKind:
		if commaSets[fd.FullName()] {
			items := strings.Split(v.String(), ",")
			for i := range items {
				items[i] = strings.TrimSpace(items[i])
			}
			slices.Sort(items)
			return strings.Join(items, ",")
		}
	case protoreflect.EnumKind:
		if ev := fd.Enum().Values().ByNumber(v.Enum()); ev != nil {
			return string(ev.Name())
		}
		return strconv.Itoa(int(v.Enum()))
	case protoreflect.BytesKind:
		sum := sha256.Sum256(v.Bytes())
		return fmt.Sprintf("<%d bytes sha256:%s>", len(v.Bytes()), hex.EncodeToString(sum[:6]))
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		return strconv.FormatFloat(v.Float(), 'g', -1, 64)
	}
	return v.String()
}

func isStatedDefault(fd protoreflect.FieldDescriptor, x any) bool {
	d, ok := statedDefaults[fd.FullName()]
	if !ok {
		return false
	}
	if f, isMsg := x.(fields); isMsg {
		return d == "{}" && len(f) == 0
	}
	return x == d
}

// plain turns decoded JSON-like values (Struct) into a tree.
func plain(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := fields{}
		for k, x := range v {
			out[k] = plain(x)
		}
		return out
	case []any:
		o := &ordered{}
		for i, x := range v {
			o.add(strconv.Itoa(i), plain(x))
		}
		return o
	case nil:
		return "null"
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64)
	}
	return fmt.Sprint(v)
}
