package xdsdiff

import (
	"fmt"
	"strings"
	"testing"

	udpav1 "github.com/cncf/xds/go/udpa/type/v1"
	xdstypev3 "github.com/cncf/xds/go/xds/type/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/config/accesslog/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	rawv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/raw_buffer/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestCompare(t *testing.T) {
	tests := []struct {
		name        string
		istiod, our []proto.Message
		want        []string // "TYPE resource path: istiod | ours"
	}{{
		name:   "resources, filter chains, endpoints and domains in another order are equal",
		istiod: []proto.Message{cluster("a"), cluster("b"), chains("l", "x.com", "y.com"), cla("a", "198.18.0.1", "198.18.0.2"), routes("r", vhost("v", []string{"a", "b"}, route("/", "a")))},
		our:    []proto.Message{routes("r", vhost("v", []string{"b", "a"}, route("/", "a"))), cla("a", "198.18.0.2", "198.18.0.1"), chains("l", "y.com", "x.com"), cluster("b"), cluster("a")},
	}, {
		name:   "routes in another order differ",
		istiod: []proto.Message{routes("r", vhost("v", []string{"*"}, route("/a", "a"), route("/", "b")))},
		our:    []proto.Message{routes("r", vhost("v", []string{"*"}, route("/", "b"), route("/a", "a")))},
		want:   []string{"RDS r virtual_hosts[v].routes (order): [prefix=/a] [prefix=/] | [prefix=/] [prefix=/a]"},
	}, {
		name:   "retry conditions are a set",
		istiod: []proto.Message{routes("r", vhost("v", []string{"*"}, retrying(route("/", "a"), "connect-failure,refused-stream,unavailable")))},
		our:    []proto.Message{routes("r", vhost("v", []string{"*"}, retrying(route("/", "a"), "unavailable, connect-failure,refused-stream")))},
	}, {
		name:   "HTTP filters in another order differ",
		istiod: []proto.Message{hcmListener("l", rds("r"), "envoy.filters.http.fault", "envoy.filters.http.router")},
		our:    []proto.Message{hcmListener("l", rds("r"), "envoy.filters.http.router", "envoy.filters.http.fault")},
		want:   []string{"LDS l filter_chains[*].filters[http_connection_manager].http_filters (order): [fault] [router] | [router] [fault]"},
	}, {
		name: "a route configuration is followed from its connection manager, by RDS name or inline",
		istiod: []proto.Message{hcmListener("l", rds("80"), "envoy.filters.http.router"),
			routes("80", vhost("v", []string{"*"}, route("/", "a")))},
		our:  []proto.Message{hcmListener("l", inline(routes("inline-name", vhost("v", []string{"*"}, route("/", "b")))), "envoy.filters.http.router")},
		want: []string{"RDS 80 virtual_hosts[v].routes[prefix=/].route.cluster: a | b"},
	}, {
		name: "route configurations under other names, reached from the same connection manager, are equal",
		istiod: []proto.Message{hcmListener("l", rds("80"), "envoy.filters.http.router"),
			routes("80", vhost("v", []string{"*"}, route("/", "a")))},
		our: []proto.Message{hcmListener("l", rds("http.80"), "envoy.filters.http.router"),
			routes("http.80", vhost("v", []string{"*"}, route("/", "a")))},
	}, {
		name:   "a proxyless gRPC API listener's route configuration is followed",
		istiod: []proto.Message{apiListener("echo:7070", "outbound|7070||echo"), routes("outbound|7070||echo", vhost("v", []string{"echo:7070"}, route("/", "a")))},
		our:    []proto.Message{apiListener("echo:7070", "echo-routes"), routes("echo-routes", vhost("v", []string{"echo:7070"}, route("/", "b")))},
		want:   []string{"RDS outbound|7070||echo virtual_hosts[v].routes[prefix=/].route.cluster: a | b"},
	}, {
		name:   "load assignments are followed from their EDS cluster, under the cluster's name",
		istiod: []proto.Message{edsCluster("c", "c-eds"), cla("c-eds", "198.18.0.1")},
		our:    []proto.Message{edsCluster("c", ""), cla("c", "198.18.0.1", "198.18.0.2")},
		want:   []string{"EDS c endpoints[198.18.0.2:80]: <absent> | {}"},
	}, {
		name:   "an endpoint's defaults stated equal defaults left out",
		istiod: []proto.Message{edsCluster("c", ""), withEndpoint(cla("c", "198.18.0.1"), &corev3.Locality{}, 1, corev3.HealthStatus_HEALTHY)},
		our:    []proto.Message{edsCluster("c", ""), cla("c", "198.18.0.1")},
	}, {
		name:   "a route match stating case_sensitive: true equals one leaving it out; false differs",
		istiod: []proto.Message{routes("r", vhost("v", []string{"*"}, caseSensitive(route("/a", "a"), true), caseSensitive(route("/b", "b"), false)))},
		our:    []proto.Message{routes("r", vhost("v", []string{"*"}, route("/a", "a"), route("/b", "b")))},
		want: []string{
			"RDS r virtual_hosts[v].routes[case_sensitive=false prefix=/b]: {route: {cluster: b}} | <absent>",
			"RDS r virtual_hosts[v].routes[prefix=/b]: <absent> | {route: {cluster: b}}",
		},
	}, {
		name:   "an endpoint's weight, locality and health are compared",
		istiod: []proto.Message{edsCluster("c", ""), withEndpoint(cla("c", "198.18.0.1"), &corev3.Locality{Region: "eu", Zone: "eu-1"}, 2, corev3.HealthStatus_DRAINING)},
		our:    []proto.Message{edsCluster("c", ""), cla("c", "198.18.0.1")},
		want: []string{"EDS c endpoints[198.18.0.1:80].health_status: DRAINING | <absent>",
			"EDS c endpoints[198.18.0.1:80].locality: eu/eu-1/ | <absent>",
			"EDS c endpoints[198.18.0.1:80].weight: 2 | <absent>"},
	}, {
		name:   "an unregistered Any with the same bytes is equal",
		istiod: []proto.Message{tcpListener("l", unregistered("abc"))},
		our:    []proto.Message{tcpListener("l", unregistered("abc"))},
	}, {
		name:   "an unregistered Any is compared by type URL and hash",
		istiod: []proto.Message{tcpListener("l", unregistered("abc"))},
		our:    []proto.Message{tcpListener("l", unregistered("abd"))},
		want: []string{"LDS l filter_chains[*].filters[acme.filter].typed_config: " +
			"<unregistered type type.googleapis.com/acme.v1.Filter sha256:ba7816bf8f01> | <unregistered type type.googleapis.com/acme.v1.Filter sha256:a52d159f262b>"},
	}, {
		name: "a TypedStruct is compared as the message it names",
		istiod: []proto.Message{tcpListener("l", mustAny(&udpav1.TypedStruct{TypeUrl: "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
			Value: mustStruct(map[string]any{"cluster": "a", "stat_prefix": "x"})}))},
		our:  []proto.Message{tcpListener("l", mustAny(&tcpv3.TcpProxy{ClusterSpecifier: &tcpv3.TcpProxy_Cluster{Cluster: "b"}}))},
		want: []string{"LDS l filter_chains[*].filters[acme.filter].cluster: a | b"},
	}, {
		name: "a TypedStruct of a type not registered is compared as JSON",
		istiod: []proto.Message{tcpListener("l", mustAny(&udpav1.TypedStruct{TypeUrl: "type.googleapis.com/acme.v1.Filter",
			Value: mustStruct(map[string]any{"mode": "strict", "ports": []any{80, 443}})}))},
		our: []proto.Message{tcpListener("l", mustAny(&xdstypev3.TypedStruct{TypeUrl: "type.googleapis.com/acme.v1.Filter",
			Value: mustStruct(map[string]any{"mode": "permissive", "ports": []any{80, 443}})}))},
		want: []string{"LDS l filter_chains[*].filters[acme.filter].mode: strict | permissive"},
	}, {
		name: "telemetry, metadata and names of internals are left out",
		istiod: []proto.Message{noisy(cluster("a")), noisyListener(hcmListener("l", rds("r"), "istio.metadata_exchange", "envoy.filters.http.router", "istio.stats")),
			noisyRoutes(routes("r", vhost("v", []string{"*"}, route("/", "a"))))},
		our: []proto.Message{cluster("a"), hcmListener("l", rds("r"), "envoy.filters.http.router"), routes("r", vhost("v", []string{"*"}, route("/", "a")))},
	}, {
		name:   "a raw_buffer transport socket is no transport socket",
		istiod: []proto.Message{withSocket(cluster("a"), "envoy.transport_sockets.raw_buffer", &rawv3.RawBuffer{})},
		our:    []proto.Message{cluster("a")},
	}, {
		name:   "a TLS transport socket is compared property by property",
		istiod: []proto.Message{withSocket(cluster("a"), "tls", &tlsv3.UpstreamTlsContext{Sni: "a.example.com"})},
		our:    []proto.Message{withSocket(cluster("a"), "tls", &tlsv3.UpstreamTlsContext{Sni: "b.example.com"})},
		want:   []string{"CDS a transport_socket.sni: a.example.com | b.example.com"},
	}, {
		name:   "a resource on one side is one difference",
		istiod: []proto.Message{cluster("a")},
		our:    []proto.Message{cluster("a"), cluster("b")},
		want:   []string{"CDS b : <absent> | <present: 1 property>"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			diffs, _, err := Compare(snapshot(t, tt.istiod...), snapshot(t, tt.our...))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, d := range diffs {
				got = append(got, fmt.Sprintf("%s %s %s: %s | %s", d.Type, d.Resource, d.Path, d.Istiod, d.Ours))
			}
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("differences:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

func TestCompareErrors(t *testing.T) {
	bad := &anypb.Any{TypeUrl: ClusterType, Value: []byte{0xff, 0xff}}
	if _, _, err := Compare(Snapshot{}, Snapshot{ClusterType: {bad}}); err == nil ||
		!strings.Contains(err.Error(), "ours: "+ClusterType+" resource 0") {
		t.Errorf("undecodable resource: %v", err)
	}
	wrong := Snapshot{EndpointType: snapshot(t, cluster("a"))[ClusterType]}
	if _, _, err := Compare(wrong, Snapshot{}); err == nil || !strings.Contains(err.Error(), "istiod: "+EndpointType+" resource 0 is a "+ClusterType) {
		t.Errorf("resource under another type: %v", err)
	}
	a := snapshot(t, cluster("a"), cluster("a"))
	if _, _, err := Compare(a, Snapshot{}); err == nil || !strings.Contains(err.Error(), `istiod: `+ClusterType+`: two resources named "a"`) {
		t.Errorf("duplicate name: %v", err)
	}
}

func TestStats(t *testing.T) {
	// Two clusters of two properties each (type, lb_policy), one on istiod's side only.
	c := func(n string) proto.Message {
		return &clusterv3.Cluster{Name: n, ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC}, LbPolicy: clusterv3.Cluster_RING_HASH}
	}
	_, st, err := Compare(snapshot(t, c("a"), c("b")), snapshot(t, c("a")))
	if err != nil {
		t.Fatal(err)
	}
	if st != (Stats{Resources: 2, Properties: 4}) {
		t.Errorf("stats %+v, want 2 resources, 4 properties", st)
	}
}

func TestDifferenceString(t *testing.T) {
	d := Difference{Case: "gateway", Node: "router~198.18.0.1~gw.istio-system~istio-system.svc.cluster.local",
		Type: "LDS", Resource: "0.0.0.0_8443", Path: "filter_chains[sni=a.com].filters[tcp_proxy].cluster", Istiod: "a", Ours: absent}
	want := "case gateway, node router~198.18.0.1~gw.istio-system~istio-system.svc.cluster.local\n" +
		"  LDS 0.0.0.0_8443 filter_chains[sni=a.com].filters[tcp_proxy].cluster\n" +
		"  istiod: a\n" +
		"  ours:   <absent>\n"
	if got := d.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// Builders of resources.

func snapshot(t testing.TB, ms ...proto.Message) Snapshot {
	t.Helper()
	s := Snapshot{}
	for _, m := range ms {
		a, err := anypb.New(m)
		if err != nil {
			t.Fatal(err)
		}
		s[a.TypeUrl] = append(s[a.TypeUrl], a)
	}
	return s
}

func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(err)
	}
	return a
}

func mustStruct(m map[string]any) *structpb.Struct {
	s, err := structpb.NewStruct(m)
	if err != nil {
		panic(err)
	}
	return s
}

func cluster(name string) *clusterv3.Cluster {
	return &clusterv3.Cluster{Name: name, ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC}}
}

func edsCluster(name, service string) *clusterv3.Cluster {
	return &clusterv3.Cluster{Name: name, ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{ServiceName: service}}
}

func withSocket(c *clusterv3.Cluster, name string, cfg proto.Message) *clusterv3.Cluster {
	c.TransportSocket = &corev3.TransportSocket{Name: name, ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAny(cfg)}}
	return c
}

func noisy(c *clusterv3.Cluster) *clusterv3.Cluster {
	c.AltStatName = "stats-name"
	c.Metadata = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"istio": {}}}
	return c
}

