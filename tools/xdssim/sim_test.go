package xdssim

import (
	"errors"
	"net/http"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"sailplane.dev/tools/xdsdiff"
)

func mustAny(t testing.TB, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func snapshotOf(t testing.TB, ms ...proto.Message) xdsdiff.Snapshot {
	t.Helper()
	s := xdsdiff.Snapshot{}
	for _, m := range ms {
		a := mustAny(t, m)
		s[a.TypeUrl] = append(s[a.TypeUrl], a)
	}
	return s
}

func simOf(t testing.TB, ms ...proto.Message) *Simulator {
	t.Helper()
	s, err := New(snapshotOf(t, ms...))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// httpListener is a listener on port 80 whose one chain runs an HCM with rc inline.
func httpListener(t testing.TB, rc *routev3.RouteConfiguration) *listenerv3.Listener {
	hcm := &hcmv3.HttpConnectionManager{RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: rc}}
	return &listenerv3.Listener{
		Name:    "http",
		Address: sockAddr("0.0.0.0", 80),
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
			Name: hcmName, ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(t, hcm)},
		}}}},
	}
}

func sockAddr(ip string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: ip, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port}}}}
}

func staticCluster(name string, addrs ...string) *clusterv3.Cluster {
	var eps []*endpointv3.LbEndpoint
	for _, a := range addrs {
		eps = append(eps, &endpointv3.LbEndpoint{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{
			Endpoint: &endpointv3.Endpoint{Address: sockAddr(a, 8080)}}})
	}
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		LoadAssignment:       &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: eps}}},
	}
}

func toCluster(name string) *routev3.Route_Route {
	return &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: name}}}
}

func prefixRoute(name, prefix, cluster string) *routev3.Route {
	return &routev3.Route{Name: name, Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: prefix}}, Action: toCluster(cluster)}
}

// TestVirtualHostOrder: exact beats every wildcard, a longer suffix wildcard beats a shorter
// one, a suffix wildcard beats a prefix wildcard, "*" comes last, wherever each is listed.
func TestVirtualHostOrder(t *testing.T) {
	vh := func(name string, domains ...string) *routev3.VirtualHost {
		return &routev3.VirtualHost{Name: name, Domains: domains, Routes: []*routev3.Route{prefixRoute("", "/", "c")}}
	}
	rc := &routev3.RouteConfiguration{Name: "rc", VirtualHosts: []*routev3.VirtualHost{
		vh("star", "*"),
		vh("prefix", "api.*"),
		vh("short-suffix", "*.com"),
		vh("long-suffix", "*.example.com"),
		vh("dash-suffix", "*-b.example.com"),
		vh("exact", "api.example.com"),
		vh("with-port", "api.example.org:8080"),
	}}
	tests := []struct{ host, want string }{
		{"api.example.com", "exact"},
		{"API.Example.Com", "exact"},
		{"x.example.com", "long-suffix"},
		{"a-b.example.com", "dash-suffix"},
		{"x.other.com", "short-suffix"},
		{"api.example.net", "prefix"},
		{"api.other.com", "short-suffix"}, // a suffix wildcard beats a prefix wildcard
		{"api.example.org:8080", "with-port"},
		{"api.example.org:9090", "prefix"},
		{"nothing.here", "star"},
		{"example.com", "short-suffix"},
	}
	sim := simOf(t, httpListener(t, rc), staticCluster("c", "127.0.0.1"))
	for _, tc := range tests {
		t.Run(tc.host, func(t *testing.T) {
			res, err := sim.Simulate(Request{Port: 80, Host: tc.host})
			if err != nil {
				t.Fatal(err)
			}
			if res.VirtualHost != tc.want {
				t.Errorf("host %q: virtual host %s, want %s", tc.host, res.VirtualHost, tc.want)
			}
		})
	}
	// ignore_port_in_host_matching drops the port before matching.
	rc.IgnorePortInHostMatching = true
	sim = simOf(t, httpListener(t, rc), staticCluster("c", "127.0.0.1"))
	if res, err := sim.Simulate(Request{Port: 80, Host: "api.example.com:8080"}); err != nil || res.VirtualHost != "exact" {
		t.Errorf("ignore_port_in_host_matching: %v, %v", res, err)
	}
}

func exactHeader(name, v string) *routev3.HeaderMatcher {
	return &routev3.HeaderMatcher{Name: name, HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{
		StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: v}}}}
}

