package envoygen

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	corsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	faultv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	httpinspectorv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/http_inspector/v3"
	origdstv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/original_dst/v3"
	tlsinspectorv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	mongov3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/mongo_proxy/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	alpnv2alpha1 "istio.io/api/envoy/config/filter/http/alpn/v2alpha1"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	"sailplane.dev/services/xds-server/internal/authn"
	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/services/xds-server/internal/translate"
)

// Filter names as istiod writes them.
const (
	hcmFilter           = "envoy.filters.network.http_connection_manager"
	tcpProxyFilter      = "envoy.filters.network.tcp_proxy"
	mongoProxyFilter    = "envoy.filters.network.mongo_proxy"
	faultFilter         = "envoy.filters.http.fault"
	corsFilter          = "envoy.filters.http.cors"
	routerFilter        = "envoy.filters.http.router"
	originalDstFilter   = "envoy.filters.listener.original_dst"
	tlsInspectorFilter  = "envoy.filters.listener.tls_inspector"
	httpInspectorFilter = "envoy.filters.listener.http_inspector"
	// passthroughFilterChain is istiod's name for the chain taking what no other chain matches,
	// whichever cluster the outbound traffic policy sends it to.
	passthroughFilterChain = "PassthroughFilterChain"
	wildcardIP             = "0.0.0.0"
	// transportSocketConnectTimeout is istiod's default PILOT_GATEWAY_TRANSPORT_SOCKET_CONNECT_TIMEOUT.
	transportSocketConnectTimeout = 15 * time.Second
)

// alpnFilter is istiod's istio.alpn on outbound and gateway HTTP managers: Istio's Envoy then
// offers istio-http/1.0, istio-http/1.1 or istio-h2 (then istio, then the plain protocol) in
// the mTLS handshake of the upstream protocol it chose, from which an Istio peer sidecar picks
// its HTTP inbound chain rather than the TCP one. Shared: generated resources are never modified.
var alpnFilter = &hcmv3.HttpFilter{Name: "istio.alpn", ConfigType: &hcmv3.HttpFilter_TypedConfig{
	TypedConfig: mustAny(&alpnv2alpha1.FilterConfig{AlpnOverride: []*alpnv2alpha1.FilterConfig_AlpnOverride{
		{UpstreamProtocol: alpnv2alpha1.FilterConfig_HTTP10, AlpnOverride: []string{"istio-http/1.0", "istio", "http/1.0"}},
		{UpstreamProtocol: alpnv2alpha1.FilterConfig_HTTP11, AlpnOverride: []string{"istio-http/1.1", "istio", "http/1.1"}},
		{UpstreamProtocol: alpnv2alpha1.FilterConfig_HTTP2, AlpnOverride: []string{"istio-h2", "istio", "h2"}},
	}})}}

func (b *builder) listeners() []*listenerv3.Listener {
	if b.proxy.IsRouter() {
		return sortByName(b.gatewayListeners())
	}
	out := []*listenerv3.Listener{b.virtualOutbound(), b.virtualInbound()}
	out = append(out, b.outboundListeners()...)
	return sortByName(out)
}

func (b *builder) outboundFallbackCluster() string {
	if b.allowAny {
		return PassthroughCluster
	}
	return BlackHoleCluster
}

// virtualOutbound receives all captured outbound traffic and hands each connection to the
// listener of its original destination; what no listener claims goes to the fallback. A
// connection addressed to 15001 itself is dropped, so passthrough cannot loop back into it.
func (b *builder) virtualOutbound() *listenerv3.Listener {
	fallback := b.outboundFallbackCluster()
	return &listenerv3.Listener{
		Name:             VirtualOutboundListener,
		Address:          translate.SocketAddress(wildcardIP, VirtualOutboundPort),
		UseOriginalDst:   wrapperspb.Bool(true),
		TrafficDirection: corev3.TrafficDirection_OUTBOUND,
		// As istiod: one connection per wakeup spreads them over Envoy's workers.
		MaxConnectionsToAcceptPerSocketEvent: wrapperspb.UInt32(1),
		FilterChains: []*listenerv3.FilterChain{{
			Name:             VirtualOutboundListener + "-blackhole",
			FilterChainMatch: &listenerv3.FilterChainMatch{DestinationPort: wrapperspb.UInt32(VirtualOutboundPort)},
			Filters:          []*listenerv3.Filter{tcpProxy(BlackHoleCluster, BlackHoleCluster)},
		}, {
			Name:    VirtualOutboundListener + "-catchall-tcp",
			Filters: []*listenerv3.Filter{tcpProxy(fallback, fallback)},
		}},
	}
}

