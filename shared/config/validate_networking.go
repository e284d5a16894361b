package config

import (
	"fmt"
	"net"
	"regexp"
	"strings"

	networking "istio.io/api/networking/v1alpha3"
)

func (v *validator) virtualService(s *networking.VirtualService) {
	// Like Istio, a VirtualService without hosts is a delegate: it can only hold HTTP routes and
	// is attached by another VirtualService's delegate field.
	if len(s.Hosts) == 0 {
		if len(s.Gateways) > 0 || len(s.Tcp) > 0 || len(s.Tls) > 0 {
			v.add("spec.hosts", "at least one host is required (only delegate VirtualServices, with http routes only and no gateways, have none)")
		}
	}
	meshBound := len(s.Gateways) == 0
	for _, g := range s.Gateways {
		if g == "mesh" {
			meshBound = true
		}
	}
	hostsValid := true
	for i, h := range s.Hosts {
		p := idx("spec.hosts", i)
		msg := hostName(h, true)
		if msg != "" && isIP(h) {
			msg = ""
		}
		if msg == "" && h == "*" && meshBound {
			msg = `"*" is not allowed for VirtualServices bound to the mesh (sidecars)`
		}
		v.addMsg(p, msg)
		hostsValid = hostsValid && msg == ""
	}
	if hostsValid {
		for i, a := range s.Hosts {
			for _, b := range s.Hosts[i+1:] {
				if hostsOverlap(a, b) {
					v.add(idx("spec.hosts", i), "hosts %q and %q overlap: each host may appear once", a, b)
				}
			}
		}
	}
	for i, g := range s.Gateways {
		v.gatewayRef(idx("spec.gateways", i), g)
	}
	if len(s.Http) == 0 && len(s.Tcp) == 0 && len(s.Tls) == 0 {
		v.add("spec", "at least one of http, tcp or tls routes is required")
	}
	for i, r := range s.Http {
		v.httpRoute(idx("spec.http", i), r, !meshBound)
	}
	for i, r := range s.Tcp {
		p := idx("spec.tcp", i)
		for j, m := range r.GetMatch() {
			mp := idx(p+".match", j)
			if m.GetPort() != 0 {
				v.addMsg(mp+".port", portNumber(m.GetPort()))
			}
			for k, sn := range m.GetDestinationSubnets() {
				v.addMsg(idx(mp+".destinationSubnets", k), ipOrCIDR(sn))
			}
			v.labels(mp+".sourceLabels", m.GetSourceLabels())
			for k, g := range m.GetGateways() {
				v.gatewayRef(idx(mp+".gateways", k), g)
			}
		}
		v.routeDestinations(p+".route", r.GetRoute())
	}
	for i, r := range s.Tls {
		p := idx("spec.tls", i)
		if len(r.GetMatch()) == 0 {
			v.add(p+".match", "required")
		}
		for j, m := range r.GetMatch() {
			mp := idx(p+".match", j)
			if len(m.GetSniHosts()) == 0 {
				v.add(mp+".sniHosts", "required")
			}
			for k, h := range m.GetSniHosts() {
				v.addMsg(idx(mp+".sniHosts", k), hostName(h, true))
			}
			if m.GetPort() != 0 {
				v.addMsg(mp+".port", portNumber(m.GetPort()))
			}
			for k, g := range m.GetGateways() {
				v.gatewayRef(idx(mp+".gateways", k), g)
			}
		}
		v.routeDestinations(p+".route", r.GetRoute())
	}
	v.exportTo("spec.exportTo", s.ExportTo)
	v.unusedRoutes(s)
}

// gatewayRef checks a gateway reference: "mesh", "namespace/name", or the legacy FQDN form.
func (v *validator) gatewayRef(path, g string) {
	if g == "mesh" {
		return
	}
	ns, name, ok := strings.Cut(g, "/")
	if !ok {
		if first, rest, dotted := strings.Cut(g, "."); dotted {
			v.warn(path, "legacy gateway name %q: prefer namespace/name, %q", g, strings.Split(rest, ".")[0]+"/"+first)
		}
		v.addMsg(path, dnsName(g))
		return
	}
	if msg := dnsLabel(ns); msg != "" {
		v.add(path, "invalid gateway namespace: %s", msg)
	}
	if msg := dnsLabel(name); msg != "" {
		v.add(path, "invalid gateway name: %s", msg)
	}
}

