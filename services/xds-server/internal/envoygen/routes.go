package envoygen

import (
	"slices"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	corsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/services/xds-server/internal/translate"
)

func (b *builder) routes() []*routev3.RouteConfiguration {
	if b.proxy.IsRouter() {
		return sortByName(b.gatewayRoutes())
	}
	var out []*routev3.RouteConfiguration
	seen := map[string]bool{}
	for _, ol := range b.outboundEntries() {
		if ol.rds == "" || seen[ol.rds] {
			continue
		}
		seen[ol.rds] = true
		if ol.sniffedHost != "" {
			out = append(out, b.sniffedRouteConfig(ol.rds, ol.sniffedHost, ol.port))
		} else {
			out = append(out, b.sidecarRouteConfig(ol.port))
		}
	}
	return sortByName(out)
}

// sidecarRouteConfig is RDS "<port>": a virtual host per service with an HTTP or sniffed port
// of that number, and a catch-all per the outbound traffic policy.
func (b *builder) sidecarRouteConfig(port uint32) *routev3.RouteConfiguration {
	rc := &routev3.RouteConfiguration{Name: itoa(port), ValidateClusters: wrapperspb.Bool(false),
		IgnorePortInHostMatching: true}
	taken := map[string]bool{}
	if port == unregisteredHostsPort {
		rc.VirtualHosts = b.unregisteredHostVirtualHosts(port, taken)
	}
	for _, svc := range b.services {
		for _, p := range b.visiblePorts(svc) {
			if p.GetNumber() != port || !portProtocol(p).carriesHTTP() {
				continue
			}
			host := svc.Spec.GetHostname()
			var domains []string
			wanted := translate.Domains(svc.Spec, b.proxy.DNSDomain)
			for _, a := range b.autoAddresses(svc) {
				wanted = append(wanted, translate.HostLiteral(a))
			}
			for _, d := range wanted {
				// Envoy refuses a route configuration that repeats a domain.
				if taken[d] {
					b.log.Debug("domain already used by another virtual host", "domain", d, "host", host)
					continue
				}
				taken[d] = true
				domains = append(domains, d)
			}
			if len(domains) < len(wanted) {
				name := host + ":" + itoa(port)
				b.report(model.MetricDupDomain, name, "duplicate domain from service: "+name)
			}
			if len(domains) == 0 {
				continue
			}
			rc.VirtualHosts = append(rc.VirtualHosts, b.serviceVirtualHost(host, port, domains))
		}
	}
	sortByName(rc.VirtualHosts)
	rc.VirtualHosts = append(rc.VirtualHosts, b.catchAllVirtualHost())
	return rc
}

// unregisteredHostsPort is the only port whose routes istiod gives the hosts of VirtualServices
// that no service of that port answers.
const unregisteredHostsPort = 80

// unregisteredHostVirtualHosts are the virtual hosts istiod adds to RDS "80" for the hosts of
// mesh VirtualServices that no service with port 80 answers, such as an external host whose
// traffic the mesh sends to an egress gateway: named "<host>:80", matching the host alone,
// with its VirtualService's routes (none if no route applies to this proxy and port). They
// come before the services' hosts, which lose a domain already taken.
func (b *builder) unregisteredHostVirtualHosts(port uint32, taken map[string]bool) []*routev3.VirtualHost {
	var withPort []string
	for _, svc := range b.services {
		if slices.ContainsFunc(b.visiblePorts(svc), func(p *discoveryv1.Port) bool { return p.GetNumber() == port }) {
			withPort = append(withPort, svc.Spec.GetHostname())
		}
	}
	answered := func(host string) bool {
		return slices.ContainsFunc(withPort, func(h string) bool {
			return h == host || (strings.Contains(host+h, "*") && (model.HostMatches(host, h) || model.HostMatches(h, host)))
		})
	}
	var out []*routev3.VirtualHost
	// The mesh VirtualServices the proxy sees (exportTo, Sidecar imports), in istiod's order.
	for _, vs := range b.binds.VirtualServices() {
		for _, h := range vs.Spec.GetHosts() {
			host := strings.ToLower(model.ResolveHost(h, vs.Namespace))
			if answered(host) {
				continue
			}
			if b.sidecar != nil && !model.SidecarImportsPort(b.sidecar.Spec, b.sidecar.Namespace, vs.Namespace, host, port) {
				continue
			}
			routes := b.httpRoutes(vs, host, port, nil, false)
			if len(routes) == 0 {
				continue
			}
			name := host + ":" + itoa(port)
			if taken[host] {
				b.report(model.MetricDupDomain, name, "duplicate domain from virtual service: "+name)
				continue
			}
			taken[host] = true
			out = append(out, &routev3.VirtualHost{Name: name, Domains: []string{host},
				Routes: routes, IncludeRequestAttemptCount: true})
		}
	}
	return out
}