// virtualInbound receives captured inbound traffic, laid out as istiod does it: a blackhole
// for connections addressed to 15006 itself, the passthrough chains for ports no service
// declares, then each workload port's chains. Each port gets the chains its protocol and its
// PeerAuthentication mode call for (see inboundChainOptions): plaintext, Istio mTLS told
// apart by tls_inspector's transport protocol and the istio* ALPN the client sidecar sends,
// or both; undeclared protocols add http_inspector's plaintext HTTP chain to the TCP one.
func (b *builder) virtualInbound() *listenerv3.Listener {
	l := &listenerv3.Listener{
		Name:                                 VirtualInboundListener,
		Address:                              translate.SocketAddress(wildcardIP, VirtualInboundPort),
		TrafficDirection:                     corev3.TrafficDirection_INBOUND,
		ContinueOnListenerFiltersTimeout:     true,
		ListenerFiltersTimeout:               b.protocolDetectionTimeout(),
		MaxConnectionsToAcceptPerSocketEvent: wrapperspb.UInt32(1),
		// A connection addressed to 15006 itself would loop; drop it, as istiod does.
		FilterChains: []*listenerv3.FilterChain{{
			Name:             VirtualInboundListener + "-blackhole",
			FilterChainMatch: &listenerv3.FilterChainMatch{DestinationPort: wrapperspb.UInt32(VirtualInboundPort)},
			Filters:          []*listenerv3.Filter{tcpProxy(BlackHoleCluster, BlackHoleCluster)},
		}},
	}
	az := b.inboundAuthz()
	tcpAuthz := az.TCP()
	peer := authn.ForWorkload(b.snap, b.proxy.Namespace, b.proxy.Labels)
	ports := b.inboundPorts()
	passthrough := inboundChain{name: VirtualInboundListener, httpName: VirtualInboundListener + "-catchall-http",
		cluster: InboundPassthroughCluster, proto: protoSniffed}
	passthroughHTTP := hcmFilterOf(b.inboundHCM(InboundPassthroughCluster, InboundPassthroughCluster, 0, false))
	l.FilterChains = append(l.FilterChains, b.inboundChains(passthrough, peer.Mode, tcpAuthz, passthroughHTTP)...)
	// Ports a PeerAuthentication sets a mode for that no service declares get passthrough
	// chains of their own, in that mode.
	for _, port := range slices.Sorted(maps.Keys(peer.PerPort)) {
		if slices.ContainsFunc(ports, func(in inboundPort) bool { return in.port == port }) {
			continue
		}
		pc := passthrough
		pc.port = port
		l.FilterChains = append(l.FilterChains, b.inboundChains(pc, peer.ModeFor(port), tcpAuthz, passthroughHTTP)...)
	}
	for _, in := range ports {
		name := "0.0.0.0_" + itoa(in.port)
		cluster := InboundClusterName(in.port)
		c := inboundChain{name: name, httpName: name, port: in.port, cluster: cluster, proto: in.proto, mongo: in.mongo}
		var httpFilter *listenerv3.Filter
		if in.proto.carriesHTTP() {
			h := b.inboundHCM("inbound_"+name, cluster, in.port, in.grpc)
			if in.proto == protoHTTP2 {
				// As istiod on HTTP/2 and gRPC ports (Envoy's defaults, stated), for gRPC-Web.
				h.Http2ProtocolOptions = &corev3.Http2ProtocolOptions{}
			}
			httpFilter = hcmFilterOf(h)
		}
		l.FilterChains = append(l.FilterChains, b.inboundChains(c, peer.ModeFor(in.port), tcpAuthz, httpFilter)...)
	}
	l.ListenerFilters = inboundListenerFilters(l.FilterChains)
	return l
}

// inboundChain describes the chains of one inbound port (0: the passthrough).
type inboundChain struct {
	name, httpName string // chain names for TCP and HTTP chains
	port           uint32
	cluster        string // also the stat prefix of TCP chains, as istiod names them
	proto          protocol
	mongo          bool
}

// inboundChains builds c's chains for mode: the HTTP ones run httpFilter (an HTTP manager,
// shared by them), the TCP ones the network RBAC filters then a tcp_proxy; those terminating
// mTLS carry the DownstreamTlsContext.
func (b *builder) inboundChains(c inboundChain, mode authn.Mode, tcpAuthz []*listenerv3.Filter,
	httpFilter *listenerv3.Filter) []*listenerv3.FilterChain {
	var out []*listenerv3.FilterChain
	for _, opt := range inboundChainOptions(c.proto, mode) {
		fc := &listenerv3.FilterChain{Name: c.name, FilterChainMatch: &listenerv3.FilterChainMatch{
			TransportProtocol: opt.transport, ApplicationProtocols: opt.alpn}}
		if c.port != 0 {
			fc.FilterChainMatch.DestinationPort = wrapperspb.UInt32(c.port)
		}
		if opt.http {
			fc.Name = c.httpName
			fc.Filters = []*listenerv3.Filter{httpFilter}
		} else {
			fc.Filters = slices.Clip(tcpAuthz)
			if c.mongo {
				fc.Filters = append(fc.Filters, mongoProxy(c.cluster))
			}
			fc.Filters = append(fc.Filters, tcpProxy(c.cluster, c.cluster))
		}
		if opt.mtls {
			fc.TransportSocket = b.inboundMTLS(opt.http)
		}
		out = append(out, fc)
	}
	return out
}