func (v *validator) httpRoute(p string, r *networking.HTTPRoute, gateway bool) {
	set := 0
	for _, b := range []bool{len(r.Route) > 0, r.Redirect != nil, r.DirectResponse != nil, r.Delegate != nil} {
		if b {
			set++
		}
	}
	switch {
	case set == 0:
		v.add(p, "one of route, redirect, directResponse or delegate is required")
	case set > 1:
		v.add(p, "route, redirect, directResponse and delegate are mutually exclusive")
	}
	for j, m := range r.Match {
		v.httpMatch(idx(p+".match", j), m, gateway)
	}
	v.routeDestinations(p+".route", httpDestinations(r.Route))
	for j, d := range r.Route {
		v.headers(idx(p+".route", j)+".headers", d.GetHeaders())
	}
	if rd := r.Redirect; rd != nil {
		switch rd.RedirectCode {
		case 0, 301, 302, 303, 307, 308:
		default:
			v.add(p+".redirect.redirectCode", "must be one of 301, 302, 303, 307, 308, got %d", rd.RedirectCode)
		}
		if port, ok := rd.RedirectPort.(*networking.HTTPRedirect_Port); ok {
			v.addMsg(p+".redirect.port", portNumber(port.Port))
		}
		if rd.Scheme != "" && rd.Scheme != "http" && rd.Scheme != "https" {
			v.add(p+".redirect.scheme", "must be http or https, got %q", rd.Scheme)
		}
	}
	if dr := r.DirectResponse; dr != nil {
		if dr.Status < 200 || dr.Status > 599 {
			v.add(p+".directResponse.status", "must be between 200 and 599, got %d", dr.Status)
		}
	}
	if d := r.Delegate; d != nil {
		if d.Name == "" {
			v.add(p+".delegate.name", "required")
		} else {
			v.addMsg(p+".delegate.name", dnsName(d.Name))
		}
		if d.Namespace != "" {
			v.addMsg(p+".delegate.namespace", dnsLabel(d.Namespace))
		}
	}
	v.duration(p+".timeout", r.Timeout, true)
	if rt := r.Retries; rt != nil {
		if rt.Attempts < 0 {
			v.add(p+".retries.attempts", "must not be negative, got %d", rt.Attempts)
		}
		v.duration(p+".retries.perTryTimeout", rt.PerTryTimeout, false)
		v.duration(p+".retries.backoff", rt.Backoff, false)
		if rt.RetryOn != "" {
			for _, cond := range strings.Split(rt.RetryOn, ",") {
				if strings.TrimSpace(cond) == "" {
					v.add(p+".retries.retryOn", "empty retry condition in %q", rt.RetryOn)
					break
				}
			}
		}
	}
	if f := r.Fault; f != nil {
		if f.Delay == nil && f.Abort == nil {
			v.add(p+".fault", "one of delay or abort is required")
		}
		if d := f.Delay; d != nil {
			dp := p + ".fault.delay"
			if d.Percentage != nil {
				v.addMsg(dp+".percentage.value", percent(d.Percentage.Value))
			}
			if d.Percent != 0 {
				v.addMsg(dp+".percent", percent(float64(d.Percent)))
			}
			switch t := d.HttpDelayType.(type) {
			case *networking.HTTPFaultInjection_Delay_FixedDelay:
				v.duration(dp+".fixedDelay", t.FixedDelay, false)
			case *networking.HTTPFaultInjection_Delay_ExponentialDelay:
				v.add(dp+".exponentialDelay", "not supported (use fixedDelay)")
			default:
				v.add(dp+".fixedDelay", "required")
			}
		}
		if a := f.Abort; a != nil {
			ap := p + ".fault.abort"
			if a.Percentage != nil {
				v.addMsg(ap+".percentage.value", percent(a.Percentage.Value))
			}
			switch t := a.ErrorType.(type) {
			case *networking.HTTPFaultInjection_Abort_HttpStatus:
				if t.HttpStatus < 200 || t.HttpStatus > 599 {
					v.add(ap+".httpStatus", "must be between 200 and 599, got %d", t.HttpStatus)
				}
			case *networking.HTTPFaultInjection_Abort_GrpcStatus:
				if t.GrpcStatus == "" {
					v.add(ap+".grpcStatus", "must not be empty")
				}
			case nil:
				v.add(ap, "one of httpStatus or grpcStatus is required")
			}
		}
	}
	if r.Mirror != nil {
		v.destination(p+".mirror", r.Mirror)
	}
	if r.MirrorPercentage != nil {
		v.addMsg(p+".mirrorPercentage.value", percent(r.MirrorPercentage.Value))
	}
	if r.MirrorPercent != nil {
		v.addMsg(p+".mirrorPercent", percent(float64(r.MirrorPercent.Value)))
	}
	for j, m := range r.Mirrors {
		mp := idx(p+".mirrors", j)
		if m.Destination == nil {
			v.add(mp+".destination", "required")
		} else {
			v.destination(mp+".destination", m.Destination)
		}
		if m.Percentage != nil {
			v.addMsg(mp+".percentage.value", percent(m.Percentage.Value))
		}
	}
	if r.Mirror != nil && len(r.Mirrors) > 0 {
		v.add(p+".mirrors", "mirror and mirrors are mutually exclusive")
	}
	v.headers(p+".headers", r.Headers)
}

// headerNameRE is RFC 7230's token: what a header name may be made of.
var headerNameRE = regexp.MustCompile("^[!#$%&'*+\\-.^_`|~A-Za-z0-9]+$")

