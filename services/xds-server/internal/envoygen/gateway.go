package envoygen

import (
	"cmp"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tlsinspectorv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"

	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/services/xds-server/internal/translate"
)

// gatewayServer is one server of a Gateway selecting this proxy.
type gatewayServer struct {
	gateway string // "ns/name"
	gwNS    string
	gwName  string
	server  *networking.Server
	proto   protocol
	// listenPort is where the gateway pod listens for the server: the targetPort of the
	// server's port in a Service selecting the pod, else the server's port itself.
	listenPort uint32
}

// terminates reports whether the server ends TLS itself (SIMPLE, MUTUAL, ISTIO_MUTUAL); only
// HTTPS and TLS servers do, an HTTP server's tls block carries httpsRedirect only.
func (s gatewayServer) terminates() bool {
	if s.proto != protoTLS {
		return false
	}
	switch s.server.GetTls().GetMode() {
	case networking.ServerTLSSettings_SIMPLE, networking.ServerTLSSettings_MUTUAL,
		networking.ServerTLSSettings_ISTIO_MUTUAL, networking.ServerTLSSettings_OPTIONAL_MUTUAL:
		return s.server.GetTls() != nil
	}
	return false
}

// passthrough reports whether the server forwards TLS untouched, routed by SNI. The check on
// Tls itself matters: PASSTHROUGH is the enum's zero value.
func (s gatewayServer) passthrough() bool {
	return s.proto == protoTLS && s.server.GetTls() != nil &&
		s.server.GetTls().GetMode() == networking.ServerTLSSettings_PASSTHROUGH
}

// autoPassthrough reports whether the server routes mTLS by its SNI to the SNI-DNAT clusters
// (an east-west gateway).
func (s gatewayServer) autoPassthrough() bool {
	return s.proto == protoTLS && s.server.GetTls().GetMode() == networking.ServerTLSSettings_AUTO_PASSTHROUGH
}

// httpRouteName is the RDS name of an HTTP-speaking server: one per listening port for
// plaintext, one per server for TLS-terminating ones, named, as istiod names them, by the
// server's own port.
func (s gatewayServer) httpRouteName() string {
	if s.terminates() {
		return "https." + itoa(s.server.GetPort().GetNumber()) + "." + s.server.GetPort().GetName() + "." + s.gwName + "." + s.gwNS
	}
	return "http." + itoa(s.listenPort)
}

// gatewayServers lists the servers of the Gateways whose selector matches the proxy's labels.
func (b *builder) gatewayServers() []gatewayServer {
	var out []gatewayServer
	ports := b.ix.gatewayPorts(b.proxy)
	for i := range b.snap.Gateways {
		gw := &b.snap.Gateways[i]
		if !model.LabelsMatch(gw.Spec.GetSelector(), b.proxy.Labels) {
			continue
		}
		for _, s := range gw.Spec.GetServers() {
			if s.GetPort().GetNumber() == 0 {
				continue
			}
			out = append(out, gatewayServer{gateway: gw.Namespace + "/" + gw.Name, gwNS: gw.Namespace, gwName: gw.Name,
				server: s, proto: parseProtocol(s.GetPort().GetProtocol()),
				listenPort: cmp.Or(ports[s.GetPort().GetNumber()], s.GetPort().GetNumber())})
		}
	}
	return out
}

// DisableGatewayPortTranslationLabel on a Service keeps its ports from translating Gateway
// ports (istiod's, for Knative).
const DisableGatewayPortTranslationLabel = "experimental.istio.io/disable-gateway-port-translation"

// gatewayPorts maps service ports to the ports the gateway pod listens on, from the services
// that have the pod among their endpoints, as istiod translates Gateway ports (resolvePorts):
// a Gateway server on port 80 of a Service whose targetPort is 8080 listens on 8080, since the
// Service delivers there. The first service (by hostname) mapping a port wins. A named
// targetPort the pod does not declare is left out of its EndpointSlice, so it maps nothing,
// and a port no Service maps is listened on as written.
func (ix *snapIndex) gatewayPorts(proxy *model.Proxy) map[uint32]uint32 {
	out := map[uint32]uint32{}
	for _, ip := range proxy.IPs {
		for _, e := range ix.byIP[ip] {
			if _, off := e.svc.Spec.GetLabels()[DisableGatewayPortTranslationLabel]; off {
				continue
			}
			for _, p := range e.svc.Spec.GetPorts() {
				if _, done := out[p.GetNumber()]; done {
					continue
				}
				if _, ok := e.ep.GetPorts()[p.GetName()]; len(e.ep.GetPorts()) > 0 && !ok {
					continue // unresolved named targetPort
				}
				if t := translate.EndpointPort(e.ep, p); t != 0 {
					out[p.GetNumber()] = t
				}
			}
		}
	}
	return out
}