// inboundListenerFilters are virtualInbound's listener filters, derived from its chains as
// istiod does: original_dst, then tls_inspector and http_inspector each turned off on the
// destination ports none of whose chains needs it (a TLS transport protocol match, an HTTP
// ALPN match). When the passthrough chains (port 0) need tls_inspector it runs everywhere
// else; otherwise only on the listed ports.
func inboundListenerFilters(chains []*listenerv3.FilterChain) []*listenerv3.ListenerFilter {
	type need struct{ tls, http bool }
	byPort := map[uint32]need{}
	for _, fc := range chains {
		m := fc.GetFilterChainMatch()
		n := byPort[m.GetDestinationPort().GetValue()]
		n.tls = n.tls || m.GetTransportProtocol() == "tls"
		n.http = n.http || slices.ContainsFunc(m.GetApplicationProtocols(), func(p string) bool {
			return p == "http/1.1" || p == "h2c"
		})
		byPort[m.GetDestinationPort().GetValue()] = n
	}
	ports := slices.Sorted(maps.Keys(byPort))
	out := []*listenerv3.ListenerFilter{listenerFilter(originalDstFilter, &origdstv3.OriginalDst{})}
	if slices.ContainsFunc(ports, func(p uint32) bool { return byPort[p].tls }) {
		f := listenerFilter(tlsInspectorFilter, &tlsinspectorv3.TlsInspector{InitialReadBufferSize: wrapperspb.UInt32(512)})
		var listed []uint32
		for _, p := range ports {
			if p != 0 && byPort[p].tls != byPort[0].tls {
				listed = append(listed, p)
			}
		}
		if len(listed) > 0 {
			f.FilterDisabled = portsPredicate(listed)
			if !byPort[0].tls {
				f.FilterDisabled = &listenerv3.ListenerFilterChainMatchPredicate{
					Rule: &listenerv3.ListenerFilterChainMatchPredicate_NotMatch{NotMatch: f.FilterDisabled}}
			}
		}
		out = append(out, f)
	}
	if slices.ContainsFunc(ports, func(p uint32) bool { return byPort[p].http }) {
		f := listenerFilter(httpInspectorFilter, &httpinspectorv3.HttpInspector{})
		var off []uint32
		for _, p := range ports {
			if !byPort[p].http {
				off = append(off, p)
			}
		}
		if len(off) > 0 {
			f.FilterDisabled = portsPredicate(off)
		}
		out = append(out, f)
	}
	return out
}

// portsPredicate matches connections to any of ports.
func portsPredicate(ports []uint32) *listenerv3.ListenerFilterChainMatchPredicate {
	var rules []*listenerv3.ListenerFilterChainMatchPredicate
	for _, p := range ports {
		rules = append(rules, &listenerv3.ListenerFilterChainMatchPredicate{
			Rule: &listenerv3.ListenerFilterChainMatchPredicate_DestinationPortRange{
				DestinationPortRange: &typev3.Int32Range{Start: int32(p), End: int32(p) + 1}}})
	}
	if len(rules) == 1 {
		return rules[0]
	}
	return &listenerv3.ListenerFilterChainMatchPredicate{Rule: &listenerv3.ListenerFilterChainMatchPredicate_OrMatch{
		OrMatch: &listenerv3.ListenerFilterChainMatchPredicate_MatchSet{Rules: rules}}}
}

// inboundHCM is the HTTP manager of an inbound chain: every request to cluster, the
// workload's port or (port 0) the passthrough. As istiod: no timeout, but a gRPC client's
// grpc-timeout header is honoured (grpc_timeout_header_max 0s: no cap); and a request the app
// resets before answering anything is retried twice, except on gRPC ports, whose streams
// such a retry does not suit.
func (b *builder) inboundHCM(statPrefix, cluster string, port uint32, grpc bool) *hcmv3.HttpConnectionManager {
	act := &routev3.RouteAction{
		ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster},
		Timeout:          durationpb.New(0),
		MaxStreamDuration: &routev3.RouteAction_MaxStreamDuration{
			MaxStreamDuration: durationpb.New(0), GrpcTimeoutHeaderMax: durationpb.New(0)},
	}
	if !grpc {
		act.RetryPolicy = &routev3.RetryPolicy{RetryOn: "reset-before-request", NumRetries: wrapperspb.UInt32(2)}
	}
	rc := &routev3.RouteConfiguration{
		Name:             cluster,
		ValidateClusters: wrapperspb.Bool(false),
		VirtualHosts: []*routev3.VirtualHost{{
			Name:    "inbound|http|" + itoa(port),
			Domains: []string{"*"},
			Routes: []*routev3.Route{{
				Name:   "default",
				Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
				Action: &routev3.Route_Route{Route: act},
			}},
		}},
	}
	h := b.hcm(statPrefix, "", rc, hcmInbound)
	h.HttpFilters = append(b.inboundAuthz().HTTP(), h.HttpFilters...)
	b.setClientCertDetails(h, false)
	return h
}