// headers checks header operations as Istio does: request headers may be added or set except
// pseudo-headers other than :authority; removed request headers and all response headers may
// not be Host or pseudo-headers.
func (v *validator) headers(p string, h *networking.Headers) {
	if h == nil {
		return
	}
	check := func(path, name string, authorityAllowed bool) {
		switch {
		case name == "":
			v.add(path, "header name must not be empty")
		case authorityAllowed && (strings.EqualFold(name, ":authority") || strings.EqualFold(name, "host")):
		case strings.EqualFold(name, "host"):
			v.add(path, "the Host header cannot be changed here")
		case strings.HasPrefix(name, ":"):
			v.add(path, "pseudo-header %q cannot be changed", name)
		}
	}
	for _, op := range []struct {
		name    string
		o       *networking.Headers_HeaderOperations
		request bool
	}{{"request", h.Request, true}, {"response", h.Response, false}} {
		if op.o == nil {
			continue
		}
		for k := range op.o.Set {
			check(key(p+"."+op.name+".set", k), k, op.request)
		}
		for k := range op.o.Add {
			check(key(p+"."+op.name+".add", k), k, op.request)
		}
		for i, k := range op.o.Remove {
			check(idx(p+"."+op.name+".remove", i), k, false)
		}
	}
}

var pseudoHeaders = map[string]bool{":method": true, ":scheme": true, ":authority": true, ":path": true, ":status": true}

// jwtClaimHeader reports whether a header match name routes on a JWT claim
// ("@request.auth.claims.groups"), which only gateways support.
func jwtClaimHeader(name string) bool {
	rest, ok := strings.CutPrefix(strings.ToLower(name), "@request.auth.claims")
	return ok && len(rest) > 1 && (rest[0] == '.' || (rest[0] == '[' && strings.HasSuffix(rest, "]")))
}

func (v *validator) httpMatch(p string, m *networking.HTTPMatchRequest, gateway bool) {
	// Envoy allows an empty URI prefix (it matches everything); not for the other fields.
	v.stringMatch(p+".uri", m.Uri, true)
	v.stringMatch(p+".scheme", m.Scheme, false)
	v.stringMatch(p+".method", m.Method, false)
	v.stringMatch(p+".authority", m.Authority, false)
	for _, hm := range []struct {
		field string
		m     map[string]*networking.StringMatch
	}{{"headers", m.Headers}, {"withoutHeaders", m.WithoutHeaders}} {
		for name, sm := range hm.m {
			hp := key(p+"."+hm.field, name)
			switch {
			case name == "":
				v.add(hp, "header name must not be empty")
			case jwtClaimHeader(name):
				if !gateway {
					v.add(hp, "routing on JWT claims is only supported on gateways")
				}
			case pseudoHeaders[name]:
			case !headerNameRE.MatchString(name):
				v.add(hp, "%q is not a valid header name", name)
			}
			// "*" in withoutHeaders is not a regular expression: it means "is present".
			if hm.field == "withoutHeaders" && sm.GetRegex() == "*" {
				continue
			}
			v.stringMatch(hp, sm, false)
		}
	}
	for name, sm := range m.QueryParams {
		v.stringMatch(key(p+".queryParams", name), sm, false)
	}
	if m.Port != 0 {
		v.addMsg(p+".port", portNumber(m.Port))
	}
	v.labels(p+".sourceLabels", m.SourceLabels)
	for k, g := range m.Gateways {
		v.gatewayRef(idx(p+".gateways", k), g)
	}
	if m.SourceNamespace != "" {
		v.addMsg(p+".sourceNamespace", dnsLabel(m.SourceNamespace))
	}
}

// maxRegexLength approximates Envoy's limit on a regular expression's RE2 program size.
const maxRegexLength = 1024

// stringMatch checks an exact/prefix/regex match as Istio does: an empty match or exact value
// is allowed (it tests presence), an empty prefix only where emptyPrefix, a regex must be RE2.
func (v *validator) stringMatch(p string, sm *networking.StringMatch, emptyPrefix bool) {
	switch t := sm.GetMatchType().(type) {
	case *networking.StringMatch_Prefix:
		if t.Prefix == "" && !emptyPrefix {
			v.add(p+".prefix", "must not be empty")
		}
	case *networking.StringMatch_Regex:
		switch {
		case t.Regex == "":
			v.add(p+".regex", "must not be empty")
		case len(t.Regex) > maxRegexLength:
			v.add(p+".regex", "longer than %d characters", maxRegexLength)
		default:
			// Envoy uses RE2, as Go's regexp does.
			if _, err := regexp.Compile(t.Regex); err != nil {
				v.add(p+".regex", "invalid RE2 regular expression: %v", err)
			}
		}
	}
}

type weighted struct {
	dest   *networking.Destination
	weight int32
}

func httpDestinations(rs []*networking.HTTPRouteDestination) []weighted {
	out := make([]weighted, len(rs))
	for i, r := range rs {
		out[i] = weighted{r.GetDestination(), r.GetWeight()}
	}
	return out
}

func (v *validator) routeDestinations(p string, rs any) {
	var ws []weighted
	switch x := rs.(type) {
	case []weighted:
		ws = x
	case []*networking.RouteDestination:
		if len(x) == 0 {
			v.add(p, "at least one destination is required")
		}
		for _, r := range x {
			ws = append(ws, weighted{r.GetDestination(), r.GetWeight()})
		}
	}
	var sum int32
	for j, w := range ws {
		dp := idx(p, j)
		if w.dest == nil {
			v.add(dp+".destination", "required")
		} else {
			v.destination(dp+".destination", w.dest)
		}
		if w.weight < 0 || w.weight > 100 {
			v.add(dp+".weight", "must be between 0 and 100, got %d", w.weight)
		}
		sum += w.weight
	}
	// A single destination takes all traffic whatever its weight; several must split 100, or
	// all leave their weight unset.
	if len(ws) > 1 && sum != 100 && sum != 0 {
		v.add(p, "weights must add up to 100 (or all be 0), got %d", sum)
	}
}