// serverHosts splits a server's "ns/host" entries into the host parts allowed for a
// VirtualService of namespace vsNS.
func serverHosts(s gatewayServer, vsNS string) []string {
	var out []string
	for _, h := range s.server.GetHosts() {
		ns, host, ok := strings.Cut(h, "/")
		if !ok {
			ns, host = "*", h
		}
		if ns == "." {
			ns = s.gwNS
		}
		if vsNS != "" && ns != "*" && ns != vsNS {
			continue
		}
		out = append(out, host)
	}
	return out
}

// sniNames are the server names a TLS filter chain matches; none for a "*" host.
func sniNames(hosts []string) []string {
	var out []string
	for _, h := range hosts {
		if h == "*" {
			return nil
		}
		out = append(out, h)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// intersectHost returns the narrower of two hosts when one matches the other.
func intersectHost(a, b string) (string, bool) {
	switch {
	case model.HostMatches(a, b):
		return b, true
	case model.HostMatches(b, a):
		return a, true
	}
	return "", false
}

func (b *builder) gatewayListeners() []*listenerv3.Listener {
	byPort := map[uint32][]gatewayServer{}
	var ports []uint32
	for _, s := range b.gatewayServers() {
		p := s.listenPort
		if byPort[p] == nil {
			ports = append(ports, p)
		}
		byPort[p] = append(byPort[p], s)
	}
	slices.Sort(ports)
	var out []*listenerv3.Listener
	for _, port := range ports {
		name := wildcardIP + "_" + itoa(port)
		l := &listenerv3.Listener{Name: name, Address: translate.SocketAddress(wildcardIP, port),
			TrafficDirection: corev3.TrafficDirection_OUTBOUND}
		seen := map[string]bool{}
		addChain := func(fc *listenerv3.FilterChain) {
			// Envoy refuses two filter chains with the same match.
			key := strings.Join(fc.GetFilterChainMatch().GetServerNames(), ",")
			if seen[key] {
				b.log.Debug("skipping gateway server whose hosts another server on the port already serves",
					"listener", name, "serverNames", key)
				return
			}
			seen[key] = true
			l.FilterChains = append(l.FilterChains, fc)
		}
		httpDone := false
		for _, s := range byPort[port] {
			log := b.log.With("gateway", s.gateway, "port", port)
			if tls := s.server.GetTls(); s.terminates() && tls.GetMode() != networking.ServerTLSSettings_ISTIO_MUTUAL {
				creds := tls.GetCredentialNames()
				if tls.GetCredentialName() != "" {
					creds = []string{tls.GetCredentialName()}
				}
				for _, cred := range creds {
					b.credentialNotServed(credentialResource(cred))
				}
				if m := tls.GetMode(); len(creds) > 0 && (m == networking.ServerTLSSettings_MUTUAL || m == networking.ServerTLSSettings_OPTIONAL_MUTUAL) {
					b.credentialNotServed(cmp.Or(tls.GetCaCertCredentialName(), credentialResource(creds[0])+"-cacert"))
				}
			}
			// VirtualService port matches and default destination ports are the server's.
			serverPort := s.server.GetPort().GetNumber()
			switch {
			case s.terminates() && strings.EqualFold(s.server.GetPort().GetProtocol(), "HTTPS"):
				hcm := b.hcm("outbound_"+name, s.httpRouteName(), nil, hcmGateway)
				addChain(&listenerv3.FilterChain{
					FilterChainMatch: &listenerv3.FilterChainMatch{ServerNames: sniNames(serverHosts(s, ""))},
					Filters:          []*listenerv3.Filter{hcmFilterOf(hcm)},
					TransportSocket:  downstreamTLS(s.server.GetTls(), true),
				})
			case s.proto.isHTTP():
				if httpDone {
					continue // plaintext servers on a port share one chain and route config
				}
				httpDone = true
				addChain(&listenerv3.FilterChain{Filters: []*listenerv3.Filter{
					hcmFilterOf(b.hcm("outbound_"+name, s.httpRouteName(), nil, hcmGateway))}})
			case s.autoPassthrough():
				for _, fc := range b.autoPassthroughChains(s) {
					addChain(fc)
				}
			case s.passthrough():
				for _, fc := range b.passthroughChains(s, serverPort) {
					addChain(fc)
				}
			case s.proto == protoTCP || s.terminates():
				tp := b.gatewayTCPRoute(s, serverPort)
				if tp == nil {
					log.Debug("no tcp route for gateway server")
					continue
				}
				fc := &listenerv3.FilterChain{Filters: append(b.inboundAuthz().TCP(), tcpProxyFilterOf(tp))}
				if s.terminates() {
					fc.FilterChainMatch = &listenerv3.FilterChainMatch{ServerNames: sniNames(serverHosts(s, ""))}
					fc.TransportSocket = downstreamTLS(s.server.GetTls(), false)
				}
				addChain(fc)
			default:
				log.Debug("unsupported gateway server", "protocol", s.server.GetPort().GetProtocol(),
					"tlsMode", s.server.GetTls().GetMode().String())
			}
		}
		if len(l.FilterChains) == 0 {
			continue
		}
		for _, fc := range l.FilterChains {
			if len(fc.GetFilterChainMatch().GetServerNames()) > 0 || fc.TransportSocket != nil {
				l.ListenerFilters = []*listenerv3.ListenerFilter{listenerFilter(tlsInspectorFilter,
					&tlsinspectorv3.TlsInspector{InitialReadBufferSize: wrapperspb.UInt32(512)})}
				break
			}
		}
		// As istiod: a client gets 15 s to finish its TLS handshake (a stalled one no longer
		// holds a connection), and each wakeup accepts one connection, spreading them over
		// Envoy's workers.
		for _, fc := range l.FilterChains {
			fc.TransportSocketConnectTimeout = durationpb.New(transportSocketConnectTimeout)
		}
		l.MaxConnectionsToAcceptPerSocketEvent = wrapperspb.UInt32(1)
		out = append(out, l)
	}
	return out
}

// boundVirtualServices are the VirtualServices attached to a gateway that the gateway proxy's
// namespace sees (exportTo), in istiod's precedence: its namespace's own, those exported to it
// by name, then the public ones, each oldest first.
func (b *builder) boundVirtualServices(gateway string) []*model.Config[*networking.VirtualService] {
	return b.snap.VirtualServicesFor(b.proxy.Namespace, func(vs *model.Config[*networking.VirtualService]) bool {
		return slices.ContainsFunc(vs.Spec.GetGateways(), func(g string) bool { return qualifyGateway(g, vs.Namespace) == gateway })
	})
}

// passthroughChains route TLS by SNI without terminating it, from the VirtualServices' tls
// routes: one chain per route match.
func (b *builder) passthroughChains(s gatewayServer, port uint32) []*listenerv3.FilterChain {
	var out []*listenerv3.FilterChain
	for _, vs := range b.boundVirtualServices(s.gateway) {
		hosts := serverHosts(s, vs.Namespace)
		for _, tr := range vs.Spec.GetTls() {
			for _, m := range tr.GetMatch() {
				if m.GetPort() != 0 && m.GetPort() != port {
					continue
				}
				if len(m.GetGateways()) > 0 && !(gatewayFilter{s.gateway: true}).accepts(m.GetGateways(), vs.Namespace) {
					continue
				}
				var sni []string
				for _, h := range m.GetSniHosts() {
					for _, sh := range hosts {
						if x, ok := intersectHost(sh, h); ok {
							sni = append(sni, x)
						}
					}
				}
				if len(sni) == 0 {
					continue
				}
				dests := translate.WeightedDestinations(b.snap.Services, tr.GetRoute(), vs.Namespace, "", port)
				tp := b.tcpProxyFor(dests, "")
				if tp == nil {
					continue
				}
				slices.Sort(sni)
				out = append(out, &listenerv3.FilterChain{
					FilterChainMatch: &listenerv3.FilterChainMatch{ServerNames: slices.Compact(sni)},
					Filters:          append(b.inboundAuthz().TCP(), tcpProxyFilterOf(tp)),
				})
			}
		}
	}
	return out
}

// istioMTLSALPNs are the ALPNs Istio's mTLS clients offer; an AUTO_PASSTHROUGH chain matches
// only connections offering one of them.
var istioMTLSALPNs = []string{"istio", "istio-peer-exchange", "istio-http/1.0", "istio-http/1.1", "istio-h2"}

// autoPassthroughChains route mTLS connections by SNI, as istiod does for an AUTO_PASSTHROUGH
// server: one chain per port (and DestinationRule subset) of each mesh service the server's
// hosts match, matching the SNI naming its SNI-DNAT cluster, to which it forwards the
// connection untouched. No authorization applies here: the workload behind checks the mTLS.
func (b *builder) autoPassthroughChains(s gatewayServer) []*listenerv3.FilterChain {
	hosts := serverHosts(s, "")
	var out []*listenerv3.FilterChain
	for _, svc := range b.services {
		host := svc.Spec.GetHostname()
		if svc.Spec.GetMeshExternal() || !slices.ContainsFunc(hosts, func(h string) bool { return model.HostMatches(h, host) }) {
			continue
		}
		dr := specOf(b.binds.DestinationRule(host))
		for _, port := range svc.Spec.GetPorts() {
			if strings.EqualFold(port.GetProtocol(), "UDP") {
				continue
			}
			for _, ss := range append([]*networking.Subset{nil}, translate.Subsets(dr)...) {
				name := SNIDNATClusterName(port.GetNumber(), ss.GetName(), host)
				tp := b.withDestinationRule(&tcpv3.TcpProxy{StatPrefix: name,
					ClusterSpecifier: &tcpv3.TcpProxy_Cluster{Cluster: name}}, host, ss.GetName(), true)
				out = append(out, &listenerv3.FilterChain{
					FilterChainMatch: &listenerv3.FilterChainMatch{ServerNames: []string{name}, ApplicationProtocols: istioMTLSALPNs},
					Filters:          []*listenerv3.Filter{tcpProxyFilterOf(tp)},
				})
			}
		}
	}
	return out
}

func (b *builder) gatewayTCPRoute(s gatewayServer, port uint32) *tcpv3.TcpProxy {
	for _, vs := range b.boundVirtualServices(s.gateway) {
		if len(serverHosts(s, vs.Namespace)) == 0 {
			continue
		}
		for _, r := range vs.Spec.GetTcp() {
			ok := len(r.GetMatch()) == 0
			for _, m := range r.GetMatch() {
				if (m.GetPort() == 0 || m.GetPort() == port) &&
					(len(m.GetGateways()) == 0 || (gatewayFilter{s.gateway: true}).accepts(m.GetGateways(), vs.Namespace)) {
					ok = true
				}
			}
			if !ok {
				continue
			}
			if tp := b.tcpProxyFor(translate.WeightedDestinations(b.snap.Services, r.GetRoute(), vs.Namespace, "", port), ""); tp != nil {
				return tp
			}
		}
	}
	return nil
}

// tcpProxyFor is the tcp_proxy to dests, with what their DestinationRule asks of it (see
// withDestinationRule), as istiod; nil when there is none. statPrefix names a weighted split's
// stats ("": the first destination's cluster, as gateways name them).
func (b *builder) tcpProxyFor(dests []translate.WeightedDest, statPrefix string) *tcpv3.TcpProxy {
	switch len(dests) {
	case 0:
		return nil
	case 1:
		return b.withDestinationRule(&tcpv3.TcpProxy{StatPrefix: dests[0].Cluster,
			ClusterSpecifier: &tcpv3.TcpProxy_Cluster{Cluster: dests[0].Cluster}}, dests[0].Host, dests[0].Subset, true)
	}
	wc := &tcpv3.TcpProxy_WeightedCluster{}
	for _, d := range dests {
		wc.Clusters = append(wc.Clusters, &tcpv3.TcpProxy_WeightedCluster_ClusterWeight{Name: d.Cluster, Weight: d.Weight})
	}
	if statPrefix == "" {
		statPrefix = dests[0].Cluster
	}
	return b.withDestinationRule(&tcpv3.TcpProxy{StatPrefix: statPrefix,
		ClusterSpecifier: &tcpv3.TcpProxy_WeightedClusters{WeightedClusters: wc}}, dests[0].Host, "", false)
}

// downstreamTLS terminates TLS with certificates served over SDS: Kubernetes secrets as
// "kubernetes://<credentialName>" over ADS (see credentialSDS), files as
// "file-cert:<cert>~<key>" by the agent.
func downstreamTLS(t *networking.ServerTLSSettings, http bool) *corev3.TransportSocket {
	ctx := &tlsv3.DownstreamTlsContext{CommonTlsContext: &tlsv3.CommonTlsContext{}}
	common := ctx.CommonTlsContext
	if http {
		common.AlpnProtocols = []string{"h2", "http/1.1"}
	}
	var root *tlsv3.SdsSecretConfig
	switch {
	case t.GetMode() == networking.ServerTLSSettings_ISTIO_MUTUAL:
		common.TlsCertificateSdsSecretConfigs = []*tlsv3.SdsSecretConfig{sdsSecret("default")}
		root = sdsSecret("ROOTCA")
	case t.GetCredentialName() != "" || len(t.GetCredentialNames()) > 0:
		// credentialNames: several certificates (an RSA and an ECDSA one), as istiod.
		names := t.GetCredentialNames()
		if t.GetCredentialName() != "" {
			names = []string{t.GetCredentialName()}
		}
		for _, n := range names {
			common.TlsCertificateSdsSecretConfigs = append(common.TlsCertificateSdsSecretConfigs, credentialSDS(credentialResource(n)))
		}
		name := credentialResource(names[0])
		// caCertCredentialName names the client CA apart (a Gateway API frontend validation).
		root = credentialSDS(cmp.Or(t.GetCaCertCredentialName(), name+"-cacert"))
	default:
		common.TlsCertificateSdsSecretConfigs = []*tlsv3.SdsSecretConfig{
			sdsSecret("file-cert:" + t.GetServerCertificate() + "~" + t.GetPrivateKey())}
		if t.GetCaCertificates() != "" {
			root = sdsSecret("file-root:" + t.GetCaCertificates())
		}
	}
	if t.GetMode() != networking.ServerTLSSettings_SIMPLE && root != nil {
		v := &tlsv3.CertificateValidationContext{}
		for _, s := range t.GetSubjectAltNames() {
			v.MatchTypedSubjectAltNames = append(v.MatchTypedSubjectAltNames, &tlsv3.SubjectAltNameMatcher{
				SanType: tlsv3.SubjectAltNameMatcher_DNS,
				Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: s}}})
		}
		common.ValidationContextType = &tlsv3.CommonTlsContext_CombinedValidationContext{
			CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
				DefaultValidationContext: v, ValidationContextSdsSecretConfig: root}}
		ctx.RequireClientCertificate = wrapperspb.Bool(t.GetMode() != networking.ServerTLSSettings_OPTIONAL_MUTUAL)
	}
	if v, ok := tlsVersions[t.GetMinProtocolVersion()]; ok || t.GetMaxProtocolVersion() != 0 {
		common.TlsParams = &tlsv3.TlsParameters{TlsMinimumProtocolVersion: v,
			TlsMaximumProtocolVersion: tlsVersions[t.GetMaxProtocolVersion()]}
	}
	if cs := t.GetCipherSuites(); len(cs) > 0 {
		common.TlsParams = cmp.Or(common.TlsParams, &tlsv3.TlsParameters{})
		common.TlsParams.CipherSuites = cs
	}
	return &corev3.TransportSocket{Name: tlsTransportSocket,
		ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAny(ctx)}}
}