func regexMatcher(re string) *matcherv3.RegexMatcher { return &matcherv3.RegexMatcher{Regex: re} }

// TestHeaderMatchers covers Envoy's HeaderMatcher semantics, missing headers included.
func TestHeaderMatchers(t *testing.T) {
	present := func(name string, p, invert bool) *routev3.HeaderMatcher {
		return &routev3.HeaderMatcher{Name: name, InvertMatch: invert, HeaderMatchSpecifier: &routev3.HeaderMatcher_PresentMatch{PresentMatch: p}}
	}
	inverted := func(m *routev3.HeaderMatcher) *routev3.HeaderMatcher { m.InvertMatch = true; return m }
	tests := []struct {
		name    string
		m       *routev3.HeaderMatcher
		headers http.Header
		want    bool
	}{
		{"exact hit", exactHeader("x-a", "1"), http.Header{"X-A": {"1"}}, true},
		{"exact miss", exactHeader("x-a", "1"), http.Header{"X-A": {"2"}}, false},
		{"exact is case-sensitive", exactHeader("x-a", "abc"), http.Header{"X-A": {"ABC"}}, false},
		{"missing header never matches a value", exactHeader("x-a", ""), nil, false},
		{"inverted value matcher on a missing header does not match", inverted(exactHeader("x-a", "1")), nil, false},
		{"inverted value miss matches", inverted(exactHeader("x-a", "1")), http.Header{"X-A": {"2"}}, true},
		{"present true, present", present("x-a", true, false), http.Header{"X-A": {""}}, true},
		{"present true, absent", present("x-a", true, false), nil, false},
		{"present false, absent", present("x-a", false, false), nil, true},
		{"present false, present", present("x-a", false, false), http.Header{"X-A": {"v"}}, false},
		{"inverted present true, absent", present("x-a", true, true), nil, true},
		{"inverted present true, present", present("x-a", true, true), http.Header{"X-A": {"v"}}, false},
		{"values joined by comma", exactHeader("x-a", "1,2"), http.Header{"X-A": {"1", "2"}}, true},
		{"regex is anchored", &routev3.HeaderMatcher{Name: "x-a", HeaderMatchSpecifier: &routev3.HeaderMatcher_SafeRegexMatch{
			SafeRegexMatch: regexMatcher("v[12]")}}, http.Header{"X-A": {"v12"}}, false},
		{"regex whole value", &routev3.HeaderMatcher{Name: "x-a", HeaderMatchSpecifier: &routev3.HeaderMatcher_SafeRegexMatch{
			SafeRegexMatch: regexMatcher("v[12]")}}, http.Header{"X-A": {"v2"}}, true},
		{"string prefix ignore case", &routev3.HeaderMatcher{Name: "x-a", HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{
			StringMatch: &matcherv3.StringMatcher{IgnoreCase: true, MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: "ab"}}}},
			http.Header{"X-A": {"ABC"}}, true},
		{"range", &routev3.HeaderMatcher{Name: "x-a", HeaderMatchSpecifier: &routev3.HeaderMatcher_RangeMatch{
			RangeMatch: &typeRange{Start: 10, End: 20}}}, http.Header{"X-A": {"20"}}, false},
		{"treat missing as empty", &routev3.HeaderMatcher{Name: "x-a", TreatMissingHeaderAsEmpty: true,
			HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{
				MatchPattern: &matcherv3.StringMatcher_Exact{Exact: ""}}}}, nil, true},
		{":method pseudo-header", exactHeader(":method", "GET"), nil, true},
		{":authority pseudo-header", exactHeader(":authority", "h"), nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rc := &routev3.RouteConfiguration{VirtualHosts: []*routev3.VirtualHost{{Name: "vh", Domains: []string{"*"}, Routes: []*routev3.Route{{
				Name:   "r",
				Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}, Headers: []*routev3.HeaderMatcher{tc.m}},
				Action: toCluster("c"),
			}}}}}
			_, err := simOf(t, httpListener(t, rc), staticCluster("c", "127.0.0.1")).Simulate(Request{Port: 80, Host: "h", Headers: tc.headers})
			if got := err == nil; got != tc.want {
				t.Errorf("matched = %v (err %v), want %v", got, err, tc.want)
			}
			if err != nil && !errors.Is(err, ErrNoRoute) {
				t.Errorf("err = %v, want ErrNoRoute", err)
			}
		})
	}
}