func (v *validator) destination(p string, d *networking.Destination) {
	if d.Host == "" {
		v.add(p+".host", "required")
	} else {
		v.addMsg(p+".host", hostName(d.Host, false))
	}
	if d.Subset != "" {
		v.addMsg(p+".subset", dnsLabel(d.Subset))
	}
	if d.Port != nil {
		v.addMsg(p+".port.number", portNumber(d.Port.Number))
	}
}

func (v *validator) destinationRule(s *networking.DestinationRule) {
	if s.Host == "" {
		v.add("spec.host", "required")
	} else {
		v.addMsg("spec.host", hostName(s.Host, true))
	}
	v.trafficPolicy("spec.trafficPolicy", s.TrafficPolicy)
	names := map[string]bool{}
	for i, ss := range s.Subsets {
		p := idx("spec.subsets", i)
		switch {
		case ss.Name == "":
			v.add(p+".name", "required")
		case names[ss.Name]:
			v.add(p+".name", "duplicate subset name %q", ss.Name)
		default:
			v.addMsg(p+".name", dnsLabel(ss.Name))
		}
		names[ss.Name] = true
		v.labels(p+".labels", ss.Labels)
		v.trafficPolicy(p+".trafficPolicy", ss.TrafficPolicy)
	}
	if ws := s.WorkloadSelector; ws != nil {
		v.labels("spec.workloadSelector.matchLabels", ws.MatchLabels)
	}
	v.exportTo("spec.exportTo", s.ExportTo)
}

func (v *validator) trafficPolicy(p string, tp *networking.TrafficPolicy) {
	if tp == nil {
		return
	}
	v.loadBalancer(p+".loadBalancer", tp.LoadBalancer)
	v.connectionPool(p+".connectionPool", tp.ConnectionPool)
	v.outlierDetection(p+".outlierDetection", tp.OutlierDetection)
	v.clientTLS(p+".tls", tp.Tls)
	ports := map[uint32]bool{}
	for i, pl := range tp.PortLevelSettings {
		pp := idx(p+".portLevelSettings", i)
		if pl.Port == nil {
			v.add(pp+".port", "required")
		} else {
			v.addMsg(pp+".port.number", portNumber(pl.Port.Number))
			if ports[pl.Port.Number] {
				v.add(pp+".port.number", "duplicate port %d", pl.Port.Number)
			}
			ports[pl.Port.Number] = true
		}
		v.loadBalancer(pp+".loadBalancer", pl.LoadBalancer)
		v.connectionPool(pp+".connectionPool", pl.ConnectionPool)
		v.outlierDetection(pp+".outlierDetection", pl.OutlierDetection)
		v.clientTLS(pp+".tls", pl.Tls)
	}
}

func (v *validator) loadBalancer(p string, lb *networking.LoadBalancerSettings) {
	if lb == nil {
		return
	}
	if w := lb.Warmup; w != nil {
		if w.Duration == nil {
			v.add(p+".warmup.duration", "required")
		} else {
			v.duration(p+".warmup.duration", w.Duration, false)
		}
		if w.MinimumPercent.GetValue() > 100 {
			v.add(p+".warmup.minimumPercent", "must be at most 100, got %v", w.MinimumPercent.GetValue())
		}
		if w.Aggression != nil && w.Aggression.GetValue() <= 0 {
			v.add(p+".warmup.aggression", "must be greater than 0, got %v", w.Aggression.GetValue())
		}
	}
	ch, ok := lb.LbPolicy.(*networking.LoadBalancerSettings_ConsistentHash)
	if !ok || ch.ConsistentHash == nil {
		return
	}
	c := ch.ConsistentHash
	cp := p + ".consistentHash"
	switch k := c.HashKey.(type) {
	case nil:
		v.add(cp, "one of httpHeaderName, httpCookie, useSourceIp or httpQueryParameterName is required")
	case *networking.LoadBalancerSettings_ConsistentHashLB_HttpHeaderName:
		if k.HttpHeaderName == "" {
			v.add(cp+".httpHeaderName", "must not be empty")
		}
	case *networking.LoadBalancerSettings_ConsistentHashLB_HttpCookie:
		if k.HttpCookie == nil || k.HttpCookie.Name == "" {
			v.add(cp+".httpCookie.name", "required")
		}
		if k.HttpCookie != nil {
			v.duration(cp+".httpCookie.ttl", k.HttpCookie.Ttl, true)
		}
	case *networking.LoadBalancerSettings_ConsistentHashLB_UseSourceIp:
		if !k.UseSourceIp {
			v.add(cp+".useSourceIp", "must be true when set")
		}
	case *networking.LoadBalancerSettings_ConsistentHashLB_HttpQueryParameterName:
		if k.HttpQueryParameterName == "" {
			v.add(cp+".httpQueryParameterName", "must not be empty")
		}
	}
	if c.MinimumRingSize != 0 && c.HashAlgorithm != nil {
		v.add(cp+".minimumRingSize", "deprecated minimumRingSize cannot be used with ringHash or maglev")
	}
	if m, ok := c.HashAlgorithm.(*networking.LoadBalancerSettings_ConsistentHashLB_Maglev); ok && m.Maglev != nil {
		if m.Maglev.TableSize != 0 && !isPrime(m.Maglev.TableSize) {
			v.add(cp+".maglev.tableSize", "must be a prime number, got %d", m.Maglev.TableSize)
		}
	}
}

