package config

import (
	"fmt"
	"net"
	"regexp"
	"strings"

	networking "istio.io/api/networking/v1alpha3"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

func (v *validator) virtualService(s *networking.VirtualService) {
	// Like Istio, a VirtualService without hosts is a delegate: it can only hold HTTP routes and
	// is attached by another VirtualService's delegate field.
	if len(s.Hosts) == 0 {
		if len(s.Gateways) > 0 || len(s.Tcp) > 0 || len(s.Tls) > 0 {
			v.add(specPath.Child("hosts"), "at least one host is required (only delegate VirtualServices, with http routes only and no gateways, have none)")
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
		p := specPath.Child("hosts").Index(i)
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
					v.add(specPath.Child("hosts").Index(i), "hosts %q and %q overlap: each host may appear once", a, b)
				}
			}
		}
	}
	for i, g := range s.Gateways {
		v.gatewayRef(specPath.Child("gateways").Index(i), g)
	}
	if len(s.Http) == 0 && len(s.Tcp) == 0 && len(s.Tls) == 0 {
		v.add(specPath, "at least one of http, tcp or tls routes is required")
	}
	for i, r := range s.Http {
		v.httpRoute(specPath.Child("http").Index(i), r, !meshBound)
	}
	for i, r := range s.Tcp {
		p := specPath.Child("tcp").Index(i)
		for j, m := range r.GetMatch() {
			mp := p.Child("match").Index(j)
			if m.GetPort() != 0 {
				v.addMsg(mp.Child("port"), portNumber(m.GetPort()))
			}
			for k, sn := range m.GetDestinationSubnets() {
				v.addMsg(mp.Child("destinationSubnets").Index(k), ipOrCIDR(sn))
			}
			v.labels(mp.Child("sourceLabels"), m.GetSourceLabels())
			for k, g := range m.GetGateways() {
				v.gatewayRef(mp.Child("gateways").Index(k), g)
			}
		}
		v.routeDestinations(p.Child("route"), r.GetRoute())
	}
	for i, r := range s.Tls {
		p := specPath.Child("tls").Index(i)
		if len(r.GetMatch()) == 0 {
			v.add(p.Child("match"), "required")
		}
		for j, m := range r.GetMatch() {
			mp := p.Child("match").Index(j)
			if len(m.GetSniHosts()) == 0 {
				v.add(mp.Child("sniHosts"), "required")
			}
			for k, h := range m.GetSniHosts() {
				v.addMsg(mp.Child("sniHosts").Index(k), hostName(h, true))
			}
			if m.GetPort() != 0 {
				v.addMsg(mp.Child("port"), portNumber(m.GetPort()))
			}
			for k, g := range m.GetGateways() {
				v.gatewayRef(mp.Child("gateways").Index(k), g)
			}
		}
		v.routeDestinations(p.Child("route"), r.GetRoute())
	}
	v.exportTo(specPath.Child("exportTo"), s.ExportTo)
	v.unusedRoutes(s)
}