// setClientCertDetails sets how an inbound or gateway HTTP manager tells the app who called
// it in x-forwarded-client-cert, as istiod: a sidecar appends the mTLS peer's subject, URI
// and DNS SANs to what the caller forwarded (defaultConfig.proxyHeaders may change the mode
// and fields); a gateway replaces whatever the client sent with its own peer's details,
// certificate included (defaultConfig.gatewayTopology may change the mode). The details are
// set only in the modes where Envoy writes them.
func (b *builder) setClientCertDetails(h *hcmv3.HttpConnectionManager, gateway bool) {
	pc := b.snap.Mesh.GetDefaultConfig()
	if gateway {
		h.ForwardClientCertDetails = hcmv3.HttpConnectionManager_SANITIZE_SET
		if m := pc.GetGatewayTopology().GetForwardClientCertDetails(); m != meshv1alpha1.ForwardClientCertDetails_UNDEFINED {
			h.ForwardClientCertDetails = envoyClientCertDetails(m)
		}
		if h.ForwardClientCertDetails == hcmv3.HttpConnectionManager_APPEND_FORWARD ||
			h.ForwardClientCertDetails == hcmv3.HttpConnectionManager_SANITIZE_SET {
			h.SetCurrentClientCertDetails = &hcmv3.HttpConnectionManager_SetCurrentClientCertDetails{
				Subject: wrapperspb.Bool(true), Cert: true, Dns: true, Uri: true}
		}
		return
	}
	ph := pc.GetProxyHeaders()
	h.ForwardClientCertDetails = hcmv3.HttpConnectionManager_APPEND_FORWARD
	if m := ph.GetForwardedClientCert(); m != meshv1alpha1.ForwardClientCertDetails_UNDEFINED {
		h.ForwardClientCertDetails = envoyClientCertDetails(m)
	}
	set := ph.GetSetCurrentClientCertDetails()
	h.SetCurrentClientCertDetails = &hcmv3.HttpConnectionManager_SetCurrentClientCertDetails{
		Subject: wrapperspb.Bool(set.GetSubject() == nil || set.GetSubject().GetValue()),
		Uri:     set.GetUri() == nil || set.GetUri().GetValue(),
		Dns:     set.GetDns() == nil || set.GetDns().GetValue(),
		Cert:    set.GetCert().GetValue(),
		Chain:   set.GetChain().GetValue(),
	}
}

// envoyClientCertDetails converts the mesh config's mode, which numbers Envoy's from 1.
func envoyClientCertDetails(m meshv1alpha1.ForwardClientCertDetails) hcmv3.HttpConnectionManager_ForwardClientCertDetails {
	return hcmv3.HttpConnectionManager_ForwardClientCertDetails(m - 1)
}

// hcmClass is the proxy side an HTTP connection manager serves.
type hcmClass int

const (
	hcmInbound hcmClass = iota
	hcmOutbound
	hcmGateway
)

// hcm builds an HTTP connection manager with istiod's filter chain: istio.alpn (not inbound),
// fault and CORS (inert unless a route configures them) before the router. As istiod, an
// Expect: 100-continue is answered by the upstream, whose 100 Continue is proxied, rather
// than by Envoy before the upstream has seen the request.
func (b *builder) hcm(statPrefix, rds string, inline *routev3.RouteConfiguration,
	class hcmClass) *hcmv3.HttpConnectionManager {
	gateway := class == hcmGateway
	h := &hcmv3.HttpConnectionManager{
		StatPrefix:        statPrefix,
		UseRemoteAddress:  wrapperspb.Bool(gateway),
		NormalizePath:     wrapperspb.Bool(true),
		StreamIdleTimeout: durationpb.New(0),
		UpgradeConfigs:    []*hcmv3.HttpConnectionManager_UpgradeConfig{{UpgradeType: "websocket"}},
		Proxy_100Continue: true,
	}
	if class != hcmInbound {
		h.HttpFilters = append(h.HttpFilters, alpnFilter)
	}
	h.HttpFilters = append(h.HttpFilters,
		&hcmv3.HttpFilter{Name: faultFilter, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&faultv3.HTTPFault{})}},
		&hcmv3.HttpFilter{Name: corsFilter, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&corsv3.Cors{})}},
		&hcmv3.HttpFilter{Name: routerFilter, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&routerv3.Router{})}})
	if inline != nil {
		h.RouteSpecifier = &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: inline}
	} else {
		h.RouteSpecifier = &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{ConfigSource: adsConfigSource(), RouteConfigName: rds}}
	}
	if gateway {
		// A gateway enforces the policies selecting it, as a sidecar does inbound.
		h.HttpFilters = append(b.inboundAuthz().HTTP(), h.HttpFilters...)
		b.setClientCertDetails(h, true)
	}
	return h
}

func hcmFilterOf(h *hcmv3.HttpConnectionManager) *listenerv3.Filter {
	return &listenerv3.Filter{Name: hcmFilter, ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(h)}}
}