func isPrime(n uint64) bool {
	if n < 2 {
		return false
	}
	for d := uint64(2); d*d <= n; d++ {
		if n%d == 0 {
			return false
		}
	}
	return true
}

func (v *validator) connectionPool(p string, cp *networking.ConnectionPoolSettings) {
	if cp == nil {
		return
	}
	if cp.Tcp == nil && cp.Http == nil {
		v.add(p, "one of tcp or http is required")
	}
	if t := cp.Tcp; t != nil {
		if t.MaxConnections < 0 {
			v.add(p+".tcp.maxConnections", "must not be negative, got %d", t.MaxConnections)
		}
		v.duration(p+".tcp.connectTimeout", t.ConnectTimeout, false)
		v.duration(p+".tcp.maxConnectionDuration", t.MaxConnectionDuration, false)
		v.duration(p+".tcp.idleTimeout", t.IdleTimeout, true)
		if ka := t.TcpKeepalive; ka != nil {
			v.duration(p+".tcp.tcpKeepalive.time", ka.Time, false)
			v.duration(p+".tcp.tcpKeepalive.interval", ka.Interval, false)
		}
	}
	if h := cp.Http; h != nil {
		for _, f := range []struct {
			name string
			val  int32
		}{
			{"http1MaxPendingRequests", h.Http1MaxPendingRequests},
			{"http2MaxRequests", h.Http2MaxRequests},
			{"maxRequestsPerConnection", h.MaxRequestsPerConnection},
			{"maxRetries", h.MaxRetries},
			{"maxConcurrentStreams", h.MaxConcurrentStreams},
		} {
			if f.val < 0 {
				v.add(p+".http."+f.name, "must not be negative, got %d", f.val)
			}
		}
		v.duration(p+".http.idleTimeout", h.IdleTimeout, true)
	}
}

func (v *validator) outlierDetection(p string, od *networking.OutlierDetection) {
	if od == nil {
		return
	}
	if od.ConsecutiveErrors < 0 {
		v.add(p+".consecutiveErrors", "must not be negative, got %d", od.ConsecutiveErrors)
	}
	v.duration(p+".interval", od.Interval, false)
	v.duration(p+".baseEjectionTime", od.BaseEjectionTime, false)
	v.addMsg(p+".maxEjectionPercent", percent(float64(od.MaxEjectionPercent)))
	v.addMsg(p+".minHealthPercent", percent(float64(od.MinHealthPercent)))
}

func (v *validator) clientTLS(p string, t *networking.ClientTLSSettings) {
	if t == nil {
		return
	}
	if t.Mode == networking.ClientTLSSettings_MUTUAL && t.CredentialName == "" {
		if t.ClientCertificate == "" {
			v.add(p+".clientCertificate", "required for MUTUAL mode without credentialName")
		}
		if t.PrivateKey == "" {
			v.add(p+".privateKey", "required for MUTUAL mode without credentialName")
		}
	}
	if t.Mode == networking.ClientTLSSettings_ISTIO_MUTUAL && (t.ClientCertificate != "" || t.PrivateKey != "" || t.CaCertificates != "" || t.CredentialName != "") {
		v.add(p, "ISTIO_MUTUAL uses the workload certificates: clientCertificate, privateKey, caCertificates and credentialName must be empty")
	}
}

// autoAllocateLabel opts a ServiceEntry out of Istio's automatic address allocation ("false").
const autoAllocateLabel = "networking.istio.io/enable-autoallocate-ip"