// gatewayRef checks a gateway reference: "mesh", "namespace/name", or the legacy FQDN form.
func (v *validator) gatewayRef(path *field.Path, g string) {
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

func (v *validator) httpRoute(p *field.Path, r *networking.HTTPRoute, gateway bool) {
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
		v.httpMatch(p.Child("match").Index(j), m, gateway)
	}
	v.routeDestinations(p.Child("route"), httpDestinations(r.Route))
	for j, d := range r.Route {
		v.headers(p.Child("route").Index(j).Child("headers"), d.GetHeaders())
	}
	if rd := r.Redirect; rd != nil {
		switch rd.RedirectCode {
		case 0, 301, 302, 303, 307, 308:
		default:
			v.add(p.Child("redirect", "redirectCode"), "must be one of 301, 302, 303, 307, 308, got %d", rd.RedirectCode)
		}
		if port, ok := rd.RedirectPort.(*networking.HTTPRedirect_Port); ok {
			v.addMsg(p.Child("redirect", "port"), portNumber(port.Port))
		}
		if rd.Scheme != "" && rd.Scheme != "http" && rd.Scheme != "https" {
			v.add(p.Child("redirect", "scheme"), "must be http or https, got %q", rd.Scheme)
		}
	}
	if dr := r.DirectResponse; dr != nil {
		if dr.Status < 200 || dr.Status > 599 {
			v.add(p.Child("directResponse", "status"), "must be between 200 and 599, got %d", dr.Status)
		}
	}
	if d := r.Delegate; d != nil {
		if d.Name == "" {
			v.add(p.Child("delegate", "name"), "required")
		} else {
			v.addMsg(p.Child("delegate", "name"), dnsName(d.Name))
		}
		if d.Namespace != "" {
			v.addMsg(p.Child("delegate", "namespace"), dnsLabel(d.Namespace))
		}
	}
	v.duration(p.Child("timeout"), r.Timeout, true)
	if rt := r.Retries; rt != nil {
		if rt.Attempts < 0 {
			v.add(p.Child("retries", "attempts"), "must not be negative, got %d", rt.Attempts)
		}
		v.duration(p.Child("retries", "perTryTimeout"), rt.PerTryTimeout, false)
		v.duration(p.Child("retries", "backoff"), rt.Backoff, false)
		if rt.RetryOn != "" {
			for _, cond := range strings.Split(rt.RetryOn, ",") {
				if strings.TrimSpace(cond) == "" {
					v.add(p.Child("retries", "retryOn"), "empty retry condition in %q", rt.RetryOn)
					break
				}
			}
		}
	}
	if f := r.Fault; f != nil {
		if f.Delay == nil && f.Abort == nil {
			v.add(p.Child("fault"), "one of delay or abort is required")
		}
		if d := f.Delay; d != nil {
			dp := p.Child("fault", "delay")
			if d.Percentage != nil {
				v.addMsg(dp.Child("percentage", "value"), percent(d.Percentage.Value))
			}
			if d.Percent != 0 {
				v.addMsg(dp.Child("percent"), percent(float64(d.Percent)))
			}
			switch t := d.HttpDelayType.(type) {
			case *networking.HTTPFaultInjection_Delay_FixedDelay:
				v.duration(dp.Child("fixedDelay"), t.FixedDelay, false)
			case *networking.HTTPFaultInjection_Delay_ExponentialDelay:
				v.add(dp.Child("exponentialDelay"), "not supported (use fixedDelay)")
			default:
				v.add(dp.Child("fixedDelay"), "required")
			}
		}
		if a := f.Abort; a != nil {
			ap := p.Child("fault", "abort")
			if a.Percentage != nil {
				v.addMsg(ap.Child("percentage", "value"), percent(a.Percentage.Value))
			}
			switch t := a.ErrorType.(type) {
			case *networking.HTTPFaultInjection_Abort_HttpStatus:
				if t.HttpStatus < 200 || t.HttpStatus > 599 {
					v.add(ap.Child("httpStatus"), "must be between 200 and 599, got %d", t.HttpStatus)
				}
			case *networking.HTTPFaultInjection_Abort_GrpcStatus:
				if t.GrpcStatus == "" {
					v.add(ap.Child("grpcStatus"), "must not be empty")
				}
			case nil:
				v.add(ap, "one of httpStatus or grpcStatus is required")
			}
		}
	}
	if r.Mirror != nil {
		v.destination(p.Child("mirror"), r.Mirror)
	}
	if r.MirrorPercentage != nil {
		v.addMsg(p.Child("mirrorPercentage", "value"), percent(r.MirrorPercentage.Value))
	}
	if r.MirrorPercent != nil {
		v.addMsg(p.Child("mirrorPercent"), percent(float64(r.MirrorPercent.Value)))
	}
	for j, m := range r.Mirrors {
		mp := p.Child("mirrors").Index(j)
		if m.Destination == nil {
			v.add(mp.Child("destination"), "required")
		} else {
			v.destination(mp.Child("destination"), m.Destination)
		}
		if m.Percentage != nil {
			v.addMsg(mp.Child("percentage", "value"), percent(m.Percentage.Value))
		}
	}
	if r.Mirror != nil && len(r.Mirrors) > 0 {
		v.add(p.Child("mirrors"), "mirror and mirrors are mutually exclusive")
	}
	v.headers(p.Child("headers"), r.Headers)
}

// headerNameRE is RFC 7230's token: what a header name may be made of.
var headerNameRE = regexp.MustCompile("^[!#$%&'*+\\-.^_`|~A-Za-z0-9]+$")