// sniffedRouteConfig is RDS "<host>:<port>" of the listener a sniffed service port has on its
// VIP: only that service, for every Host header, and no catch-all, as in istiod.
func (b *builder) sniffedRouteConfig(name, host string, port uint32) *routev3.RouteConfiguration {
	return &routev3.RouteConfiguration{Name: name, ValidateClusters: wrapperspb.Bool(false),
		IgnorePortInHostMatching: true,
		VirtualHosts:             []*routev3.VirtualHost{b.serviceVirtualHost(host, port, []string{"*"})}}
}

// serviceVirtualHost routes a service port's HTTP traffic: its VirtualService's routes, else
// the default route to the service.
func (b *builder) serviceVirtualHost(host string, port uint32, domains []string) *routev3.VirtualHost {
	var routes []*routev3.Route
	if vs := b.binds.VirtualService(host); vs != nil {
		routes = b.httpRoutes(vs, host, port, nil, false)
	}
	if len(routes) == 0 {
		routes = []*routev3.Route{b.defaultRoute(host, port)}
	}
	return &routev3.VirtualHost{Name: host + ":" + itoa(port), Domains: domains, Routes: routes,
		IncludeRequestAttemptCount: true}
}

func (b *builder) catchAllVirtualHost() *routev3.VirtualHost {
	match := &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}}
	if b.allowAny {
		return &routev3.VirtualHost{Name: "allow_any", Domains: []string{"*"}, IncludeRequestAttemptCount: true,
			Routes: []*routev3.Route{{Name: "allow_any", Match: match, Action: &routev3.Route_Route{Route: &routev3.RouteAction{
				ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: PassthroughCluster},
				Timeout:          durationpb.New(0),
				MaxGrpcTimeout:   durationpb.New(0), //nolint:staticcheck // as istiod, see forwardAction
			}}}}}
	}
	return &routev3.VirtualHost{Name: "block_all", Domains: []string{"*"}, IncludeRequestAttemptCount: true,
		Routes: []*routev3.Route{{Name: "block_all", Match: match, Action: &routev3.Route_DirectResponse{
			DirectResponse: &routev3.DirectResponseAction{Status: 502}}}}}
}

func (b *builder) defaultRoute(host string, port uint32) *routev3.Route {
	r := translate.DefaultRoute(ClusterName(port, "", host), b.hashPolicy(host, port, ""))
	r.GetRoute().MaxGrpcTimeout = r.GetRoute().GetTimeout() //nolint:staticcheck // as istiod, see forwardAction
	return r
}

// gatewayFilter says which gateway-level match conditions a route must meet: nil for the
// mesh (sidecars), else the names ("ns/name") of the gateways being built.
type gatewayFilter map[string]bool

func (g gatewayFilter) accepts(names []string, ns string) bool {
	if g == nil {
		return model.AppliesToMesh(names)
	}
	for _, n := range names {
		if g[qualifyGateway(n, ns)] {
			return true
		}
	}
	return false
}

// qualifyGateway writes a VirtualService's gateway reference as "ns/name".
func qualifyGateway(ref, ns string) string {
	if strings.Contains(ref, "/") {
		return ref
	}
	return ns + "/" + ref
}