var tlsVersions = map[networking.ServerTLSSettings_TLSProtocol]tlsv3.TlsParameters_TlsProtocol{
	networking.ServerTLSSettings_TLSV1_0: tlsv3.TlsParameters_TLSv1_0,
	networking.ServerTLSSettings_TLSV1_1: tlsv3.TlsParameters_TLSv1_1,
	networking.ServerTLSSettings_TLSV1_2: tlsv3.TlsParameters_TLSv1_2,
	networking.ServerTLSSettings_TLSV1_3: tlsv3.TlsParameters_TLSv1_3,
}

// gatewayRoutes builds a route configuration per HTTP route name the gateway's listeners use.
func (b *builder) gatewayRoutes() []*routev3.RouteConfiguration {
	byName := map[string][]gatewayServer{}
	for _, s := range b.gatewayServers() {
		if s.passthrough() {
			continue
		}
		if s.proto.isHTTP() || (s.terminates() && strings.EqualFold(s.server.GetPort().GetProtocol(), "HTTPS")) {
			byName[s.httpRouteName()] = append(byName[s.httpRouteName()], s)
		}
	}
	var out []*routev3.RouteConfiguration
	for _, name := range translate.SortedKeys(byName) {
		out = append(out, b.gatewayRouteConfig(name, byName[name]))
	}
	return out
}