func tcpProxy(statPrefix, cluster string) *listenerv3.Filter {
	return tcpProxyFilterOf(&tcpv3.TcpProxy{StatPrefix: statPrefix,
		ClusterSpecifier: &tcpv3.TcpProxy_Cluster{Cluster: cluster}})
}

func tcpProxyFilterOf(t *tcpv3.TcpProxy) *listenerv3.Filter {
	return &listenerv3.Filter{Name: tcpProxyFilter, ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(t)}}
}

// outboundListener collects what goes into one outbound listener before it is built.
type outboundListener struct {
	name string
	ip   string
	port uint32
	// rds names the route configuration of the HTTP chain, which http_inspector's ALPN
	// chooses; empty for no HTTP chain. A sniffed service with a VIP has its own,
	// "<host>:<port>" (sniffedHost), the wildcard listener shares "<port>".
	rds         string
	sniffedHost string
	// matched are the services a chain match tells apart: TLS ones by SNI, those of a
	// ServiceEntry's CIDR address by destination range (and SNI for TLS).
	matched []tcpChain
	tcp     *tcpChain // the one TCP service that takes every connection no other chain matches
}

type tcpChain struct {
	host  string
	proto protocol
	// mongo: a MONGO port, which Envoy's mongo_proxy decodes before tcp_proxy, as istiod does.
	mongo bool
	sni   []string // nil: any server name
	cidrs []string // nil: any destination
	proxy *tcpv3.TcpProxy
}