// httpRoutes translates a VirtualService's http routes for one host and port. Routes are
// matched in order, so nothing after one that matches every request is kept, as in istiod.
// tls: the routes serve a gateway server with a tls block (redirects default to https).
func (b *builder) httpRoutes(vs *model.Config[*networking.VirtualService], host string, port uint32,
	gws gatewayFilter, tls bool) []*routev3.Route {
	vs = translate.WithDelegates(b.snap, vs, b.log)
	out, skipped := translate.HTTPRoutes(vs.Spec.GetHttp(), func(i int, hr *networking.HTTPRoute,
		m *networking.HTTPMatchRequest) (*routev3.Route, bool) {
		log := b.log.With("virtualService", vs.Namespace+"/"+vs.Name, "http", i, "port", port)
		if m.GetPort() != 0 && m.GetPort() != port {
			return nil, false
		}
		// As istiod's sourceMatchHTTP: a match naming gateways ignores its source conditions.
		if len(m.GetGateways()) > 0 {
			if !gws.accepts(m.GetGateways(), vs.Namespace) {
				return nil, false
			}
		} else if !b.sourceMatches(m.GetSourceLabels(), m.GetSourceNamespace(), nil) {
			return nil, false
		}
		r := translate.MatchRoute(hr, m, translate.Envoy, log)
		if r == nil {
			return nil, false
		}
		if !b.routeAction(r, hr, vs.Namespace, host, port, tls, m, vs.GatewayAPI, log) {
			return nil, true
		}
		if vs.GatewayAPI {
			translate.GatewaySemantics(r, translate.Envoy)
		}
		return r, false
	})
	if skipped > 0 {
		b.log.Debug("skipping http routes after one that matches every request",
			"virtualService", vs.Namespace+"/"+vs.Name, "port", port, "skipped", skipped)
	}
	return out
}

// routeAction fills r's action and per-route settings; false when the route has nothing usable.
func (b *builder) routeAction(r *routev3.Route, hr *networking.HTTPRoute, ns, host string, port uint32, tls bool,
	m *networking.HTTPMatchRequest, gatewayAPI bool, log interface{ Debug(string, ...any) }) bool {
	switch {
	case hr.GetRedirect() != nil:
		r.Action = &routev3.Route_Redirect{Redirect: redirect(hr.GetRedirect(), port, tls, log)}
	case hr.GetDirectResponse() != nil:
		dr := hr.GetDirectResponse()
		act := &routev3.DirectResponseAction{Status: dr.GetStatus()}
		switch body := dr.GetBody().GetSpecifier().(type) {
		case *networking.HTTPBody_String_:
			act.Body = &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: body.String_}}
		case *networking.HTTPBody_Bytes:
			act.Body = &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: body.Bytes}}
		}
		r.Action = &routev3.Route_DirectResponse{DirectResponse: act}
	case len(hr.GetRoute()) > 0:
		act := b.forwardAction(hr, ns, host, port, gatewayAPI, log)
		if act == nil {
			log.Debug("skipping http route without usable destination")
			return false
		}
		r.Action = &routev3.Route_Route{Route: act}
	default:
		log.Debug("skipping http route without destination, redirect or direct response")
		return false
	}
	if h := hr.GetHeaders(); h != nil {
		r.RequestHeadersToAdd, r.RequestHeadersToRemove = headerOps(h.GetRequest())
		r.ResponseHeadersToAdd, r.ResponseHeadersToRemove = headerOps(h.GetResponse())
	}
	// A lone destination's own header operations apply after the route's (so its set wins), as
	// istiod appends them; a split's go on each weighted cluster (forwardAction).
	if c := r.GetRoute().GetCluster(); c != "" {
		if h := b.destinationHeaders(hr, ns, host, port)[c]; h != nil {
			reqAdd, reqRemove := headerOps(h.GetRequest())
			respAdd, respRemove := headerOps(h.GetResponse())
			r.RequestHeadersToAdd = append(r.RequestHeadersToAdd, reqAdd...)
			r.RequestHeadersToRemove = append(r.RequestHeadersToRemove, reqRemove...)
			r.ResponseHeadersToAdd = append(r.ResponseHeadersToAdd, respAdd...)
			r.ResponseHeadersToRemove = append(r.ResponseHeadersToRemove, respRemove...)
		}
	}
	filters := map[string]*anypb.Any{}
	if f := hr.GetFault(); f != nil {
		if hf := translate.Fault(f, log); hf != nil {
			filters[faultFilter] = mustAny(hf)
		}
	}
	if c := hr.GetCorsPolicy(); c != nil {
		filters[corsFilter] = mustAny(corsPolicy(c))
	}
	if len(filters) > 0 {
		r.TypedPerFilterConfig = filters
	}
	return true
}