// redirectHosts are the hosts of an httpsRedirect server that get a redirecting virtual host
// of their own, lower-cased as istiod's. Hosts limited to a namespace ("ns/host") are left out:
// istiod writes them into the domain as they are ("ns/host"), which no Host header matches.
func redirectHosts(s gatewayServer) []string {
	var out []string
	for _, h := range s.server.GetHosts() {
		ns, host, ok := strings.Cut(h, "/")
		if ok && ns != "*" {
			continue
		}
		if !ok {
			host = ns
		}
		out = append(out, strings.ToLower(host))
	}
	return out
}

func (b *builder) gatewayRouteConfig(name string, servers []gatewayServer) *routev3.RouteConfiguration {
	rc := &routev3.RouteConfiguration{Name: name, ValidateClusters: wrapperspb.Bool(false),
		IgnorePortInHostMatching: true}
	port := servers[0].server.GetPort().GetNumber()
	vhosts := map[string]*routev3.VirtualHost{}
	added := map[string]bool{}
	for _, s := range servers {
		// Servers of several ports may share a listening port: each names its virtual hosts
		// and matches routes by its own, as istiod's.
		port := s.server.GetPort().GetNumber()
		// istiod sets require_tls on an HTTPS server's hosts too, where it changes nothing.
		redirect := s.server.GetTls().GetHttpsRedirect()
		for _, vs := range b.boundVirtualServices(s.gateway) {
			hosts := serverHosts(s, vs.Namespace)
			for _, vh := range vs.Spec.GetHosts() {
				vh = model.ResolveHost(vh, vs.Namespace)
				for _, sh := range hosts {
					host, ok := intersectHost(sh, vh)
					if !ok {
						continue
					}
					host = strings.ToLower(host)
					// A VirtualService reached through several servers or hosts adds its routes once.
					key := host + "\x00" + vs.Namespace + "/" + vs.Name
					if added[key] {
						continue
					}
					added[key] = true
					// Destinations without a port go to the service's only port, never the gateway's.
					routes := b.httpRoutes(vs, "", port, gatewayFilter{s.gateway: true}, s.server.GetTls() != nil)
					v := vhosts[host]
					if v == nil {
						// The route configuration ignores the port in Host headers, as istiod's.
						v = &routev3.VirtualHost{Name: host + ":" + itoa(port), Domains: []string{host},
							IncludeRequestAttemptCount: true}
						vhosts[host] = v
					}
					v.Routes = append(v.Routes, routes...)
					if redirect {
						v.RequireTls = routev3.VirtualHost_ALL
					}
				}
			}
		}
		if redirect {
			// A host no VirtualService routes still redirects plaintext requests to HTTPS.
			for _, host := range redirectHosts(s) {
				if vhosts[host] == nil {
					vhosts[host] = &routev3.VirtualHost{Name: host + ":" + itoa(port), Domains: []string{host},
						IncludeRequestAttemptCount: true, RequireTls: routev3.VirtualHost_ALL}
				}
			}
		}
	}
	for _, h := range translate.SortedKeys(vhosts) {
		v := vhosts[h]
		if len(v.Routes) > 0 || v.RequireTls == routev3.VirtualHost_ALL {
			// Several VirtualServices share the host: a catch-all of one must not hide the
			// others' routes, so catch-alls go last, as in istiod.
			var rest, catchAll []*routev3.Route
			for _, r := range v.Routes {
				if translate.MatchesAll(r.GetMatch()) {
					catchAll = append(catchAll, r)
				} else {
					rest = append(rest, r)
				}
			}
			v.Routes = append(rest, catchAll...)
			rc.VirtualHosts = append(rc.VirtualHosts, v)
		}
	}
	if len(rc.VirtualHosts) == 0 {
		// Like istiod: a port with nothing bound answers 404 rather than resetting.
		rc.VirtualHosts = []*routev3.VirtualHost{{Name: "blackhole:" + itoa(port), Domains: []string{"*"},
			Routes: []*routev3.Route{{Name: "blackhole", Match: &routev3.RouteMatch{
				PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
				Action: &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{Status: 404}}}}}}
	}
	return rc
}