func sockAddr(ip string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: ip, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port}}}}
}

// cla puts each address in its own locality, so reordering crosses localities.
func cla(name string, ips ...string) *endpointv3.ClusterLoadAssignment {
	c := &endpointv3.ClusterLoadAssignment{ClusterName: name}
	for _, ip := range ips {
		c.Endpoints = append(c.Endpoints, &endpointv3.LocalityLbEndpoints{LbEndpoints: []*endpointv3.LbEndpoint{{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: sockAddr(ip, 80)}}}}})
	}
	return c
}

// withEndpoint sets the first endpoint's locality, weight and health.
func withEndpoint(c *endpointv3.ClusterLoadAssignment, l *corev3.Locality, weight uint32, h corev3.HealthStatus) *endpointv3.ClusterLoadAssignment {
	c.Endpoints[0].Locality = l
	lb := c.Endpoints[0].LbEndpoints[0]
	lb.LoadBalancingWeight = wrapperspb.UInt32(weight)
	lb.HealthStatus = h
	return c
}

func filter(name string, cfg proto.Message) *listenerv3.Filter {
	return &listenerv3.Filter{Name: name, ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(cfg)}}
}

func tcpListener(name string, cfg *anypb.Any) *listenerv3.Listener {
	return &listenerv3.Listener{Name: name, FilterChains: []*listenerv3.FilterChain{{
		Filters: []*listenerv3.Filter{{Name: "acme.filter", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: cfg}}}}}}
}