func (v *validator) serviceEntry(s *networking.ServiceEntry, labels map[string]string) {
	if len(s.Hosts) == 0 {
		v.add("spec.hosts", "at least one host is required")
	}
	for i, h := range s.Hosts {
		msg := hostName(h, false)
		v.addMsg(idx("spec.hosts", i), msg)
		if msg == "" && strings.Contains(h, "*") && !strings.HasPrefix(h, "*.") && s.Resolution != networking.ServiceEntry_DYNAMIC_DNS {
			v.warn(idx("spec.hosts", i), "partial wildcard %q: only \"*.\" prefixes are supported", h)
		}
	}
	// Istio allocates addresses to ServiceEntries without any, unless resolution is NONE or the
	// label opts out; TCP needs an address to tell services apart.
	autoAllocate := s.Resolution != networking.ServiceEntry_NONE && !strings.EqualFold(labels[autoAllocateLabel], "false")
	hasCIDR := false
	for i, a := range s.Addresses {
		v.addMsg(idx("spec.addresses", i), ipOrCIDR(a))
		if strings.Contains(a, "/") {
			hasCIDR = true
		}
	}
	portNames := map[string]bool{}
	portNums := map[uint32]bool{}
	for i, sp := range s.Ports {
		p := idx("spec.ports", i)
		v.addMsg(p+".number", portNumber(sp.Number))
		if portNums[sp.Number] {
			v.add(p+".number", "duplicate port %d", sp.Number)
		}
		portNums[sp.Number] = true
		switch {
		case sp.Name == "":
			v.add(p+".name", "required")
		case portNames[sp.Name]:
			v.add(p+".name", "duplicate port name %q", sp.Name)
		default:
			v.addMsg(p+".name", dnsLabel(sp.Name))
		}
		portNames[sp.Name] = true
		v.protocol(p+".protocol", sp.Protocol, false)
		if sp.TargetPort != 0 {
			v.addMsg(p+".targetPort", portNumber(sp.TargetPort))
		}
		if len(s.Addresses) == 0 && !autoAllocate && (sp.Protocol == "" || sp.Protocol == "TCP") {
			v.warn(p, "a TCP (or unset) protocol port needs spec.addresses when addresses are not allocated automatically")
		}
	}
	if s.Resolution != networking.ServiceEntry_NONE && len(s.Hosts) > 1 {
		for i, sp := range s.Ports {
			if proto := strings.ToUpper(sp.Protocol); !httpProtocols[proto] && proto != "HTTPS" && proto != "TLS" {
				v.add(idx("spec.ports", i)+".protocol", "several hosts need HTTP or TLS ports to be told apart, not %q (or use resolution NONE)", sp.Protocol)
				break
			}
		}
	}
	if s.WorkloadSelector != nil && len(s.Endpoints) > 0 {
		v.add("spec.workloadSelector", "workloadSelector and endpoints are mutually exclusive")
	}
	if s.WorkloadSelector != nil {
		v.labels("spec.workloadSelector.labels", s.WorkloadSelector.Labels)
		if len(s.WorkloadSelector.Labels) == 0 {
			v.warn("spec.workloadSelector", "no labels: the ServiceEntry selects every workload in the namespace")
		}
	}
	switch s.Resolution {
	case networking.ServiceEntry_NONE:
		if len(s.Endpoints) > 0 {
			v.add("spec.endpoints", "not allowed with resolution NONE")
		}
		if s.WorkloadSelector != nil {
			v.warn("spec.workloadSelector", "has no effect with resolution NONE")
		}
	case networking.ServiceEntry_STATIC:
		for i, ep := range s.Endpoints {
			a := ep.GetAddress()
			if a != "" && !isIP(a) && !strings.HasPrefix(a, "unix://") {
				v.add(idx("spec.endpoints", i)+".address", "%q must be an IP address or unix:// path with resolution STATIC", a)
			}
			if strings.HasPrefix(a, "unix://") && len(s.Ports) != 1 {
				v.add(idx("spec.endpoints", i)+".address", "a unix:// endpoint needs exactly one port in spec.ports")
			}
		}
	case networking.ServiceEntry_DNS, networking.ServiceEntry_DNS_ROUND_ROBIN:
		if len(s.Endpoints) == 0 {
			for i, h := range s.Hosts {
				if strings.HasPrefix(h, "*") {
					v.add(idx("spec.hosts", i), "wildcard host %q needs endpoints with resolution %s", h, s.Resolution)
				}
			}
		}
		if hasCIDR {
			v.add("spec.addresses", "CIDR addresses are allowed only with resolution NONE or STATIC")
		}
		if s.Resolution == networking.ServiceEntry_DNS_ROUND_ROBIN && len(s.Endpoints) > 1 {
			v.add("spec.endpoints", "at most one endpoint is allowed with resolution DNS_ROUND_ROBIN")
		}
		for i, ep := range s.Endpoints {
			if a := ep.GetAddress(); a != "" && !isIP(a) && !strings.HasPrefix(a, "unix://") {
				v.addMsg(idx("spec.endpoints", i)+".address", dnsName(a))
			}
		}
		if len(s.Addresses) > 0 && len(s.Hosts) > 1 {
			for _, sp := range s.Ports {
				if tcpProtocols[strings.ToUpper(sp.Protocol)] {
					v.warn("spec.hosts", "several hosts with addresses and a TCP port cannot be told apart")
					break
				}
			}
		}
	}
	for i, ep := range s.Endpoints {
		p := idx("spec.endpoints", i)
		v.workloadEntry(p, ep, true)
		for name := range ep.GetPorts() {
			if !portNames[name] {
				v.add(key(p+".ports", name), "no port named %q in spec.ports", name)
			}
		}
	}
	v.exportTo("spec.exportTo", s.ExportTo)
}

// workloadEntry checks a WorkloadEntry, standalone or as a ServiceEntry endpoint.
func (v *validator) workloadEntry(p string, we *networking.WorkloadEntry, inServiceEntry bool) {
	if we == nil {
		v.add(p, "required")
		return
	}
	switch a := we.Address; {
	case a == "":
		if we.Network == "" {
			v.add(p+".address", "required unless network is set")
		} else {
			v.warn(p+".address", "unset, with network %q", we.Network)
		}
	case strings.HasPrefix(a, "unix://"):
		v.addMsg(p+".address", unixAddress(strings.TrimPrefix(a, "unix://")))
		if len(we.Ports) > 0 {
			v.add(p+".ports", "a unix:// endpoint has no ports")
		}
	case isIP(a):
	default:
		if !inServiceEntry {
			v.addMsg(p+".address", dnsName(a))
		}
	}
	for name, port := range we.Ports {
		v.addMsg(key(p+".ports", name), dnsLabel(name))
		v.addMsg(key(p+".ports", name), portNumber(port))
	}
	v.labels(p+".labels", we.Labels)
}