// sameMatch reports whether two chains match the same connections, which Envoy refuses on one
// listener: same server names and same destination ranges once masked (1.2.3.4/8 is 1.5.6.7/8).
func (c tcpChain) sameMatch(o tcpChain) bool {
	masked := func(cidrs []string) []string {
		var out []string
		for _, s := range cidrs {
			if p, ok := parseRange(s); ok {
				out = append(out, p.Masked().String())
			}
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	return slices.Equal(c.sni, o.sni) && slices.Equal(masked(c.cidrs), masked(o.cidrs))
}

// parseRange reads a destination range: a CIDR, or an IP standing for itself alone.
func parseRange(s string) (netip.Prefix, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return netip.PrefixFrom(a, a.BitLen()), true
	}
	p, err := netip.ParsePrefix(s)
	return p, err == nil
}

// plaintextHTTPALPNs are the protocols http_inspector reports for HTTP/1.1 and cleartext HTTP/2
// (istiod's list without PILOT_HTTP10).
var plaintextHTTPALPNs = []string{"http/1.1", "h2c"}

// outboundListeners: one wildcard listener per HTTP port, routed by RDS "<port>"; one per
// service VIP and TCP port (wildcard when the service has no VIP), as istiod does. Listeners
// do not bind: iptables sends traffic to virtualOutbound, which hands it over.
//
// On a wildcard listener HTTP, TLS (by SNI) and TCP services of one port share the listener
// as in istiod: http_inspector sends plaintext HTTP to the HTTP manager, TLS goes by SNI, and
// what matches nothing goes to the port's TCP service if there is one, else to the outbound
// traffic policy's PassthroughFilterChain, so a destination outside the registry on a known
// port is passed through (ALLOW_ANY) or dropped (REGISTRY_ONLY) rather than broken.
//
// A ServiceEntry address that is a CIDR range cannot be a listener's address: its service
// gets a chain matching the range (prefix_ranges) on the wildcard listener instead.
//
// A port whose protocol is not declared gets both: the service's TCP chain and an HTTP chain
// for what http_inspector finds to be plaintext HTTP, so HTTP VirtualServices apply to it.
func (b *builder) outboundListeners() []*listenerv3.Listener {
	entries := b.outboundEntries()
	out := make([]*listenerv3.Listener, 0, len(entries))
	for _, ol := range entries {
		out = append(out, b.outboundListener(ol))
	}
	return out
}

// outboundEntries plans the outbound listeners (see outboundListeners), in service order.
func (b *builder) outboundEntries() []*outboundListener {
	byName := map[string]*outboundListener{}
	var order []*outboundListener
	listener := func(ip string, port uint32) *outboundListener {
		name := ip + "_" + itoa(port)
		if ol := byName[name]; ol != nil {
			return ol
		}
		ol := &outboundListener{name: name, ip: ip, port: port}
		byName[name] = ol
		order = append(order, ol)
		return ol
	}
	for _, svc := range b.services {
		host := svc.Spec.GetHostname()
		for _, p := range b.visiblePorts(svc) {
			proto := portProtocol(p)
			if proto.isHTTP() {
				ol := listener(wildcardIP, p.GetNumber())
				ol.rds, ol.sniffedHost = itoa(p.GetNumber()), ""
				continue
			}
			base := tcpChain{host: host, proto: proto, mongo: isMongo(p.GetProtocol())}
			for _, addr := range b.tcpListenAddresses(svc) {
				chain, ip := base, addr
				if strings.Contains(addr, "/") {
					chain.cidrs, ip = []string{addr}, wildcardIP
				}
				ol := listener(ip, p.GetNumber())
				if proto == protoSniffed && ol.rds == "" {
					ol.rds = itoa(p.GetNumber())
					if ip != wildcardIP {
						ol.rds, ol.sniffedHost = host+":"+itoa(p.GetNumber()), host
					}
				}
				if ip == wildcardIP && proto == protoTLS {
					chain.sni = []string{host}
				}
				var chains []tcpChain
				if proto == protoTLS {
					chains = b.tlsRouteChains(host, p.GetNumber(), chain.cidrs)
				}
				if len(chains) == 0 {
					chains = b.tcpRouteChains(chain, p.GetNumber())
				}
				for _, chain := range chains {
					var taken *tcpChain
					switch {
					case chain.sni != nil || chain.cidrs != nil:
						if i := slices.IndexFunc(ol.matched, chain.sameMatch); i >= 0 {
							taken = &ol.matched[i]
							break
						}
						ol.matched = append(ol.matched, chain)
					case ol.tcp == nil:
						ol.tcp = &chain
					default:
						taken = ol.tcp
					}
					if taken != nil {
						b.log.Debug("skipping conflicting outbound listener", "listener", ol.name, "host", host)
						b.report(model.MetricOutboundTCPConflict, ol.name, fmt.Sprintf("Listener=%s Accepted=%s Rejected=%s (%s)",
							ol.name, taken.proto.listenerProtocol(), proto.listenerProtocol(), host))
					}
				}
			}
		}
	}
	return order
}

// tcpListenAddresses are the addresses of a service's listeners for its non-HTTP ports, IPs or
// CIDR ranges: every address of a ServiceEntry (istiod makes a service of each), the first VIP
// of other registries; without VIP, the auto-allocated address when the proxy uses them, else the
// wildcard, or the endpoints (see endpointListenIPs).
func (b *builder) tcpListenAddresses(svc *model.Service) []string {
	addrs := svc.Spec.GetAddresses()
	if len(addrs) > 0 && addrs[0] != "" {
		if svc.Spec.GetRegistry() != "serviceentry" {
			return addrs[:1]
		}
		return slices.DeleteFunc(slices.Clone(addrs), func(a string) bool { return a == "" })
	}
	if auto := b.autoAddresses(svc); len(auto) > 0 {
		return auto[:1] // istiod's GetAddressForProxy: one listener, on the first family's
	}
	if model.ListensPerEndpoint(svc.Spec) {
		if eps, ok := b.endpointListenIPs(svc); ok {
			return eps
		}
	}
	return []string{wildcardIP}
}

// endpointListenIPs are the addresses of the listeners istiod gives a service without VIP nor
// resolution on its non-HTTP ports, which a wildcard listener could not tell apart: one per
// endpoint (IP addresses only), but the proxy's own, whose traffic to itself does not pass
// through outbound listeners. ok is false for a service outside Kubernetes without endpoints,
// which keeps the wildcard listener; a Kubernetes service without endpoints gets none.
func (b *builder) endpointListenIPs(svc *model.Service) (ips []string, ok bool) {
	if len(svc.Endpoints) == 0 && svc.Spec.GetRegistry() != "kubernetes" {
		return nil, false
	}
	for _, ep := range svc.Endpoints {
		a := ep.GetAddress()
		if _, err := netip.ParseAddr(a); err != nil || b.isOwnIP(a) || slices.Contains(ips, a) {
			continue
		}
		ips = append(ips, a)
	}
	return ips, true
}

// isOwnIP reports whether ip is the proxy's primary address.
func (b *builder) isOwnIP(ip string) bool { return len(b.proxy.IPs) > 0 && b.proxy.IPs[0] == ip }

func (b *builder) outboundListener(ol *outboundListener) *listenerv3.Listener {
	l := &listenerv3.Listener{
		Name:                             ol.name,
		Address:                          translate.SocketAddress(ol.ip, ol.port),
		BindToPort:                       wrapperspb.Bool(false),
		TrafficDirection:                 corev3.TrafficDirection_OUTBOUND,
		ContinueOnListenerFiltersTimeout: true,
		ListenerFiltersTimeout:           durationpb.New(0),
	}
	if slices.ContainsFunc(ol.matched, func(c tcpChain) bool { return c.sni != nil }) {
		l.ListenerFilters = append(l.ListenerFilters, listenerFilter(tlsInspectorFilter,
			&tlsinspectorv3.TlsInspector{InitialReadBufferSize: wrapperspb.UInt32(512)}))
	}
	if ol.rds != "" {
		hcm := b.hcm("outbound_"+ol.name, ol.rds, nil, hcmOutbound)
		l.FilterChains = append(l.FilterChains, &listenerv3.FilterChain{
			FilterChainMatch: &listenerv3.FilterChainMatch{TransportProtocol: "raw_buffer",
				ApplicationProtocols: plaintextHTTPALPNs},
			Filters:                       []*listenerv3.Filter{hcmFilterOf(hcm)},
			TransportSocketConnectTimeout: durationpb.New(transportSocketConnectTimeout),
		})
		l.ListenerFilters = append(l.ListenerFilters, listenerFilter(httpInspectorFilter, &httpinspectorv3.HttpInspector{}))
		l.ListenerFiltersTimeout = b.protocolDetectionTimeout()
	}
	slices.SortStableFunc(ol.matched, func(a, b tcpChain) int {
		return cmp.Or(cmp.Compare(a.host, b.host), slices.Compare(a.cidrs, b.cidrs))
	})
	for _, c := range ol.matched {
		fc := serviceChain(c)
		fc.FilterChainMatch = &listenerv3.FilterChainMatch{ServerNames: c.sni}
		for _, cidr := range slices.Sorted(slices.Values(c.cidrs)) { // sorted, as istiod writes them
			p, ok := parseRange(cidr)
			if !ok {
				b.log.Debug("skipping destination range that is no IP nor CIDR", "range", cidr, "host", c.host)
				continue
			}
			fc.FilterChainMatch.PrefixRanges = append(fc.FilterChainMatch.PrefixRanges, &corev3.CidrRange{
				AddressPrefix: p.Addr().String(), PrefixLen: wrapperspb.UInt32(uint32(p.Bits()))})
		}
		l.FilterChains = append(l.FilterChains, fc)
	}
	switch {
	case ol.tcp != nil && len(l.FilterChains) == 0:
		l.FilterChains = []*listenerv3.FilterChain{serviceChain(*ol.tcp)}
	case ol.tcp != nil:
		l.DefaultFilterChain = serviceChain(*ol.tcp)
	default:
		fallback := b.outboundFallbackCluster()
		l.DefaultFilterChain = &listenerv3.FilterChain{
			Name:             passthroughFilterChain,
			FilterChainMatch: &listenerv3.FilterChainMatch{},
			Filters:          []*listenerv3.Filter{tcpProxy(fallback, fallback)},
		}
	}
	return l
}

// serviceChain is a filter chain forwarding to a service; istiod bounds the transport
// handshake of every such chain, against slow-handshake exhaustion.
func serviceChain(c tcpChain) *listenerv3.FilterChain {
	var filters []*listenerv3.Filter
	if c.mongo {
		filters = append(filters, mongoProxy(c.proxy.GetStatPrefix()))
	}
	return &listenerv3.FilterChain{Filters: append(filters, tcpProxyFilterOf(c.proxy)),
		TransportSocketConnectTimeout: durationpb.New(transportSocketConnectTimeout)}
}

func isMongo(protocol string) bool { return strings.EqualFold(protocol, "MONGO") }

func isGRPC(protocol string) bool {
	return strings.EqualFold(protocol, "GRPC") || strings.EqualFold(protocol, "GRPC-WEB")
}

// mongoProxy decodes MongoDB's wire protocol for its statistics; istiod adds it by default
// (PILOT_ENABLE_MONGO_FILTER) before the tcp_proxy of MONGO ports, with the same stat prefix.
func mongoProxy(statPrefix string) *listenerv3.Filter {
	return &listenerv3.Filter{Name: mongoProxyFilter, ConfigType: &listenerv3.Filter_TypedConfig{
		TypedConfig: mustAny(&mongov3.MongoProxy{StatPrefix: statPrefix})}}
}

// protocolDetectionTimeout is how long http_inspector waits for the client to speak first:
// the mesh's protocolDetectionTimeout, istiod's default 0 meaning no limit.
func (b *builder) protocolDetectionTimeout() *durationpb.Duration {
	if d := b.snap.Mesh.GetProtocolDetectionTimeout(); d != nil {
		return d
	}
	return durationpb.New(0)
}

func listenerFilter(name string, cfg proto.Message) *listenerv3.ListenerFilter {
	return &listenerv3.ListenerFilter{Name: name, ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: mustAny(cfg)}}
}