// headers checks header operations as Istio does: request headers may be added or set except
// pseudo-headers other than :authority; removed request headers and all response headers may
// not be Host or pseudo-headers.
func (v *validator) headers(p *field.Path, h *networking.Headers) {
	if h == nil {
		return
	}
	check := func(path *field.Path, name string, authorityAllowed bool) {
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
			check(p.Child(op.name).Child("set").Key(k), k, op.request)
		}
		for k := range op.o.Add {
			check(p.Child(op.name).Child("add").Key(k), k, op.request)
		}
		for i, k := range op.o.Remove {
			check(p.Child(op.name).Child("remove").Index(i), k, false)
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

func (v *validator) httpMatch(p *field.Path, m *networking.HTTPMatchRequest, gateway bool) {
	// Envoy allows an empty URI prefix (it matches everything); not for the other fields.
	v.stringMatch(p.Child("uri"), m.Uri, true)
	v.stringMatch(p.Child("scheme"), m.Scheme, false)
	v.stringMatch(p.Child("method"), m.Method, false)
	v.stringMatch(p.Child("authority"), m.Authority, false)
	for _, hm := range []struct {
		field string
		m     map[string]*networking.StringMatch
	}{{"headers", m.Headers}, {"withoutHeaders", m.WithoutHeaders}} {
		for name, sm := range hm.m {
			hp := p.Child(hm.field).Key(name)
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
		v.stringMatch(p.Child("queryParams").Key(name), sm, false)
	}
	if m.Port != 0 {
		v.addMsg(p.Child("port"), portNumber(m.Port))
	}
	v.labels(p.Child("sourceLabels"), m.SourceLabels)
	for k, g := range m.Gateways {
		v.gatewayRef(p.Child("gateways").Index(k), g)
	}
	if m.SourceNamespace != "" {
		v.addMsg(p.Child("sourceNamespace"), dnsLabel(m.SourceNamespace))
	}
}

// maxRegexLength approximates Envoy's limit on a regular expression's RE2 program size.
const maxRegexLength = 1024

// stringMatch checks an exact/prefix/regex match as Istio does: an empty match or exact value
// is allowed (it tests presence), an empty prefix only where emptyPrefix, a regex must be RE2.
func (v *validator) stringMatch(p *field.Path, sm *networking.StringMatch, emptyPrefix bool) {
	switch t := sm.GetMatchType().(type) {
	case *networking.StringMatch_Prefix:
		if t.Prefix == "" && !emptyPrefix {
			v.add(p.Child("prefix"), "must not be empty")
		}
	case *networking.StringMatch_Regex:
		switch {
		case t.Regex == "":
			v.add(p.Child("regex"), "must not be empty")
		case len(t.Regex) > maxRegexLength:
			v.add(p.Child("regex"), "longer than %d characters", maxRegexLength)
		default:
			// Envoy uses RE2, as Go's regexp does.
			if _, err := regexp.Compile(t.Regex); err != nil {
				v.add(p.Child("regex"), "invalid RE2 regular expression: %v", err)
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

func (v *validator) routeDestinations(p *field.Path, rs any) {
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
		dp := p.Index(j)
		if w.dest == nil {
			v.add(dp.Child("destination"), "required")
		} else {
			v.destination(dp.Child("destination"), w.dest)
		}
		if w.weight < 0 {
			v.add(dp.Child("weight"), "must not be negative, got %d", w.weight)
		}
		sum += w.weight
	}
	// Weights are relative, as in istiod: any non-negative values split the traffic in their
	// proportions. A single destination takes it all whatever its weight; several need some weight.
	if len(ws) > 1 && sum == 0 {
		v.add(p, "total destination weight = 0")
	}
}

func (v *validator) destination(p *field.Path, d *networking.Destination) {
	if d.Host == "" {
		v.add(p.Child("host"), "required")
	} else {
		v.addMsg(p.Child("host"), hostName(d.Host, false))
	}
	if d.Subset != "" {
		v.addMsg(p.Child("subset"), dnsLabel(d.Subset))
	}
	if d.Port != nil {
		v.addMsg(p.Child("port", "number"), portNumber(d.Port.Number))
	}
}

func (v *validator) destinationRule(s *networking.DestinationRule) {
	if s.Host == "" {
		v.add(specPath.Child("host"), "required")
	} else {
		v.addMsg(specPath.Child("host"), hostName(s.Host, true))
	}
	v.trafficPolicy(specPath.Child("trafficPolicy"), s.TrafficPolicy)
	names := map[string]bool{}
	for i, ss := range s.Subsets {
		p := specPath.Child("subsets").Index(i)
		switch {
		case ss.Name == "":
			v.add(p.Child("name"), "required")
		case names[ss.Name]:
			v.add(p.Child("name"), "duplicate subset name %q", ss.Name)
		default:
			v.addMsg(p.Child("name"), dnsLabel(ss.Name))
		}
		names[ss.Name] = true
		v.labels(p.Child("labels"), ss.Labels)
		v.trafficPolicy(p.Child("trafficPolicy"), ss.TrafficPolicy)
	}
	if ws := s.WorkloadSelector; ws != nil {
		v.labels(specPath.Child("workloadSelector", "matchLabels"), ws.MatchLabels)
	}
	v.exportTo(specPath.Child("exportTo"), s.ExportTo)
}

func (v *validator) trafficPolicy(p *field.Path, tp *networking.TrafficPolicy) {
	if tp == nil {
		return
	}
	v.loadBalancer(p.Child("loadBalancer"), tp.LoadBalancer)
	v.connectionPool(p.Child("connectionPool"), tp.ConnectionPool)
	v.outlierDetection(p.Child("outlierDetection"), tp.OutlierDetection)
	v.clientTLS(p.Child("tls"), tp.Tls)
	ports := map[uint32]bool{}
	for i, pl := range tp.PortLevelSettings {
		pp := p.Child("portLevelSettings").Index(i)
		if pl.Port == nil {
			v.add(pp.Child("port"), "required")
		} else {
			v.addMsg(pp.Child("port", "number"), portNumber(pl.Port.Number))
			if ports[pl.Port.Number] {
				v.add(pp.Child("port", "number"), "duplicate port %d", pl.Port.Number)
			}
			ports[pl.Port.Number] = true
		}
		v.loadBalancer(pp.Child("loadBalancer"), pl.LoadBalancer)
		v.connectionPool(pp.Child("connectionPool"), pl.ConnectionPool)
		v.outlierDetection(pp.Child("outlierDetection"), pl.OutlierDetection)
		v.clientTLS(pp.Child("tls"), pl.Tls)
	}
}

func (v *validator) loadBalancer(p *field.Path, lb *networking.LoadBalancerSettings) {
	if lb == nil {
		return
	}
	if w := lb.Warmup; w != nil {
		if w.Duration == nil {
			v.add(p.Child("warmup", "duration"), "required")
		} else {
			v.duration(p.Child("warmup", "duration"), w.Duration, false)
		}
		if w.MinimumPercent.GetValue() > 100 {
			v.add(p.Child("warmup", "minimumPercent"), "must be at most 100, got %v", w.MinimumPercent.GetValue())
		}
		if w.Aggression != nil && w.Aggression.GetValue() <= 0 {
			v.add(p.Child("warmup", "aggression"), "must be greater than 0, got %v", w.Aggression.GetValue())
		}
	}
	ch, ok := lb.LbPolicy.(*networking.LoadBalancerSettings_ConsistentHash)
	if !ok || ch.ConsistentHash == nil {
		return
	}
	c := ch.ConsistentHash
	cp := p.Child("consistentHash")
	switch k := c.HashKey.(type) {
	case nil:
		v.add(cp, "one of httpHeaderName, httpCookie, useSourceIp or httpQueryParameterName is required")
	case *networking.LoadBalancerSettings_ConsistentHashLB_HttpHeaderName:
		if k.HttpHeaderName == "" {
			v.add(cp.Child("httpHeaderName"), "must not be empty")
		}
	case *networking.LoadBalancerSettings_ConsistentHashLB_HttpCookie:
		if k.HttpCookie == nil || k.HttpCookie.Name == "" {
			v.add(cp.Child("httpCookie", "name"), "required")
		}
		if k.HttpCookie != nil {
			v.duration(cp.Child("httpCookie", "ttl"), k.HttpCookie.Ttl, true)
		}
	case *networking.LoadBalancerSettings_ConsistentHashLB_UseSourceIp:
		if !k.UseSourceIp {
			v.add(cp.Child("useSourceIp"), "must be true when set")
		}
	case *networking.LoadBalancerSettings_ConsistentHashLB_HttpQueryParameterName:
		if k.HttpQueryParameterName == "" {
			v.add(cp.Child("httpQueryParameterName"), "must not be empty")
		}
	}
	if c.MinimumRingSize != 0 && c.HashAlgorithm != nil {
		v.add(cp.Child("minimumRingSize"), "deprecated minimumRingSize cannot be used with ringHash or maglev")
	}
	if m, ok := c.HashAlgorithm.(*networking.LoadBalancerSettings_ConsistentHashLB_Maglev); ok && m.Maglev != nil {
		if m.Maglev.TableSize != 0 && !isPrime(m.Maglev.TableSize) {
			v.add(cp.Child("maglev", "tableSize"), "must be a prime number, got %d", m.Maglev.TableSize)
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

func (v *validator) connectionPool(p *field.Path, cp *networking.ConnectionPoolSettings) {
	if cp == nil {
		return
	}
	if cp.Tcp == nil && cp.Http == nil {
		v.add(p, "one of tcp or http is required")
	}
	if t := cp.Tcp; t != nil {
		if t.MaxConnections < 0 {
			v.add(p.Child("tcp", "maxConnections"), "must not be negative, got %d", t.MaxConnections)
		}
		v.duration(p.Child("tcp", "connectTimeout"), t.ConnectTimeout, false)
		v.duration(p.Child("tcp", "maxConnectionDuration"), t.MaxConnectionDuration, false)
		v.duration(p.Child("tcp", "idleTimeout"), t.IdleTimeout, true)
		if ka := t.TcpKeepalive; ka != nil {
			v.duration(p.Child("tcp", "tcpKeepalive", "time"), ka.Time, false)
			v.duration(p.Child("tcp", "tcpKeepalive", "interval"), ka.Interval, false)
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
				v.add(p.Child("http", f.name), "must not be negative, got %d", f.val)
			}
		}
		v.duration(p.Child("http", "idleTimeout"), h.IdleTimeout, true)
	}
}

func (v *validator) outlierDetection(p *field.Path, od *networking.OutlierDetection) {
	if od == nil {
		return
	}
	if od.ConsecutiveErrors < 0 {
		v.add(p.Child("consecutiveErrors"), "must not be negative, got %d", od.ConsecutiveErrors)
	}
	v.duration(p.Child("interval"), od.Interval, false)
	v.duration(p.Child("baseEjectionTime"), od.BaseEjectionTime, false)
	v.addMsg(p.Child("maxEjectionPercent"), percent(float64(od.MaxEjectionPercent)))
	v.addMsg(p.Child("minHealthPercent"), percent(float64(od.MinHealthPercent)))
}

func (v *validator) clientTLS(p *field.Path, t *networking.ClientTLSSettings) {
	if t == nil {
		return
	}
	if t.Mode == networking.ClientTLSSettings_MUTUAL && t.CredentialName == "" {
		if t.ClientCertificate == "" {
			v.add(p.Child("clientCertificate"), "required for MUTUAL mode without credentialName")
		}
		if t.PrivateKey == "" {
			v.add(p.Child("privateKey"), "required for MUTUAL mode without credentialName")
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
		v.add(specPath.Child("hosts"), "at least one host is required")
	}
	for i, h := range s.Hosts {
		msg := hostName(h, false)
		v.addMsg(specPath.Child("hosts").Index(i), msg)
		if msg == "" && strings.Contains(h, "*") && !strings.HasPrefix(h, "*.") && s.Resolution != networking.ServiceEntry_DYNAMIC_DNS {
			v.warn(specPath.Child("hosts").Index(i), "partial wildcard %q: only \"*.\" prefixes are supported", h)
		}
	}
	// Istio allocates addresses to ServiceEntries without any, unless resolution is NONE or the
	// label opts out; TCP needs an address to tell services apart.
	autoAllocate := s.Resolution != networking.ServiceEntry_NONE && !strings.EqualFold(labels[autoAllocateLabel], "false")
	hasCIDR := false
	for i, a := range s.Addresses {
		v.addMsg(specPath.Child("addresses").Index(i), ipOrCIDR(a))
		if strings.Contains(a, "/") {
			hasCIDR = true
		}
	}
	portNames := map[string]bool{}
	portNums := map[uint32]bool{}
	for i, sp := range s.Ports {
		p := specPath.Child("ports").Index(i)
		v.addMsg(p.Child("number"), portNumber(sp.Number))
		if portNums[sp.Number] {
			v.add(p.Child("number"), "duplicate port %d", sp.Number)
		}
		portNums[sp.Number] = true
		switch {
		case sp.Name == "":
			v.add(p.Child("name"), "required")
		case portNames[sp.Name]:
			v.add(p.Child("name"), "duplicate port name %q", sp.Name)
		default:
			v.addMsg(p.Child("name"), dnsLabel(sp.Name))
		}
		portNames[sp.Name] = true
		v.protocol(p.Child("protocol"), sp.Protocol, false)
		if sp.TargetPort != 0 {
			v.addMsg(p.Child("targetPort"), portNumber(sp.TargetPort))
		}
		if len(s.Addresses) == 0 && !autoAllocate && (sp.Protocol == "" || sp.Protocol == "TCP") {
			v.warn(p, "a TCP (or unset) protocol port needs spec.addresses when addresses are not allocated automatically")
		}
	}
	if s.Resolution != networking.ServiceEntry_NONE && len(s.Hosts) > 1 {
		for i, sp := range s.Ports {
			if proto := strings.ToUpper(sp.Protocol); !httpProtocols[proto] && proto != "HTTPS" && proto != "TLS" {
				v.add(specPath.Child("ports").Index(i).Child("protocol"), "several hosts need HTTP or TLS ports to be told apart, not %q (or use resolution NONE)", sp.Protocol)
				break
			}
		}
	}
	if s.WorkloadSelector != nil && len(s.Endpoints) > 0 {
		v.add(specPath.Child("workloadSelector"), "workloadSelector and endpoints are mutually exclusive")
	}
	if s.WorkloadSelector != nil {
		v.labels(specPath.Child("workloadSelector", "labels"), s.WorkloadSelector.Labels)
		if len(s.WorkloadSelector.Labels) == 0 {
			v.warn(specPath.Child("workloadSelector"), "no labels: the ServiceEntry selects every workload in the namespace")
		}
	}
	switch s.Resolution {
	case networking.ServiceEntry_NONE:
		if len(s.Endpoints) > 0 {
			v.add(specPath.Child("endpoints"), "not allowed with resolution NONE")
		}
		if s.WorkloadSelector != nil {
			v.warn(specPath.Child("workloadSelector"), "has no effect with resolution NONE")
		}
	case networking.ServiceEntry_STATIC:
		for i, ep := range s.Endpoints {
			a := ep.GetAddress()
			if a != "" && !isIP(a) && !strings.HasPrefix(a, "unix://") {
				v.add(specPath.Child("endpoints").Index(i).Child("address"), "%q must be an IP address or unix:// path with resolution STATIC", a)
			}
			if strings.HasPrefix(a, "unix://") && len(s.Ports) != 1 {
				v.add(specPath.Child("endpoints").Index(i).Child("address"), "a unix:// endpoint needs exactly one port in spec.ports")
			}
		}
	case networking.ServiceEntry_DNS, networking.ServiceEntry_DNS_ROUND_ROBIN:
		if len(s.Endpoints) == 0 {
			for i, h := range s.Hosts {
				if strings.HasPrefix(h, "*") {
					v.add(specPath.Child("hosts").Index(i), "wildcard host %q needs endpoints with resolution %s", h, s.Resolution)
				}
			}
		}
		if hasCIDR {
			v.add(specPath.Child("addresses"), "CIDR addresses are allowed only with resolution NONE or STATIC")
		}
		if s.Resolution == networking.ServiceEntry_DNS_ROUND_ROBIN && len(s.Endpoints) > 1 {
			v.add(specPath.Child("endpoints"), "at most one endpoint is allowed with resolution DNS_ROUND_ROBIN")
		}
		for i, ep := range s.Endpoints {
			if a := ep.GetAddress(); a != "" && !isIP(a) && !strings.HasPrefix(a, "unix://") {
				v.addMsg(specPath.Child("endpoints").Index(i).Child("address"), dnsName(a))
			}
		}
		if len(s.Addresses) > 0 && len(s.Hosts) > 1 {
			for _, sp := range s.Ports {
				if tcpProtocols[strings.ToUpper(sp.Protocol)] {
					v.warn(specPath.Child("hosts"), "several hosts with addresses and a TCP port cannot be told apart")
					break
				}
			}
		}
	}
	for i, ep := range s.Endpoints {
		p := specPath.Child("endpoints").Index(i)
		v.workloadEntry(p, ep, true)
		for name := range ep.GetPorts() {
			if !portNames[name] {
				v.add(p.Child("ports").Key(name), "no port named %q in spec.ports", name)
			}
		}
	}
	v.exportTo(specPath.Child("exportTo"), s.ExportTo)
}

// workloadEntry checks a WorkloadEntry, standalone or as a ServiceEntry endpoint.
func (v *validator) workloadEntry(p *field.Path, we *networking.WorkloadEntry, inServiceEntry bool) {
	if we == nil {
		v.add(p, "required")
		return
	}
	switch a := we.Address; {
	case a == "":
		if we.Network == "" {
			v.add(p.Child("address"), "required unless network is set")
		} else {
			v.warn(p.Child("address"), "unset, with network %q", we.Network)
		}
	case strings.HasPrefix(a, "unix://"):
		v.addMsg(p.Child("address"), unixAddress(strings.TrimPrefix(a, "unix://")))
		if len(we.Ports) > 0 {
			v.add(p.Child("ports"), "a unix:// endpoint has no ports")
		}
	case isIP(a):
	default:
		if !inServiceEntry {
			v.addMsg(p.Child("address"), dnsName(a))
		}
	}
	for name, port := range we.Ports {
		v.addMsg(p.Child("ports").Key(name), dnsLabel(name))
		v.addMsg(p.Child("ports").Key(name), portNumber(port))
	}
	v.labels(p.Child("labels"), we.Labels)
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
		v.add(specPath.Child("template"), "required")
		return
	}
	if s.Metadata != nil {
		v.labels(specPath.Child("metadata", "labels"), s.Metadata.Labels)
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
			v.add(specPath.Child("probe", f.name), "must not be negative, got %d", f.val)
		}
	}
	switch m := pr.HealthCheckMethod.(type) {
	case *networking.ReadinessProbe_HttpGet:
		h := m.HttpGet
		v.addMsg(specPath.Child("probe", "httpGet", "port"), portNumber(h.GetPort()))
		if sc := h.GetScheme(); sc != "" && sc != "HTTP" && sc != "HTTPS" {
			v.add(specPath.Child("probe", "httpGet", "scheme"), "must be HTTP or HTTPS, got %q", sc)
		}
		for i, hh := range h.GetHttpHeaders() {
			if !probeHeaderNameRE.MatchString(hh.GetName()) {
				v.add(specPath.Child("probe", "httpGet", "httpHeaders").Index(i).Child("name"), "%q is not a valid header name (letters, digits and '-')", hh.GetName())
			}
		}
	case *networking.ReadinessProbe_TcpSocket:
		v.addMsg(specPath.Child("probe", "tcpSocket", "port"), portNumber(m.TcpSocket.GetPort()))
	case *networking.ReadinessProbe_Exec:
		if len(m.Exec.GetCommand()) == 0 {
			v.add(specPath.Child("probe", "exec", "command"), "required")
		}
	default:
		v.add(specPath.Child("probe"), "one of httpGet, tcpSocket or exec is required")
	}
}

// probeHeaderNameRE is the header names Kubernetes allows in HTTP probes.
var probeHeaderNameRE = regexp.MustCompile(`^[-A-Za-z0-9]+$`)

func (v *validator) gateway(name string, s *networking.Gateway) {
	// Gateway names end up in DNS-label positions (route and listener names): no dots.
	if msg := dnsLabel(name); msg != "" {
		v.add(metadataPath.Child("name"), "a Gateway name must be a DNS label: %s", msg)
	}
	if len(s.Servers) == 0 {
		v.add(specPath.Child("servers"), "at least one server is required")
	}
	v.labels(specPath.Child("selector"), s.Selector)
	names := map[string]bool{}
	portNames := map[string]bool{}
	for i, srv := range s.Servers {
		p := specPath.Child("servers").Index(i)
		if srv.Port == nil {
			v.add(p.Child("port"), "required")
		} else {
			v.addMsg(p.Child("port", "number"), portNumber(srv.Port.Number))
			v.protocol(p.Child("port", "protocol"), srv.Port.Protocol, true)
			if srv.Port.TargetPort != 0 {
				v.add(p.Child("port", "targetPort"), "has no effect on Gateways")
			}
			switch {
			case srv.Port.Name == "":
				v.add(p.Child("port", "name"), "required")
			case portNames[srv.Port.Name]:
				v.add(p.Child("port", "name"), "duplicate port name %q: each server's port needs its own", srv.Port.Name)
			}
			portNames[srv.Port.Name] = true
			if proto := strings.ToUpper(srv.Port.Protocol); srv.GetTls().GetHttpsRedirect() && !httpProtocols[proto] {
				v.warn(p.Child("tls", "httpsRedirect"), "only has an effect on HTTP servers, not %s", srv.Port.Protocol)
			}
		}
		if srv.Name != "" {
			if names[srv.Name] {
				v.add(p.Child("name"), "duplicate server name %q", srv.Name)
			}
			names[srv.Name] = true
		}
		if len(srv.Hosts) == 0 {
			v.add(p.Child("hosts"), "at least one host is required")
		}
		for j, h := range srv.Hosts {
			v.namespacedHost(p.Child("hosts").Index(j), h, true)
		}
		proto := strings.ToUpper(srv.GetPort().GetProtocol())
		if (proto == "HTTPS" || proto == "TLS") && srv.Tls == nil {
			v.add(p.Child("tls"), "required for protocol %s", proto)
		}
		if t := srv.Tls; t != nil && (proto == "HTTPS" || proto == "TLS") {
			hasCred := t.CredentialName != "" || len(t.CredentialNames) > 0 || len(t.TlsCertificates) > 0
			switch t.Mode {
			case networking.ServerTLSSettings_SIMPLE, networking.ServerTLSSettings_MUTUAL, networking.ServerTLSSettings_OPTIONAL_MUTUAL:
				if !hasCred && (t.ServerCertificate == "" || t.PrivateKey == "") {
					v.add(p.Child("tls"), "%s mode needs credentialName or serverCertificate and privateKey", t.Mode)
				}
				if t.Mode != networking.ServerTLSSettings_SIMPLE && !hasCred && t.CaCertificates == "" {
					v.add(p.Child("tls", "caCertificates"), "required for %s mode without credentialName", t.Mode)
				}
			}
		}
		if srv.DefaultEndpoint != "" {
			v.defaultEndpoint(p.Child("defaultEndpoint"), srv.DefaultEndpoint)
		}
	}
}

// namespacedHost checks a Gateway server's or Sidecar egress listener's host, as Istio does
// (ValidateNamespaceSlashWildcardHostname): "namespace/host", where namespace is "*", "." or a
// namespace name (for Sidecars also "~" and "~name"), the namespace part optional on Gateways
// (gateway says which). The host is an FQDN, "*.suffix" or "*": short names are refused,
// since Gateway and Sidecar hosts do not resolve them in any namespace; Gateways also take IPs.
func (v *validator) namespacedHost(p *field.Path, h string, gateway bool) {
	ns, host, ok := strings.Cut(h, "/")
	if !ok {
		if !gateway {
			v.add(p, "%q must be namespace/host", h)
			return
		}
		v.addMsg(p, meshHost(h, gateway))
		return
	}
	if ns == "" || host == "" {
		v.add(p, "%q: the namespace and the host of namespace/host must not be empty", h)
		return
	}
	allowed, n := `"*", "." or a namespace name`, ns
	if !gateway {
		allowed, n = `"*", "." or a namespace name, each optionally after "~"`, strings.TrimPrefix(ns, "~")
	}
	if (n != "" || gateway) && n != "*" && n != "." && dnsLabel(n) != "" {
		v.add(p, "invalid namespace %q in %q: must be %s", ns, h, allowed)
		return
	}
	v.addMsg(p, meshHost(host, gateway))
}

// meshHost returns why host may not be a Gateway (gateway) or Sidecar host, or "".
func meshHost(host string, gateway bool) string {
	switch {
	case host == "*":
		return ""
	case !strings.Contains(host, "."):
		return fmt.Sprintf("short names (non FQDN) are not allowed: %q; write the FQDN, e.g. %q", host, host+".<namespace>.svc.cluster.local")
	case strings.Contains(host, "*") && !strings.HasPrefix(host, "*."):
		return fmt.Sprintf("partial wildcard %q not allowed: only a leading \"*.\" or \"*\" alone", host)
	case gateway && isIP(host):
		return ""
	}
	return fqdn(strings.TrimPrefix(host, "*."), host)
}

// fqdn returns why name (written as whole) is not a DNS name as Istio reads one: labels of
// letters, digits and '-', a top-level label not all digits, an optional trailing dot.
func fqdn(name, whole string) string {
	if len(whole) > 255 {
		return fmt.Sprintf("%q is longer than 255 characters", whole)
	}
	labels := strings.Split(strings.TrimSuffix(name, "."), ".")
	if tld := labels[len(labels)-1]; tld != "" && strings.Trim(tld, "0123456789") == "" {
		return fmt.Sprintf("%q: the top-level domain %q must not be all digits", whole, tld)
	}
	for _, l := range labels {
		if len(l) > 63 || !dnsLabelRE.MatchString(l) {
			return fmt.Sprintf("%q is not a valid DNS name (label %q)", whole, l)
		}
	}
	return ""
}

func (v *validator) defaultEndpoint(p *field.Path, ep string) {
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
		v.labels(specPath.Child("workloadSelector", "labels"), s.WorkloadSelector.Labels)
		if len(s.WorkloadSelector.Labels) == 0 {
			v.warn(specPath.Child("workloadSelector"), "no labels: the Sidecar applies to every workload in the namespace")
		}
	}
	if len(s.Egress) == 0 && len(s.Ingress) == 0 && s.OutboundTrafficPolicy == nil && s.InboundConnectionPool == nil {
		v.add(specPath, "empty configuration: set at least one of ingress, egress, outboundTrafficPolicy or inboundConnectionPool")
	}
	ports := map[uint32]bool{}
	for i, in := range s.Ingress {
		p := specPath.Child("ingress").Index(i)
		if in.Port == nil {
			v.add(p.Child("port"), "required")
		} else {
			v.addMsg(p.Child("port", "number"), portNumber(in.Port.Number))
			v.protocol(p.Child("port", "protocol"), in.Port.Protocol, false)
			if ports[in.Port.Number] {
				v.add(p.Child("port", "number"), "duplicate ingress port %d", in.Port.Number)
			}
			ports[in.Port.Number] = true
		}
		if in.DefaultEndpoint != "" {
			v.defaultEndpoint(p.Child("defaultEndpoint"), in.DefaultEndpoint)
		}
		if in.Bind != "" && !isIP(in.Bind) {
			v.add(p.Child("bind"), "%q is not an IP address", in.Bind)
		}
		v.connectionPool(p.Child("connectionPool"), in.ConnectionPool)
	}
	catchAll := 0
	egressPorts := map[uint32]bool{}
	for i, eg := range s.Egress {
		p := specPath.Child("egress").Index(i)
		if eg.Port == nil {
			catchAll++
			if catchAll > 1 {
				v.add(p.Child("port"), "only one egress listener may omit port")
			}
		} else {
			v.addMsg(p.Child("port", "number"), portNumber(eg.Port.Number))
			v.protocol(p.Child("port", "protocol"), eg.Port.Protocol, false)
			if egressPorts[eg.Port.Number] {
				v.add(p.Child("port", "number"), "duplicate egress port %d", eg.Port.Number)
			}
			egressPorts[eg.Port.Number] = true
		}
		if len(eg.Hosts) == 0 {
			v.add(p.Child("hosts"), "at least one host is required")
		}
		for j, h := range eg.Hosts {
			v.namespacedHost(p.Child("hosts").Index(j), h, false)
		}
		if eg.Bind != "" && !isIP(eg.Bind) && !strings.HasPrefix(eg.Bind, "unix://") {
			v.add(p.Child("bind"), "%q is not an IP address or unix:// path", eg.Bind)
		}
	}
	v.connectionPool(specPath.Child("inboundConnectionPool"), s.InboundConnectionPool)
}