// TestPathMatch covers the path specifiers, case sensitivity and query parameters.
func TestPathMatch(t *testing.T) {
	m := func(rm *routev3.RouteMatch) *routev3.RouteMatch { return rm }
	f := wrapperspb.Bool(false)
	tests := []struct {
		name  string
		match *routev3.RouteMatch
		path  string
		want  bool
	}{
		{"prefix", m(&routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/api"}}), "/apix", true},
		{"prefix sees the query", m(&routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/a?x"}}), "/a?x=1", true},
		{"prefix case-sensitive", m(&routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/API"}}), "/api", false},
		{"prefix case-insensitive", m(&routev3.RouteMatch{CaseSensitive: f, PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/API"}}), "/api", true},
		{"path ignores the query", m(&routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Path{Path: "/a"}}), "/a?x=1", true},
		{"path exact", m(&routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Path{Path: "/a"}}), "/a/", false},
		{"path separated prefix equal", m(&routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_PathSeparatedPrefix{PathSeparatedPrefix: "/a"}}), "/a", true},
		{"path separated prefix segment", m(&routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_PathSeparatedPrefix{PathSeparatedPrefix: "/a"}}), "/a/b?c", true},
		{"path separated prefix not a segment", m(&routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_PathSeparatedPrefix{PathSeparatedPrefix: "/a"}}), "/ab", false},
		{"regex anchored, query removed", m(&routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_SafeRegex{SafeRegex: regexMatcher("/v[0-9]+")}}), "/v12?x", true},
		{"regex must match whole path", m(&routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_SafeRegex{SafeRegex: regexMatcher("/v[0-9]")}}), "/v12", false},
		{"query exact", m(&routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}, QueryParameters: []*routev3.QueryParameterMatcher{{
			Name: "q", QueryParameterMatchSpecifier: &routev3.QueryParameterMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{
				MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "a b"}}}}}}), "/?q=a%20b&q=c", true},
		{"query first value only", m(&routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}, QueryParameters: []*routev3.QueryParameterMatcher{{
			Name: "q", QueryParameterMatchSpecifier: &routev3.QueryParameterMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{
				MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "c"}}}}}}), "/?q=a&q=c", false},
		{"query present", m(&routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}, QueryParameters: []*routev3.QueryParameterMatcher{{
			Name: "q", QueryParameterMatchSpecifier: &routev3.QueryParameterMatcher_PresentMatch{PresentMatch: true}}}}), "/?q", true},
		{"query absent", m(&routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}, QueryParameters: []*routev3.QueryParameterMatcher{{
			Name: "q", QueryParameterMatchSpecifier: &routev3.QueryParameterMatcher_PresentMatch{PresentMatch: true}}}}), "/?r=1", false},
		{"grpc needs the content type", m(&routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}, Grpc: &routev3.RouteMatch_GrpcRouteMatchOptions{}}), "/pkg.S/M", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rc := &routev3.RouteConfiguration{VirtualHosts: []*routev3.VirtualHost{{Name: "vh", Domains: []string{"*"}, Routes: []*routev3.Route{{
				Name: "r", Match: tc.match, Action: toCluster("c")}}}}}
			_, err := simOf(t, httpListener(t, rc), staticCluster("c", "127.0.0.1")).Simulate(Request{Port: 80, Host: "h", Path: tc.path})
			if got := err == nil; got != tc.want {
				t.Errorf("%s: matched = %v (err %v), want %v", tc.path, got, err, tc.want)
			}
		})
	}
	// A gRPC request carries the content type the grpc match needs.
	rc := &routev3.RouteConfiguration{VirtualHosts: []*routev3.VirtualHost{{Name: "vh", Domains: []string{"*"}, Routes: []*routev3.Route{{
		Name: "r", Match: tests[len(tests)-1].match, Action: toCluster("c")}}}}}
	if _, err := simOf(t, httpListener(t, rc), staticCluster("c", "127.0.0.1")).Simulate(Request{Port: 80, Host: "h", Protocol: GRPC, Path: "/pkg.S/M"}); err != nil {
		t.Errorf("gRPC request: %v", err)
	}
}