func (b *builder) forwardAction(hr *networking.HTTPRoute, ns, host string, port uint32, gatewayAPI bool,
	log interface{ Debug(string, ...any) }) *routev3.RouteAction {
	dests := translate.WeightedDestinations(b.snap.Services, hr.GetRoute(), ns, host, port)
	if gatewayAPI {
		dests = translate.GatewayAPIDestinations(b.snap.Services, hr.GetRoute(), ns, host, port)
	}
	if len(dests) == 0 {
		return nil
	}
	act := &routev3.RouteAction{Timeout: durationpb.New(0)}
	if len(dests) == 1 {
		act.ClusterSpecifier = &routev3.RouteAction_Cluster{Cluster: dests[0].Cluster}
	} else {
		wc := &routev3.WeightedCluster{}
		headers := b.destinationHeaders(hr, ns, host, port)
		for _, d := range dests {
			cw := &routev3.WeightedCluster_ClusterWeight{Name: d.Cluster, Weight: wrapperspb.UInt32(d.Weight)}
			if h := headers[d.Cluster]; h != nil {
				cw.RequestHeadersToAdd, cw.RequestHeadersToRemove = headerOps(h.GetRequest())
				cw.ResponseHeadersToAdd, cw.ResponseHeadersToRemove = headerOps(h.GetResponse())
			}
			wc.Clusters = append(wc.Clusters, cw)
		}
		act.ClusterSpecifier = &routev3.RouteAction_WeightedClusters{WeightedClusters: wc}
	}
	if t := hr.GetTimeout(); t != nil {
		act.Timeout = t
	}
	// As istiod: a gRPC client's grpc-timeout header bounds the request, up to the route's
	// timeout (0: no cap). istiod sets the deprecated field, as its replacement
	// (max_stream_duration) regressed in Envoy.
	act.MaxGrpcTimeout = act.Timeout //nolint:staticcheck // see above
	act.RetryPolicy = translate.RetryPolicy(hr.GetRetries())
	if rw := hr.GetRewrite(); rw != nil {
		if u := rw.GetUri(); u != "" {
			act.PrefixRewrite = u
		}
		if a := rw.GetAuthority(); a != "" {
			act.HostRewriteSpecifier = &routev3.RouteAction_HostRewriteLiteral{HostRewriteLiteral: a}
		}
	}
	if rr := hr.GetRewrite().GetUriRegexRewrite(); rr != nil && rr.GetMatch() != "" {
		act.PrefixRewrite = ""
		act.RegexRewrite = &matcherv3.RegexMatchAndSubstitute{
			Pattern: &matcherv3.RegexMatcher{Regex: rr.GetMatch()}, Substitution: rr.GetRewrite()}
	}
	act.RequestMirrorPolicies = b.mirrors(hr, ns, host, port)
	if h, p, subset, ok := translate.HashTarget(dests); ok {
		act.HashPolicy = b.hashPolicy(h, p, subset)
	}
	return act
}