func unregistered(payload string) *anypb.Any {
	return &anypb.Any{TypeUrl: "type.googleapis.com/acme.v1.Filter", Value: []byte(payload)}
}

// chains is a listener with one TLS passthrough chain per SNI name.
func chains(name string, snis ...string) *listenerv3.Listener {
	l := &listenerv3.Listener{Name: name, Address: sockAddr("0.0.0.0", 443)}
	for _, sni := range snis {
		l.FilterChains = append(l.FilterChains, &listenerv3.FilterChain{
			FilterChainMatch: &listenerv3.FilterChainMatch{ServerNames: []string{sni}},
			Filters: []*listenerv3.Filter{filter("envoy.filters.network.tcp_proxy", &tcpv3.TcpProxy{
				StatPrefix: sni, ClusterSpecifier: &tcpv3.TcpProxy_Cluster{Cluster: "outbound|443||" + sni}})}})
	}
	return l
}

// routeSpec sets how a connection manager finds its routes.
type routeSpec func(*hcmv3.HttpConnectionManager)

func rds(name string) routeSpec {
	return func(h *hcmv3.HttpConnectionManager) {
		h.RouteSpecifier = &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{RouteConfigName: name}}
	}
}

func inline(rc *routev3.RouteConfiguration) routeSpec {
	return func(h *hcmv3.HttpConnectionManager) {
		h.RouteSpecifier = &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: rc}
	}
}