// TestWeightedPick: Pick walks the weights in order, modulo the total.
func TestWeightedPick(t *testing.T) {
	ws := []weighted{{"a", 1}, {"b", 0}, {"c", 3}}
	for pick, want := range map[uint64]string{0: "a", 1: "c", 3: "c", 4: "a", 5: "c"} {
		if got := pickWeighted(ws, pick); got != want {
			t.Errorf("pick %d: %s, want %s", pick, got, want)
		}
	}
	if got := pickWeighted([]weighted{{"a", 0}}, 7); got != "" {
		t.Errorf("all zero: %q, want none", got)
	}
	// Sweeping every pick reproduces the weights.
	counts := map[string]int{}
	for p := range uint64(40) {
		counts[pickWeighted(ws, p)]++
	}
	if counts["a"] != 10 || counts["c"] != 30 || counts["b"] != 0 {
		t.Errorf("distribution %v, want a:10 c:30", counts)
	}
}

type typeRange = typev3.Int64Range

// TestFilterChainMatch: destination port, then IP, then server name, transport protocol and
// ALPN, each narrowing the candidates; a later criterion never falls back to chains an
// earlier one discarded.
func TestFilterChainMatch(t *testing.T) {
	chain := func(name string, m *listenerv3.FilterChainMatch, cluster string) *listenerv3.FilterChain {
		tp := &tcpv3.TcpProxy{StatPrefix: name, ClusterSpecifier: &tcpv3.TcpProxy_Cluster{Cluster: cluster}}
		return &listenerv3.FilterChain{Name: name, FilterChainMatch: m, Filters: []*listenerv3.Filter{{
			Name: tcpProxyName, ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(t, tp)}}}}
	}
	cidr := func(ip string, bits uint32) []*corev3.CidrRange {
		return []*corev3.CidrRange{{AddressPrefix: ip, PrefixLen: wrapperspb.UInt32(bits)}}
	}
	tlsInspector := &listenerv3.ListenerFilter{Name: "envoy.filters.listener.tls_inspector"}
	l := &listenerv3.Listener{
		Name:            "l",
		Address:         sockAddr("0.0.0.0", 443),
		ListenerFilters: []*listenerv3.ListenerFilter{tlsInspector},
		FilterChains: []*listenerv3.FilterChain{
			chain("port-8443", &listenerv3.FilterChainMatch{DestinationPort: wrapperspb.UInt32(8443)}, "c"),
			chain("wide-ip", &listenerv3.FilterChainMatch{PrefixRanges: cidr("10.0.0.0", 8)}, "c"),
			chain("narrow-ip", &listenerv3.FilterChainMatch{PrefixRanges: cidr("10.1.0.0", 16), ServerNames: []string{"a.example.com"}}, "c"),
			chain("exact-sni", &listenerv3.FilterChainMatch{ServerNames: []string{"a.example.com"}}, "c"),
			chain("wild-sni", &listenerv3.FilterChainMatch{ServerNames: []string{"*.example.com"}}, "c"),
			chain("wilder-sni", &listenerv3.FilterChainMatch{ServerNames: []string{"*.com"}}, "c"),
			chain("tls-h2", &listenerv3.FilterChainMatch{TransportProtocol: "tls", ApplicationProtocols: []string{"h2"}}, "c"),
			chain("tls", &listenerv3.FilterChainMatch{TransportProtocol: "tls"}, "c"),
			chain("raw", &listenerv3.FilterChainMatch{TransportProtocol: "raw_buffer"}, "c"),
		},
	}
	sim := simOf(t, l, staticCluster("c", "127.0.0.1"))
	tests := []struct {
		name string
		req  Request
		want string // chain, or "" for no chain
	}{
		{"destination port first", Request{Port: 443, ListenerPort: 443, DestinationIP: "10.1.2.3", TLS: true, SNI: "a.example.com"}, "narrow-ip"},
		{"longest prefix range", Request{Port: 443, DestinationIP: "10.1.2.3", TLS: true, SNI: "b.example.com"}, ""},
		{"wide range when the narrow one misses", Request{Port: 443, DestinationIP: "10.2.0.1", TLS: true, SNI: "a.example.com"}, "wide-ip"},
		{"exact SNI", Request{Port: 443, DestinationIP: "192.0.2.1", TLS: true, SNI: "a.example.com"}, "exact-sni"},
		{"longest wildcard SNI", Request{Port: 443, DestinationIP: "192.0.2.1", TLS: true, SNI: "x.y.example.com"}, "wild-sni"},
		{"shorter wildcard SNI", Request{Port: 443, DestinationIP: "192.0.2.1", TLS: true, SNI: "x.org.com"}, "wilder-sni"},
		{"ALPN", Request{Port: 443, DestinationIP: "192.0.2.1", TLS: true, SNI: "x.net", Protocol: HTTP2}, "tls-h2"},
		{"TLS without matching ALPN", Request{Port: 443, DestinationIP: "192.0.2.1", TLS: true, SNI: "x.net"}, "tls"},
		{"plaintext", Request{Port: 443, DestinationIP: "192.0.2.1", Protocol: TCP}, "raw"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.req.Protocol == "" {
				tc.req.Protocol = TCP
			}
			res, err := sim.Simulate(tc.req)
			if tc.want == "" {
				if !errors.Is(err, ErrNoFilterChain) {
					t.Fatalf("got %v, %v; want ErrNoFilterChain", res, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.FilterChain != tc.want {
				t.Errorf("chain %s, want %s", res.FilterChain, tc.want)
			}
		})
	}
	// The destination port criterion: a chain for 8443 takes the connection over every other.
	l.Address = sockAddr("0.0.0.0", 8443)
	sim = simOf(t, l, staticCluster("c", "127.0.0.1"))
	if res, err := sim.Simulate(Request{Port: 8443, Protocol: TCP, TLS: true, SNI: "a.example.com"}); err != nil || res.FilterChain != "port-8443" {
		t.Errorf("port 8443: %v, %v", res, err)
	}
	// Without a TLS inspector the server name is unknown: only chains without names match.
	l.ListenerFilters = nil
	sim = simOf(t, l, staticCluster("c", "127.0.0.1"))
	if res, err := sim.Simulate(Request{Port: 8443, ListenerPort: 8443, Protocol: TCP, TLS: true, SNI: "a.example.com"}); err != nil || res.FilterChain != "port-8443" {
		t.Errorf("no inspector: %v, %v", res, err)
	}
}

// TestErrors: each failure has its own kind and Envoy's status and flag.
func TestErrors(t *testing.T) {
	rc := &routev3.RouteConfiguration{Name: "rc", VirtualHosts: []*routev3.VirtualHost{{Name: "vh", Domains: []string{"h"}, Routes: []*routev3.Route{
		prefixRoute("missing", "/missing", "nope"),
		prefixRoute("empty", "/empty", "empty"),
		prefixRoute("eds", "/eds", "eds"),
		prefixRoute("ok", "/ok", "c"),
	}}}}
	unhealthy := staticCluster("empty", "127.0.0.2")
	unhealthy.LoadAssignment.Endpoints[0].LbEndpoints[0].HealthStatus = corev3.HealthStatus_UNHEALTHY
	eds := &clusterv3.Cluster{Name: "eds", ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{ServiceName: "eds-svc"}}
	tlsL := httpListener(t, rc)
	tlsL.Name, tlsL.Address = "tls", sockAddr("0.0.0.0", 443)
	tlsL.FilterChains[0].TransportSocket = &corev3.TransportSocket{Name: tlsSocket, ConfigType: &corev3.TransportSocket_TypedConfig{
		TypedConfig: mustAny(t, &tlsv3.DownstreamTlsContext{})}}
	sim := simOf(t, httpListener(t, rc), tlsL, staticCluster("c", "127.0.0.1"), unhealthy, eds)
	tests := []struct {
		name   string
		req    Request
		want   error
		status int
		flag   string
	}{
		{"no listener", Request{Port: 81, Host: "h"}, ErrNoListener, 0, ""},
		{"no virtual host", Request{Port: 80, Host: "x"}, ErrNoVirtualHost, 404, "NR"},
		{"no route", Request{Port: 80, Host: "h", Path: "/other"}, ErrNoRoute, 404, "NR"},
		{"cluster not found", Request{Port: 80, Host: "h", Path: "/missing"}, ErrClusterNotFound, 503, "NC"},
		{"no healthy endpoint", Request{Port: 80, Host: "h", Path: "/empty"}, ErrNoHealthyUpstream, 503, "UH"},
		{"no endpoints sent", Request{Port: 80, Host: "h", Path: "/eds"}, ErrNoHealthyUpstream, 503, "UH"},
		{"plaintext to TLS", Request{Port: 443, Host: "h", Path: "/ok"}, ErrTLSMismatch, 0, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sim.Simulate(tc.req)
			var e *Error
			if !errors.Is(err, tc.want) || !errors.As(err, &e) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			for _, other := range sentinels {
				if other != tc.want && errors.Is(err, other) {
					t.Errorf("err %v is also %v", err, other)
				}
			}
			if e.Status != tc.status || e.Flag != tc.flag {
				t.Errorf("status %d %s, want %d %s", e.Status, e.Flag, tc.status, tc.flag)
			}
			if r := ErrorResponse(err); (r != nil) != (tc.status != 0) || (r != nil && r.StatusCode != tc.status) {
				t.Errorf("ErrorResponse = %v", r)
			}
		})
	}
	if res, err := sim.Simulate(Request{Port: 443, TLS: true, Host: "h", Path: "/ok"}); err != nil || res.DownstreamTLS == nil {
		t.Errorf("TLS request: %v, %v", res, err)
	}
}