// destinationHeaders are the header operations of a route's destinations, by cluster (the
// first destination of a cluster that sets any).
func (b *builder) destinationHeaders(hr *networking.HTTPRoute, ns, host string, port uint32) map[string]*networking.Headers {
	out := map[string]*networking.Headers{}
	for _, rd := range hr.GetRoute() {
		dest := rd.GetDestination()
		if rd.GetHeaders() == nil || dest.GetHost() == "" {
			continue
		}
		h := model.ResolveHost(dest.GetHost(), ns)
		c := ClusterName(translate.DestinationPort(b.snap.Services, dest, h, host, port), dest.GetSubset(), h)
		if out[c] == nil {
			out[c] = rd.GetHeaders()
		}
	}
	return out
}

func (b *builder) mirrors(hr *networking.HTTPRoute, ns, host string, port uint32) []*routev3.RouteAction_RequestMirrorPolicy {
	var out []*routev3.RouteAction_RequestMirrorPolicy
	add := func(dest *networking.Destination, frac *typev3.FractionalPercent) {
		if dest.GetHost() == "" {
			return
		}
		h := model.ResolveHost(dest.GetHost(), ns)
		p := translate.DestinationPort(b.snap.Services, dest, h, host, port)
		// As istiod: the mirrored request keeps its Host (Envoy would append "-shadow", which
		// the mirror's sidecar routes nowhere) and is not sampled for tracing.
		mp := &routev3.RouteAction_RequestMirrorPolicy{Cluster: ClusterName(p, dest.GetSubset(), h),
			DisableShadowHostSuffixAppend: true, TraceSampled: wrapperspb.Bool(false)}
		mp.RuntimeFraction = &corev3.RuntimeFractionalPercent{DefaultValue: frac}
		out = append(out, mp)
	}
	// A mirror's share as istiod writes it: a percentage in millionths, the deprecated integer
	// percent and no percentage (all) in hundredths; an explicit zero mirrors nothing.
	hundredths := func(n uint32) *typev3.FractionalPercent {
		return &typev3.FractionalPercent{Numerator: n, Denominator: typev3.FractionalPercent_HUNDRED}
	}
	share := func(pct *networking.Percent) *typev3.FractionalPercent {
		switch {
		case pct == nil:
			return hundredths(100)
		case pct.GetValue() > 0:
			return translate.FractionalPercent(pct.GetValue())
		}
		return nil
	}
	if m := hr.GetMirror(); m != nil {
		frac := share(hr.GetMirrorPercentage())
		if hr.GetMirrorPercentage() == nil && hr.GetMirrorPercent() != nil { //nolint:staticcheck // still honoured by Istio
			frac = nil
			if n := hr.GetMirrorPercent().GetValue(); n > 0 { //nolint:staticcheck
				frac = hundredths(n)
			}
		}
		if frac != nil {
			add(m, frac)
		}
	}
	for _, mp := range hr.GetMirrors() {
		if frac := share(mp.GetPercentage()); frac != nil {
			add(mp.GetDestination(), frac)
		}
	}
	return out
}