// tcpRouteChains are the chains of a port from the tcp routes of its VirtualService, as
// istiod's, each a copy of base (the service's chain on one address): the routes apply in
// order, those whose matches for this sidecar and port all name destinationSubnets as chains
// on those ranges, until one applies to every destination of base; else the service's own
// cluster takes the rest.
func (b *builder) tcpRouteChains(base tcpChain, port uint32) []tcpChain {
	def := ClusterName(port, "", base.host)
	var out []tcpChain
	if vs := b.binds.VirtualService(base.host); vs != nil {
		for _, r := range vs.Spec.GetTcp() {
			tp := b.routeProxy(vs, r.GetRoute(), base.host, port, def)
			if tp == nil {
				continue
			}
			all := len(r.GetMatch()) == 0
			var subnets []string
			for _, m := range r.GetMatch() {
				if !b.l4Applies(m, port) {
					continue
				}
				if len(m.GetDestinationSubnets()) == 0 {
					all = true
					break
				}
				subnets = append(subnets, m.GetDestinationSubnets()...)
			}
			c := base
			c.proxy = tp
			if all {
				return append(out, c)
			}
			if len(subnets) == 0 {
				continue
			}
			c.cidrs = subnets
			out = append(out, c)
			if c.sameMatch(base) {
				return out
			}
		}
	}
	base.proxy = b.withDestinationRule(&tcpv3.TcpProxy{StatPrefix: def, ClusterSpecifier: &tcpv3.TcpProxy_Cluster{Cluster: def}},
		base.host, "", true)
	return append(out, base)
}