func hcm(routes routeSpec, httpFilters ...string) *hcmv3.HttpConnectionManager {
	h := &hcmv3.HttpConnectionManager{StatPrefix: "http"}
	routes(h)
	for _, f := range httpFilters {
		h.HttpFilters = append(h.HttpFilters, &hcmv3.HttpFilter{Name: f,
			ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&routerv3.Router{})}})
	}
	return h
}

func hcmListener(name string, routes routeSpec, httpFilters ...string) *listenerv3.Listener {
	return &listenerv3.Listener{Name: name, FilterChains: []*listenerv3.FilterChain{{
		Filters: []*listenerv3.Filter{filter("envoy.filters.network.http_connection_manager", hcm(routes, httpFilters...))}}}}
}

func noisyRoutes(rc *routev3.RouteConfiguration) *routev3.RouteConfiguration {
	rc.VirtualHosts[0].TypedPerFilterConfig = map[string]*anypb.Any{"istio.stats": mustAny(&routerv3.Router{})}
	return rc
}

func noisyListener(l *listenerv3.Listener) *listenerv3.Listener {
	l.StatPrefix = "noise"
	l.FilterChains[0].Name = "generated-name"
	l.AccessLog = []*accesslogv3.AccessLog{{Name: "envoy.access_loggers.file"}}
	return l
}