func redirect(r *networking.HTTPRedirect, port uint32, tls bool, log interface{ Debug(string, ...any) }) *routev3.RedirectAction {
	// As istiod, the path is always stated: the matched prefix replaced, else the uri (empty
	// keeps the request's).
	act := &routev3.RedirectAction{PathRewriteSpecifier: &routev3.RedirectAction_PathRedirect{PathRedirect: r.GetUri()}}
	if p := r.GetPrefixRewrite(); p != "" {
		act.PathRewriteSpecifier = &routev3.RedirectAction_PrefixRewrite{PrefixRewrite: p}
	}
	if a := r.GetAuthority(); a != "" {
		act.HostRedirect = a
	}
	// As istiod: a port given is the port; derivePort FROM_REQUEST_PORT is the port the route
	// serves (Envoy cannot derive it); unset or FROM_PROTOCOL_DEFAULT leaves the port out, so
	// Envoy uses the scheme's default.
	switch rp := r.GetRedirectPort().(type) {
	case *networking.HTTPRedirect_Port:
		act.PortRedirect = rp.Port
	case *networking.HTTPRedirect_DerivePort:
		if rp.DerivePort == networking.HTTPRedirect_FROM_REQUEST_PORT {
			act.PortRedirect = port
		}
	}
	if s := r.GetScheme(); s != "" {
		act.SchemeRewriteSpecifier = &routev3.RedirectAction_SchemeRedirect{SchemeRedirect: s}
	}
	// As istiod, a scheme's default port is not written: the Location carries no :80 for http
	// (:443 for https, the default of a TLS server's redirects).
	if r.GetRedirectPort() != nil {
		scheme := r.GetScheme()
		if scheme == "" {
			scheme = map[bool]string{true: "https", false: "http"}[tls]
		}
		if (act.PortRedirect == 80 && scheme == "http") || (act.PortRedirect == 443 && scheme == "https") {
			act.PortRedirect = 0
		}
	}
	switch r.GetRedirectCode() {
	case 0, 301:
		act.ResponseCode = routev3.RedirectAction_MOVED_PERMANENTLY
	case 302:
		act.ResponseCode = routev3.RedirectAction_FOUND
	case 303:
		act.ResponseCode = routev3.RedirectAction_SEE_OTHER
	case 307:
		act.ResponseCode = routev3.RedirectAction_TEMPORARY_REDIRECT
	case 308:
		act.ResponseCode = routev3.RedirectAction_PERMANENT_REDIRECT
	default:
		log.Debug("unsupported redirect code, using 301", "code", r.GetRedirectCode())
		act.ResponseCode = routev3.RedirectAction_MOVED_PERMANENTLY
	}
	return act
}

// headerOps turns set (overwrite) and add (append) into Envoy header options, sorted by name.
func headerOps(h *networking.Headers_HeaderOperations) ([]*corev3.HeaderValueOption, []string) {
	if h == nil {
		return nil, nil
	}
	var add []*corev3.HeaderValueOption
	for _, k := range translate.SortedKeys(h.GetSet()) {
		add = append(add, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, Value: h.GetSet()[k]},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD})
	}
	for _, k := range translate.SortedKeys(h.GetAdd()) {
		add = append(add, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, Value: h.GetAdd()[k]},
			AppendAction: corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD})
	}
	remove := slices.Clone(h.GetRemove())
	slices.Sort(remove)
	return add, slices.Compact(remove)
}

func corsPolicy(c *networking.CorsPolicy) *corsv3.CorsPolicy {
	out := &corsv3.CorsPolicy{
		AllowMethods:  strings.Join(c.GetAllowMethods(), ","),
		AllowHeaders:  strings.Join(c.GetAllowHeaders(), ","),
		ExposeHeaders: strings.Join(c.GetExposeHeaders(), ","),
		// Always on, stated as istiod does.
		FilterEnabled: &corev3.RuntimeFractionalPercent{DefaultValue: &typev3.FractionalPercent{
			Numerator: 100, Denominator: typev3.FractionalPercent_HUNDRED}},
	}
	if d := c.GetMaxAge(); d != nil {
		out.MaxAge = strconv.FormatInt(int64(d.AsDuration().Seconds()), 10)
	}
	if v := c.GetAllowCredentials(); v != nil {
		out.AllowCredentials = wrapperspb.Bool(v.GetValue())
	}
	for _, o := range c.GetAllowOrigins() {
		if sm := translate.StringMatcher(o); sm != nil {
			out.AllowOriginStringMatch = append(out.AllowOriginStringMatch, sm)
		}
	}
	// Stated either way, as istiod does (Envoy's default is true).
	out.ForwardNotMatchingPreflights = wrapperspb.Bool(c.GetUnmatchedPreflights() != networking.CorsPolicy_IGNORE)
	return out
}

// hashPolicy is the route side of a consistent-hash DestinationRule.
func (b *builder) hashPolicy(host string, port uint32, subset string) []*routev3.RouteAction_HashPolicy {
	hp, _ := translate.HashPolicy(specOf(b.binds.DestinationRule(host)), port, subset, translate.Envoy)
	return hp
}