// TestRedirectLocation follows Envoy's Utility::newUri: scheme from the request's :scheme
// unless rewritten, the request's port dropped when a port is given or when the scheme
// changes from the port's default scheme (judged by x-forwarded-proto), path_redirect's own
// query winning, strip_query.
func TestRedirectLocation(t *testing.T) {
	https := &routev3.RedirectAction_SchemeRedirect{SchemeRedirect: "https"}
	tests := []struct {
		name     string
		ra       *routev3.RedirectAction
		match    *routev3.RouteMatch
		host     string
		path     string
		xfp      string
		want     string
		wantCode int
	}{
		{"defaults", &routev3.RedirectAction{}, nil, "h", "/a?b", "", "http://h/a?b", 301},
		{"scheme from :scheme, not x-forwarded-proto", &routev3.RedirectAction{HostRedirect: "x"}, nil, "h", "/", "https", "http://x/", 301},
		{"scheme change drops the old default port", &routev3.RedirectAction{SchemeRewriteSpecifier: https}, nil, "h:80", "/", "", "https://h/", 301},
		{"scheme change keeps another port", &routev3.RedirectAction{SchemeRewriteSpecifier: https}, nil, "h:8080", "/", "", "https://h:8080/", 301},
		{"port judged by x-forwarded-proto", &routev3.RedirectAction{SchemeRewriteSpecifier: https}, nil, "h:80", "/", "https", "https://h:80/", 301},
		{"port given replaces the request's", &routev3.RedirectAction{PortRedirect: 8443}, nil, "h:80", "/", "", "http://h:8443/", 301},
		{"port given is kept even if default", &routev3.RedirectAction{SchemeRewriteSpecifier: https, PortRedirect: 443}, nil, "h", "/", "", "https://h:443/", 301},
		{"host redirect drops nothing of its own", &routev3.RedirectAction{HostRedirect: "x:9"}, nil, "h:80", "/", "", "http://x:9/", 301},
		{"empty path redirect keeps the path (as istiod sends a host redirect)", &routev3.RedirectAction{HostRedirect: "example.org",
			PathRewriteSpecifier: &routev3.RedirectAction_PathRedirect{PathRedirect: ""}}, nil, "h", "/o?q=1", "", "http://example.org/o?q=1", 301},
		{"path redirect keeps the query", &routev3.RedirectAction{PathRewriteSpecifier: &routev3.RedirectAction_PathRedirect{PathRedirect: "/n"}}, nil, "h", "/o?q=1", "", "http://h/n?q=1", 301},
		{"path redirect's query wins and is not stripped", &routev3.RedirectAction{StripQuery: true,
			PathRewriteSpecifier: &routev3.RedirectAction_PathRedirect{PathRedirect: "/n?z"}}, nil, "h", "/o?q=1", "", "http://h/n?z", 301},
		{"strip query", &routev3.RedirectAction{StripQuery: true}, nil, "h", "/o?q=1", "", "http://h/o", 301},
		{"prefix rewrite", &routev3.RedirectAction{PathRewriteSpecifier: &routev3.RedirectAction_PrefixRewrite{PrefixRewrite: "/new"}},
			&routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/old"}}, "h", "/old/x?y", "", "http://h/new/x?y", 301},
		{"regex rewrite", &routev3.RedirectAction{PathRewriteSpecifier: &routev3.RedirectAction_RegexRewrite{RegexRewrite: &matcherv3.RegexMatchAndSubstitute{
			Pattern: regexMatcher("^/(\\w+)/(\\w+)$"), Substitution: "/\\2/\\1"}}}, nil, "h", "/a/b", "", "http://h/b/a", 301},
		{"codes", &routev3.RedirectAction{ResponseCode: routev3.RedirectAction_TEMPORARY_REDIRECT}, nil, "h", "/", "", "http://h/", 307},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := tc.match
			if m == nil {
				m = &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}}
			}
			rc := &routev3.RouteConfiguration{VirtualHosts: []*routev3.VirtualHost{{Name: "vh", Domains: []string{"*"}, Routes: []*routev3.Route{{
				Name: "r", Match: m, Action: &routev3.Route_Redirect{Redirect: tc.ra}}}}}}
			req := Request{Port: 80, Host: tc.host, Path: tc.path}
			if tc.xfp != "" {
				req.Headers = http.Header{"X-Forwarded-Proto": {tc.xfp}}
			}
			res, err := simOf(t, httpListener(t, rc)).Simulate(req)
			if err != nil {
				t.Fatal(err)
			}
			if res.Action != Redirect || res.Redirect.Location != tc.want || res.Redirect.Status != tc.wantCode {
				t.Errorf("got %s %+v, want %d %s", res.Action, res.Redirect, tc.wantCode, tc.want)
			}
		})
	}
}