// unixAddress returns why path (after "unix://") is not a socket path: absolute, not a
// directory, or an abstract socket ("@name"); or "".
func unixAddress(path string) string {
	switch {
	case path == "":
		return "unix:// needs a socket path"
	case strings.HasPrefix(path, "@"):
		return ""
	case !strings.HasPrefix(path, "/") || strings.HasSuffix(path, "/"):
		return fmt.Sprintf("%q is not an absolute path to a file", path)
	}
	return ""
}

// workloadGroup checks a WorkloadGroup. Like Istio, the template is not checked as a WorkloadEntry:
// each workload fills in its own address and ports.
func (v *validator) workloadGroup(s *networking.WorkloadGroup) {
	if s.Template == nil {
		v.add("spec.template", "required")
		return
	}
	if s.Metadata != nil {
		v.labels("spec.metadata.labels", s.Metadata.Labels)
	}
	pr := s.Probe
	if pr == nil {
		return
	}
	for _, f := range []struct {
		name string
		val  int32
	}{
		{"periodSeconds", pr.PeriodSeconds}, {"initialDelaySeconds", pr.InitialDelaySeconds},
		{"timeoutSeconds", pr.TimeoutSeconds}, {"successThreshold", pr.SuccessThreshold},
		{"failureThreshold", pr.FailureThreshold},
	} {
		if f.val < 0 {
			v.add("spec.probe."+f.name, "must not be negative, got %d", f.val)
		}
	}
	switch m := pr.HealthCheckMethod.(type) {
	case *networking.ReadinessProbe_HttpGet:
		h := m.HttpGet
		v.addMsg("spec.probe.httpGet.port", portNumber(h.GetPort()))
		if sc := h.GetScheme(); sc != "" && sc != "HTTP" && sc != "HTTPS" {
			v.add("spec.probe.httpGet.scheme", "must be HTTP or HTTPS, got %q", sc)
		}
		for i, hh := range h.GetHttpHeaders() {
			if !probeHeaderNameRE.MatchString(hh.GetName()) {
				v.add(idx("spec.probe.httpGet.httpHeaders", i)+".name", "%q is not a valid header name (letters, digits and '-')", hh.GetName())
			}
		}
	case *networking.ReadinessProbe_TcpSocket:
		v.addMsg("spec.probe.tcpSocket.port", portNumber(m.TcpSocket.GetPort()))
	case *networking.ReadinessProbe_Exec:
		if len(m.Exec.GetCommand()) == 0 {
			v.add("spec.probe.exec.command", "required")
		}
	default:
		v.add("spec.probe", "one of httpGet, tcpSocket or exec is required")
	}
}

// probeHeaderNameRE is the header names Kubernetes allows in HTTP probes.
var probeHeaderNameRE = regexp.MustCompile(`^[-A-Za-z0-9]+$`)

func (v *validator) gateway(name string, s *networking.Gateway) {
	// Gateway names end up in DNS-label positions (route and listener names): no dots.
	if msg := dnsLabel(name); msg != "" {
		v.add("metadata.name", "a Gateway name must be a DNS label: %s", msg)
	}
	if len(s.Servers) == 0 {
		v.add("spec.servers", "at least one server is required")
	}
	v.labels("spec.selector", s.Selector)
	names := map[string]bool{}
	portNames := map[string]bool{}
	for i, srv := range s.Servers {
		p := idx("spec.servers", i)
		if srv.Port == nil {
			v.add(p+".port", "required")
		} else {
			v.addMsg(p+".port.number", portNumber(srv.Port.Number))
			v.protocol(p+".port.protocol", srv.Port.Protocol, true)
			if srv.Port.TargetPort != 0 {
				v.add(p+".port.targetPort", "has no effect on Gateways")
			}
			switch {
			case srv.Port.Name == "":
				v.add(p+".port.name", "required")
			case portNames[srv.Port.Name]:
				v.add(p+".port.name", "duplicate port name %q: each server's port needs its own", srv.Port.Name)
			}
			portNames[srv.Port.Name] = true
			if proto := strings.ToUpper(srv.Port.Protocol); srv.GetTls().GetHttpsRedirect() && !httpProtocols[proto] {
				v.warn(p+".tls.httpsRedirect", "only has an effect on HTTP servers, not %s", srv.Port.Protocol)
			}
		}
		if srv.Name != "" {
			if names[srv.Name] {
				v.add(p+".name", "duplicate server name %q", srv.Name)
			}
			names[srv.Name] = true
		}
		if len(srv.Hosts) == 0 {
			v.add(p+".hosts", "at least one host is required")
		}
		for j, h := range srv.Hosts {
			v.namespacedHost(idx(p+".hosts", j), h, false)
		}
		proto := strings.ToUpper(srv.GetPort().GetProtocol())
		if (proto == "HTTPS" || proto == "TLS") && srv.Tls == nil {
			v.add(p+".tls", "required for protocol %s", proto)
		}
		if t := srv.Tls; t != nil && (proto == "HTTPS" || proto == "TLS") {
			hasCred := t.CredentialName != "" || len(t.CredentialNames) > 0 || len(t.TlsCertificates) > 0
			switch t.Mode {
			case networking.ServerTLSSettings_SIMPLE, networking.ServerTLSSettings_MUTUAL, networking.ServerTLSSettings_OPTIONAL_MUTUAL:
				if !hasCred && (t.ServerCertificate == "" || t.PrivateKey == "") {
					v.add(p+".tls", "%s mode needs credentialName or serverCertificate and privateKey", t.Mode)
				}
				if t.Mode != networking.ServerTLSSettings_SIMPLE && !hasCred && t.CaCertificates == "" {
					v.add(p+".tls.caCertificates", "required for %s mode without credentialName", t.Mode)
				}
			}
		}
		if srv.DefaultEndpoint != "" {
			v.defaultEndpoint(p+".defaultEndpoint", srv.DefaultEndpoint)
		}
	}
}