// withDestinationRule applies to tp what istiod takes from the DestinationRule of host (the
// first destination's): the rule's own (not port-level or subset) tcp idleTimeout and
// maxConnectionDuration; and for a lone destination (subset) a consistent hash on the source
// IP, the subset's load balancer deciding when it has one, since a ring-hash cluster without a
// hash key balances at random.
func (b *builder) withDestinationRule(tp *tcpv3.TcpProxy, host, subset string, lone bool) *tcpv3.TcpProxy {
	dr := specOf(b.binds.DestinationRule(host))
	if dr == nil {
		return tp
	}
	tcp := dr.GetTrafficPolicy().GetConnectionPool().GetTcp()
	tp.IdleTimeout = tcp.GetIdleTimeout()
	tp.MaxDownstreamConnectionDuration = tcp.GetMaxConnectionDuration()
	if !lone {
		return tp
	}
	sourceIP := dr.GetTrafficPolicy().GetLoadBalancer().GetConsistentHash().GetUseSourceIp()
	if lb := translate.Subset(dr, subset).GetTrafficPolicy().GetLoadBalancer(); lb != nil {
		sourceIP = lb.GetConsistentHash().GetUseSourceIp()
	}
	if sourceIP {
		tp.HashPolicy = []*typev3.HashPolicy{{PolicySpecifier: &typev3.HashPolicy_SourceIp_{SourceIp: &typev3.HashPolicy_SourceIp{}}}}
	}
	return tp
}

// routeProxy is the tcp_proxy to a tcp or tls route's destinations, nil when none is usable;
// statPrefix names the stats of a weighted split.
func (b *builder) routeProxy(vs *model.Config[*networking.VirtualService], routes []*networking.RouteDestination,
	host string, port uint32, statPrefix string) *tcpv3.TcpProxy {
	return b.tcpProxyFor(translate.WeightedDestinations(b.snap.Services, routes, vs.Namespace, host, port), statPrefix)
}

// tlsRouteChains are the chains the tls routes of a TLS port's VirtualService make, as
// istiod's: one per match that applies to this sidecar and port, matching its sniHosts ("*":
// any) and its destinationSubnets, else the address's range (cidrs), and forwarding to the
// route's destinations; of matches alike the first wins. None when no route applies, which
// leaves the service's own chain.
func (b *builder) tlsRouteChains(host string, port uint32, cidrs []string) []tcpChain {
	vs := b.binds.VirtualService(host)
	if vs == nil {
		return nil
	}
	var out []tcpChain
	for _, r := range vs.Spec.GetTls() {
		for _, m := range r.GetMatch() {
			if (m.GetPort() != 0 && m.GetPort() != port) || !b.sourceMatches(m.GetSourceLabels(), m.GetSourceNamespace(), m.GetGateways()) {
				continue
			}
			tp := b.routeProxy(vs, r.GetRoute(), host, port, ClusterName(port, "", host))
			if tp == nil {
				continue
			}
			c := tcpChain{host: host, proto: protoTLS, cidrs: cidrs, proxy: tp}
			if len(m.GetDestinationSubnets()) > 0 {
				c.cidrs = m.GetDestinationSubnets()
			}
			if !slices.Contains(m.GetSniHosts(), "*") {
				c.sni = slices.Sorted(slices.Values(m.GetSniHosts()))
			}
			if !slices.ContainsFunc(out, c.sameMatch) {
				out = append(out, c)
			}
		}
	}
	return out
}

// l4Applies reports whether a tcp route match's conditions on the client and port hold for
// this sidecar; its destinationSubnets are matched by the proxy (see tcpRouteChains).
func (b *builder) l4Applies(m *networking.L4MatchAttributes, port uint32) bool {
	return (m.GetPort() == 0 || m.GetPort() == port) &&
		b.sourceMatches(m.GetSourceLabels(), m.GetSourceNamespace(), m.GetGateways())
}

// sourceMatches checks a match's conditions on the client: the proxy itself.
func (b *builder) sourceMatches(labels map[string]string, ns string, gateways []string) bool {
	if ns != "" && ns != b.proxy.Namespace {
		return false
	}
	if len(labels) > 0 && !model.LabelsMatch(labels, b.proxy.Labels) {
		return false
	}
	if b.proxy.IsSidecar() && len(gateways) > 0 && !model.AppliesToMesh(gateways) {
		return false
	}
	return true
}