func apiListener(name, route string) *listenerv3.Listener {
	return &listenerv3.Listener{Name: name, ApiListener: &listenerv3.ApiListener{
		ApiListener: mustAny(hcm(rds(route), "envoy.filters.http.router"))}}
}

func routes(name string, vhs ...*routev3.VirtualHost) *routev3.RouteConfiguration {
	return &routev3.RouteConfiguration{Name: name, VirtualHosts: vhs, ValidateClusters: wrapperspb.Bool(false)}
}

func vhost(name string, domains []string, rs ...*routev3.Route) *routev3.VirtualHost {
	return &routev3.VirtualHost{Name: name, Domains: domains, Routes: rs}
}

func route(prefix, cluster string) *routev3.Route {
	return &routev3.Route{Name: "generated-" + prefix,
		Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: prefix}},
		Action: &routev3.Route_Route{Route: &routev3.RouteAction{
			ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster}}}}
}

func caseSensitive(r *routev3.Route, on bool) *routev3.Route {
	r.Match.CaseSensitive = wrapperspb.Bool(on)
	return r
}

// BenchmarkCompare compares a sidecar-sized snapshot with itself: 300 clusters with mTLS
// transport socket matches, their load assignments of 5 endpoints, 50 HTTP listeners with
// their route configurations of 5 virtual hosts.
func BenchmarkCompare(b *testing.B) {
	var ms []proto.Message
	for i := range 300 {
		name := fmt.Sprintf("outbound|80||svc%d.default.svc.cluster.local", i)
		c := edsCluster(name, name)
		c.TransportSocketMatches = []*clusterv3.Cluster_TransportSocketMatch{{Name: "tlsMode-istio",
			Match:           &structpb.Struct{Fields: map[string]*structpb.Value{"tlsMode": structpb.NewStringValue("istio")}},
			TransportSocket: withSocket(cluster(""), "tls", &tlsv3.UpstreamTlsContext{Sni: name}).TransportSocket}}
		ms = append(ms, c, cla(name, "198.18.0.1", "198.18.0.2", "198.18.0.3", "198.18.0.4", "198.18.0.5"))
	}
	for i := range 50 {
		port := fmt.Sprint(8000 + i)
		var vhs []*routev3.VirtualHost
		for j := range 5 {
			host := fmt.Sprintf("svc%d.default.svc.cluster.local", 5*i+j)
			vhs = append(vhs, vhost(host+":"+port, []string{host, host + ":" + port}, route("/api", "a"), route("/", "b")))
		}
		ms = append(ms, hcmListener("0.0.0.0_"+port, rds(port), "envoy.filters.http.fault", "envoy.filters.http.router"), routes(port, vhs...))
	}
	s := snapshot(b, ms...)
	for b.Loop() {
		if d, _, err := Compare(s, s); err != nil || len(d) != 0 {
			b.Fatal(d, err)
		}
	}
}

func retrying(r *routev3.Route, on string) *routev3.Route {
	r.GetRoute().RetryPolicy = &routev3.RetryPolicy{RetryOn: on}
	return r
}