// namespacedHost checks "namespace/host" (Sidecar egress, Gateway servers): namespace "*",
// ".", "~" or a namespace name; required says whether the "namespace/" part is.
func (v *validator) namespacedHost(p, h string, required bool) {
	ns, host, ok := strings.Cut(h, "/")
	if !ok {
		if required {
			v.add(p, "%q must be namespace/host", h)
			return
		}
		host = h
	} else {
		switch ns {
		case "*", ".", "~":
		default:
			if msg := dnsLabel(ns); msg != "" {
				v.add(p, "invalid namespace in %q: %s", h, msg)
				return
			}
		}
	}
	v.addMsg(p, hostName(host, true))
}

func (v *validator) defaultEndpoint(p, ep string) {
	if strings.HasPrefix(ep, "unix://") {
		return
	}
	host, port, err := net.SplitHostPort(ep)
	if err != nil {
		v.add(p, "must be IP:port or unix://path: %v", err)
		return
	}
	if host != "127.0.0.1" && host != "0.0.0.0" && host != "::1" && host != "::" && host != "[::1]" {
		v.add(p, "host must be 127.0.0.1, 0.0.0.0, ::1 or ::, got %q", host)
	}
	var n uint32
	if _, err := fmt.Sscanf(port, "%d", &n); err != nil {
		v.add(p, "invalid port %q", port)
		return
	}
	v.addMsg(p, portNumber(n))
}

func (v *validator) sidecar(s *networking.Sidecar) {
	if s.WorkloadSelector != nil {
		v.labels("spec.workloadSelector.labels", s.WorkloadSelector.Labels)
		if len(s.WorkloadSelector.Labels) == 0 {
			v.warn("spec.workloadSelector", "no labels: the Sidecar applies to every workload in the namespace")
		}
	}
	if len(s.Egress) == 0 && len(s.Ingress) == 0 && s.OutboundTrafficPolicy == nil && s.InboundConnectionPool == nil {
		v.add("spec", "empty configuration: set at least one of ingress, egress, outboundTrafficPolicy or inboundConnectionPool")
	}
	ports := map[uint32]bool{}
	for i, in := range s.Ingress {
		p := idx("spec.ingress", i)
		if in.Port == nil {
			v.add(p+".port", "required")
		} else {
			v.addMsg(p+".port.number", portNumber(in.Port.Number))
			v.protocol(p+".port.protocol", in.Port.Protocol, false)
			if ports[in.Port.Number] {
				v.add(p+".port.number", "duplicate ingress port %d", in.Port.Number)
			}
			ports[in.Port.Number] = true
		}
		if in.DefaultEndpoint != "" {
			v.defaultEndpoint(p+".defaultEndpoint", in.DefaultEndpoint)
		}
		if in.Bind != "" && !isIP(in.Bind) {
			v.add(p+".bind", "%q is not an IP address", in.Bind)
		}
		v.connectionPool(p+".connectionPool", in.ConnectionPool)
	}
	catchAll := 0
	egressPorts := map[uint32]bool{}
	for i, eg := range s.Egress {
		p := idx("spec.egress", i)
		if eg.Port == nil {
			catchAll++
			if catchAll > 1 {
				v.add(p+".port", "only one egress listener may omit port")
			}
		} else {
			v.addMsg(p+".port.number", portNumber(eg.Port.Number))
			v.protocol(p+".port.protocol", eg.Port.Protocol, false)
			if egressPorts[eg.Port.Number] {
				v.add(p+".port.number", "duplicate egress port %d", eg.Port.Number)
			}
			egressPorts[eg.Port.Number] = true
		}
		if len(eg.Hosts) == 0 {
			v.add(p+".hosts", "at least one host is required")
		}
		for j, h := range eg.Hosts {
			v.namespacedHost(idx(p+".hosts", j), h, true)
		}
		if eg.Bind != "" && !isIP(eg.Bind) && !strings.HasPrefix(eg.Bind, "unix://") {
			v.add(p+".bind", "%q is not an IP address or unix:// path", eg.Bind)
		}
	}
	v.connectionPool("spec.inboundConnectionPool", s.InboundConnectionPool)
}