// TestConnectionManager: the HCM's host and path normalisation before matching.
func TestConnectionManager(t *testing.T) {
	rc := &routev3.RouteConfiguration{VirtualHosts: []*routev3.VirtualHost{
		{Name: "exact", Domains: []string{"h"}, Routes: []*routev3.Route{prefixRoute("a", "/a/b", "c")}},
		{Name: "star", Domains: []string{"*"}, Routes: []*routev3.Route{prefixRoute("any", "/", "c")}},
	}}
	tests := []struct {
		name       string
		hcm        func(*hcmv3.HttpConnectionManager)
		host, path string
		wantVH     string
		wantPath   string
	}{
		{"port kept by default", func(*hcmv3.HttpConnectionManager) {}, "h:80", "/a/b", "star", "/a/b"},
		{"strip_matching_host_port", func(h *hcmv3.HttpConnectionManager) { h.StripMatchingHostPort = true }, "h:80", "/a/b", "exact", "/a/b"},
		{"strip_matching_host_port leaves another port", func(h *hcmv3.HttpConnectionManager) { h.StripMatchingHostPort = true }, "h:81", "/a/b", "star", "/a/b"},
		{"strip_any_host_port", func(h *hcmv3.HttpConnectionManager) {
			h.StripPortMode = &hcmv3.HttpConnectionManager_StripAnyHostPort{StripAnyHostPort: true}
		}, "h:81", "/a/b", "exact", "/a/b"},
		{"normalize_path", func(h *hcmv3.HttpConnectionManager) { h.NormalizePath = wrapperspb.Bool(true) }, "h", "/a/./x/../b?q", "exact", "/a/b?q"},
		{"no normalisation by default", func(*hcmv3.HttpConnectionManager) {}, "h", "/a/b/./c", "exact", "/a/b/./c"},
		{"merge_slashes", func(h *hcmv3.HttpConnectionManager) { h.MergeSlashes = true }, "h", "//a///b", "exact", "/a/b"},
		{"strip_trailing_host_dot", func(h *hcmv3.HttpConnectionManager) { h.StripTrailingHostDot = true }, "h.", "/a/b", "exact", "/a/b"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hcm := &hcmv3.HttpConnectionManager{RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: rc}}
			tc.hcm(hcm)
			l := httpListener(t, rc)
			l.FilterChains[0].Filters[0].ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(t, hcm)}
			res, err := simOf(t, l, staticCluster("c", "127.0.0.1")).Simulate(Request{Port: 80, Host: tc.host, Path: tc.path})
			if err != nil {
				t.Fatal(err)
			}
			if res.VirtualHost != tc.wantVH || res.Upstream.Path != tc.wantPath {
				t.Errorf("virtual host %s path %s, want %s %s", res.VirtualHost, res.Upstream.Path, tc.wantVH, tc.wantPath)
			}
		})
	}
}
