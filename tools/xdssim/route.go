package xdssim

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/anypb"
)

// httpRequest is the request as the router sees it, after the connection manager's
// normalisation.
type httpRequest struct {
	method, scheme, host, path string // path with query
	headers                    http.Header
	tls                        bool
	// envoyHeaders: the router adds its x-envoy-* request headers (no suppress_envoy_headers).
	envoyHeaders bool
	remoteAddr   string // appended to x-forwarded-for with use_remote_address
}

func (h *httpRequest) pathOnly() string {
	p, _, _ := strings.Cut(h.path, "?")
	p, _, _ = strings.Cut(p, "#")
	return p
}

func (h *httpRequest) query() string {
	_, q, ok := strings.Cut(h.path, "?")
	if !ok {
		return ""
	}
	return "?" + q
}

// header returns a header's values joined by "," as Envoy does, pseudo-headers included.
func (h *httpRequest) header(name string) (string, bool) {
	switch strings.ToLower(name) {
	case ":authority", "host":
		return h.host, true
	case ":path":
		return h.path, true
	case ":method":
		return h.method, true
	case ":scheme":
		return h.scheme, true
	}
	vs, ok := h.headers[http.CanonicalHeaderKey(name)]
	if !ok {
		return "", false
	}
	return strings.Join(vs, ","), true
}

func newHTTPRequest(hcm *hcmv3.HttpConnectionManager, req Request) (*httpRequest, error) {
	h := &httpRequest{method: req.Method, host: req.Host, path: req.Path, headers: req.Headers, tls: req.TLS, envoyHeaders: true}
	for _, f := range hcm.GetHttpFilters() {
		r := &routerv3.Router{}
		if f.GetTypedConfig().MessageIs(r) && f.GetTypedConfig().UnmarshalTo(r) == nil {
			h.envoyHeaders = !r.GetSuppressEnvoyHeaders()
		}
	}
	if !strings.HasPrefix(h.path, "/") && h.method != http.MethodConnect {
		return nil, fmt.Errorf("request path %q does not start with /", h.path)
	}
	h.scheme = "http"
	if req.TLS {
		h.scheme = "https"
	}
	if hcm.GetNormalizePath().GetValue() {
		h.path = normalizePath(h.pathOnly()) + h.query()
	}
	if hcm.GetMergeSlashes() {
		p := h.pathOnly()
		for strings.Contains(p, "//") {
			p = strings.ReplaceAll(p, "//", "/")
		}
		h.path = p + h.query()
	}
	if host, port, err := net.SplitHostPort(h.host); err == nil {
		switch {
		case hcm.GetStripAnyHostPort():
			h.host = host
		case hcm.GetStripMatchingHostPort() && port == strconv.Itoa(int(req.Port)):
			h.host = host
		}
	}
	if hcm.GetStripTrailingHostDot() {
		if host, port, err := net.SplitHostPort(h.host); err == nil {
			h.host = net.JoinHostPort(strings.TrimSuffix(host, "."), port)
		} else {
			h.host = strings.TrimSuffix(h.host, ".")
		}
	}
	// The connection manager sets x-forwarded-proto at the edge, or when it is missing, and
	// at the edge appends the client's address to x-forwarded-for.
	if hcm.GetUseRemoteAddress().GetValue() || h.headers.Get("x-forwarded-proto") == "" {
		h.headers.Set("x-forwarded-proto", h.scheme)
	}
	if hcm.GetUseRemoteAddress().GetValue() && req.SourceIP != "" {
		if xff := h.headers.Get("x-forwarded-for"); xff != "" {
			h.headers.Set("x-forwarded-for", xff+","+req.SourceIP)
		} else {
			h.headers.Set("x-forwarded-for", req.SourceIP)
		}
	}
	return h, nil
}

// normalizePath removes dot segments (RFC 3986 section 5.2.4), keeping a trailing slash.
func normalizePath(p string) string {
	if p == "" || p == "/" {
		return p
	}
	clean := path.Clean(p)
	if strings.HasSuffix(p, "/") && clean != "/" {
		clean += "/"
	}
	return clean
}

// route selects the virtual host and route and applies the route's action.
func (s *Simulator) route(res *Result, rc *routev3.RouteConfiguration, hcm *hcmv3.HttpConnectionManager, h *httpRequest, req Request) error {
	vh := matchVirtualHost(rc, h.host)
	if vh == nil {
		return fail(res, ErrNoVirtualHost, "route configuration %s: host %q", res.RouteConfig, h.host)
	}
	res.VirtualHost = vh.GetName()
	if needsTLS(vh, h) {
		res.Action = Redirect
		res.Redirect = &RedirectResult{Status: http.StatusMovedPermanently, Location: "https://" + h.host + h.path}
		return nil
	}
	var r *routev3.Route
	for i, cand := range vh.GetRoutes() {
		ok, err := routeMatches(cand.GetMatch(), h)
		if err != nil {
			return fail(res, ErrUnsupported, "virtual host %s route %s: %v", vh.GetName(), routeName(cand, i), err)
		}
		if ok {
			r, res.Route = cand, routeName(cand, i)
			break
		}
	}
	if r == nil {
		return fail(res, ErrNoRoute, "virtual host %s: %s %s", vh.GetName(), h.method, h.path)
	}
	for _, m := range []map[string]*anypb.Any{r.GetTypedPerFilterConfig(), vh.GetTypedPerFilterConfig()} {
		for name := range m {
			if !slices.Contains(res.PerFilterConfig, name) {
				res.PerFilterConfig = append(res.PerFilterConfig, name)
			}
		}
	}
	slices.Sort(res.PerFilterConfig)
	levels := []headerLevel{routeLevel(r), vhostLevel(vh), configLevel(rc)}
	switch a := r.GetAction().(type) {
	case *routev3.Route_Redirect:
		res.Action = Redirect
		loc, err := redirectLocation(a.Redirect, r.GetMatch(), h)
		if err != nil {
			return fail(res, ErrInvalid, "route %s: %v", res.Route, err)
		}
		res.Redirect = &RedirectResult{Status: redirectStatus(a.Redirect.GetResponseCode()), Location: loc}
		res.ResponseHeaders = responseOps(levels, rc.GetMostSpecificHeaderMutationsWins())
		return nil
	case *routev3.Route_DirectResponse:
		res.Action = DirectResponse
		res.Direct = &DirectResult{Status: int(a.DirectResponse.GetStatus())}
		switch b := a.DirectResponse.GetBody().GetSpecifier().(type) {
		case *corev3.DataSource_InlineString:
			res.Direct.Body = b.InlineString
		case *corev3.DataSource_InlineBytes:
			res.Direct.Body = string(b.InlineBytes)
		case nil:
		default:
			return fail(res, ErrUnsupported, "route %s: direct response body from %T", res.Route, b)
		}
		res.ResponseHeaders = responseOps(levels, rc.GetMostSpecificHeaderMutationsWins())
		return nil
	case *routev3.Route_Route:
		return s.forward(res, a.Route, r, vh, rc, levels, h, req)
	default:
		return fail(res, ErrUnsupported, "route %s: action %T", res.Route, a)
	}
}

func routeName(r *routev3.Route, i int) string {
	if r.GetName() != "" {
		return r.GetName()
	}
	return fmt.Sprintf("#%d", i)
}

func needsTLS(vh *routev3.VirtualHost, h *httpRequest) bool {
	switch vh.GetRequireTls() {
	case routev3.VirtualHost_ALL:
		return !h.tls
	case routev3.VirtualHost_EXTERNAL_ONLY:
		return !h.tls // the simulated client is external
	}
	return false
}

// matchVirtualHost follows Envoy's order: an exact domain, then suffix wildcards ("*.a.com",
// "*-b.a.com") longest first, then prefix wildcards ("a.*") longest first, then "*". With
// ignore_port_in_host_matching the host's port is dropped first.
func matchVirtualHost(rc *routev3.RouteConfiguration, host string) *routev3.VirtualHost {
	host = strings.ToLower(host)
	if rc.GetIgnorePortInHostMatching() {
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
	}
	var suffix, prefix, star *routev3.VirtualHost
	suffixLen, prefixLen := -1, -1
	for _, vh := range rc.GetVirtualHosts() {
		for _, d := range vh.GetDomains() {
			d = strings.ToLower(d)
			switch {
			case d == host:
				return vh
			case d == "*":
				if star == nil {
					star = vh
				}
			case strings.HasPrefix(d, "*"):
				sfx := d[1:]
				if len(host) > len(sfx) && strings.HasSuffix(host, sfx) && len(sfx) > suffixLen {
					suffix, suffixLen = vh, len(sfx)
				}
			case strings.HasSuffix(d, "*"):
				pfx := d[:len(d)-1]
				if len(host) > len(pfx) && strings.HasPrefix(host, pfx) && len(pfx) > prefixLen {
					prefix, prefixLen = vh, len(pfx)
				}
			}
		}
	}
	switch {
	case suffix != nil:
		return suffix
	case prefix != nil:
		return prefix
	}
	return star
}

// routeMatches evaluates a RouteMatch; an error names a match condition the simulation does
// not evaluate.
func routeMatches(m *routev3.RouteMatch, h *httpRequest) (bool, error) {
	caseSensitive := m.GetCaseSensitive() == nil || m.GetCaseSensitive().GetValue()
	eq := func(a, b string) bool { return a == b || (!caseSensitive && strings.EqualFold(a, b)) }
	hasPrefix := func(s, p string) bool { return len(s) >= len(p) && eq(s[:len(p)], p) }
	switch ps := m.GetPathSpecifier().(type) {
	case *routev3.RouteMatch_Prefix:
		if !hasPrefix(h.path, ps.Prefix) {
			return false, nil
		}
	case *routev3.RouteMatch_Path:
		if !eq(h.pathOnly(), ps.Path) {
			return false, nil
		}
	case *routev3.RouteMatch_SafeRegex:
		re, err := compileRegex(ps.SafeRegex.GetRegex(), true)
		if err != nil {
			return false, err
		}
		if !re.MatchString(h.pathOnly()) {
			return false, nil
		}
	case *routev3.RouteMatch_PathSeparatedPrefix:
		p := h.pathOnly()
		if !hasPrefix(p, ps.PathSeparatedPrefix) || (len(p) > len(ps.PathSeparatedPrefix) && p[len(ps.PathSeparatedPrefix)] != '/') {
			return false, nil
		}
	case *routev3.RouteMatch_ConnectMatcher_:
		if h.method != http.MethodConnect {
			return false, nil
		}
	default:
		return false, fmt.Errorf("path specifier %T", ps)
	}
	if m.GetRuntimeFraction() != nil {
		if f := m.GetRuntimeFraction().GetDefaultValue(); fraction(f) < 1 {
			return false, fmt.Errorf("runtime_fraction below 100%%")
		}
	}
	if m.GetGrpc() != nil && !strings.HasPrefix(h.headers.Get("content-type"), "application/grpc") {
		return false, nil
	}
	if m.GetTlsContext() != nil || len(m.GetDynamicMetadata()) > 0 || m.GetFilterState() != nil {
		return false, fmt.Errorf("tls_context, dynamic_metadata and filter_state matches")
	}
	for _, hm := range m.GetHeaders() {
		ok, err := headerMatches(hm, h)
		if err != nil || !ok {
			return false, err
		}
	}
	if len(m.GetQueryParameters()) > 0 {
		q := parseQuery(h.query())
		for _, qm := range m.GetQueryParameters() {
			v, present := q[qm.GetName()]
			if !present {
				return false, nil
			}
			switch x := qm.GetQueryParameterMatchSpecifier().(type) {
			case *routev3.QueryParameterMatcher_PresentMatch:
				if !x.PresentMatch {
					return false, nil
				}
			case *routev3.QueryParameterMatcher_StringMatch:
				ok, err := stringMatches(x.StringMatch, v)
				if err != nil || !ok {
					return false, err
				}
			default:
				return false, fmt.Errorf("query parameter matcher %T", x)
			}
		}
	}
	return true, nil
}

// parseQuery keeps each parameter's first value, decoded, as Envoy's matcher reads it.
func parseQuery(q string) map[string]string {
	out := map[string]string{}
	for _, kv := range strings.Split(strings.TrimPrefix(q, "?"), "&") {
		if kv == "" {
			continue
		}
		k, v, _ := strings.Cut(kv, "=")
		if dk, err := url.QueryUnescape(k); err == nil {
			k = dk
		}
		if dv, err := url.QueryUnescape(v); err == nil {
			v = dv
		}
		if _, seen := out[k]; !seen {
			out[k] = v
		}
	}
	return out
}

// headerMatches is Envoy's HeaderMatcher: a missing header matches only "present_match:
// false" (or, inverted, "present_match: true") unless treat_missing_header_as_empty.
func headerMatches(hm *routev3.HeaderMatcher, h *httpRequest) (bool, error) {
	v, present := h.header(hm.GetName())
	presentMatch, isPresent := hm.GetHeaderMatchSpecifier().(*routev3.HeaderMatcher_PresentMatch)
	if !present && !hm.GetTreatMissingHeaderAsEmpty() {
		if hm.GetInvertMatch() {
			return isPresent && presentMatch.PresentMatch, nil
		}
		return isPresent && !presentMatch.PresentMatch, nil
	}
	var ok bool
	switch x := hm.GetHeaderMatchSpecifier().(type) {
	case nil:
		ok = true // any value
	case *routev3.HeaderMatcher_ExactMatch:
		ok = x.ExactMatch == "" || v == x.ExactMatch
	case *routev3.HeaderMatcher_SafeRegexMatch:
		re, err := compileRegex(x.SafeRegexMatch.GetRegex(), true)
		if err != nil {
			return false, err
		}
		ok = re.MatchString(v)
	case *routev3.HeaderMatcher_RangeMatch:
		n, err := strconv.ParseInt(v, 10, 64)
		ok = err == nil && n >= x.RangeMatch.GetStart() && n < x.RangeMatch.GetEnd()
	case *routev3.HeaderMatcher_PresentMatch:
		ok = x.PresentMatch
	case *routev3.HeaderMatcher_PrefixMatch:
		ok = strings.HasPrefix(v, x.PrefixMatch)
	case *routev3.HeaderMatcher_SuffixMatch:
		ok = strings.HasSuffix(v, x.SuffixMatch)
	case *routev3.HeaderMatcher_ContainsMatch:
		ok = strings.Contains(v, x.ContainsMatch)
	case *routev3.HeaderMatcher_StringMatch:
		var err error
		if ok, err = stringMatches(x.StringMatch, v); err != nil {
			return false, err
		}
	default:
		return false, fmt.Errorf("header matcher %T", x)
	}
	return ok != hm.GetInvertMatch(), nil
}

func stringMatches(m *matcherv3.StringMatcher, v string) (bool, error) {
	ic := m.GetIgnoreCase()
	fold := func(s string) string {
		if ic {
			return strings.ToLower(s)
		}
		return s
	}
	switch x := m.GetMatchPattern().(type) {
	case *matcherv3.StringMatcher_Exact:
		return fold(v) == fold(x.Exact), nil
	case *matcherv3.StringMatcher_Prefix:
		return strings.HasPrefix(fold(v), fold(x.Prefix)), nil
	case *matcherv3.StringMatcher_Suffix:
		return strings.HasSuffix(fold(v), fold(x.Suffix)), nil
	case *matcherv3.StringMatcher_Contains:
		return strings.Contains(fold(v), fold(x.Contains)), nil
	case *matcherv3.StringMatcher_SafeRegex:
		re, err := compileRegex(x.SafeRegex.GetRegex(), true)
		if err != nil {
			return false, err
		}
		return re.MatchString(v), nil
	}
	return false, fmt.Errorf("string matcher %T", m.GetMatchPattern())
}

// compileRegex compiles an RE2 pattern; Envoy's safe_regex must match the whole value.
func compileRegex(pattern string, full bool) (*regexp.Regexp, error) {
	if full {
		pattern = "^(?:" + pattern + ")$"
	}
	re, err := regexp.Compile(pattern)
	if err != nil {
		return nil, fmt.Errorf("%w: regex %q: %v", ErrInvalid, pattern, err)
	}
	return re, nil
}

func fraction(f *typev3.FractionalPercent) float64 {
	if f == nil {
		return 1
	}
	den := map[typev3.FractionalPercent_DenominatorType]float64{
		typev3.FractionalPercent_HUNDRED: 100, typev3.FractionalPercent_TEN_THOUSAND: 1e4, typev3.FractionalPercent_MILLION: 1e6,
	}[f.GetDenominator()]
	return float64(f.GetNumerator()) / den
}

func redirectStatus(c routev3.RedirectAction_RedirectResponseCode) int {
	switch c {
	case routev3.RedirectAction_FOUND:
		return http.StatusFound
	case routev3.RedirectAction_SEE_OTHER:
		return http.StatusSeeOther
	case routev3.RedirectAction_TEMPORARY_REDIRECT:
		return http.StatusTemporaryRedirect
	case routev3.RedirectAction_PERMANENT_REDIRECT:
		return http.StatusPermanentRedirect
	}
	return http.StatusMovedPermanently
}

// redirectLocation builds the Location as Envoy's RedirectAction does.
func redirectLocation(ra *routev3.RedirectAction, m *routev3.RouteMatch, h *httpRequest) (string, error) {
	// The new scheme defaults to the request's :scheme; whether the request's port goes is
	// judged against x-forwarded-proto (Envoy's Utility::newUri and processRequestHost).
	scheme := h.headers.Get("x-forwarded-proto")
	if scheme == "" {
		scheme = h.scheme
	}
	newScheme := h.scheme
	switch s := ra.GetSchemeRewriteSpecifier().(type) {
	case *routev3.RedirectAction_HttpsRedirect:
		if s.HttpsRedirect {
			newScheme = "https"
		}
	case *routev3.RedirectAction_SchemeRedirect:
		newScheme = strings.ToLower(s.SchemeRedirect)
	}
	port := ""
	if ra.GetPortRedirect() != 0 {
		port = ":" + strconv.Itoa(int(ra.GetPortRedirect()))
	}
	host := ra.GetHostRedirect()
	if host == "" {
		host = h.host
		// The request's port goes when a port is given, or when the scheme changes and the
		// port was the old scheme's default.
		if i := hostPortIndex(host); i >= 0 {
			reqPort := host[i:]
			remove := port != ""
			if newScheme != scheme {
				remove = remove || (scheme == "https" && reqPort == ":443") || (scheme == "http" && reqPort == ":80")
			}
			if remove {
				host = host[:i]
			}
		}
	}
	p, q := h.pathOnly(), h.query()
	switch ps := ra.GetPathRewriteSpecifier().(type) {
	case *routev3.RedirectAction_PathRedirect:
		// Envoy keeps the request's path when path_redirect is empty (istiod always sets it).
		if ps.PathRedirect == "" {
			break
		}
		if strings.Contains(ps.PathRedirect, "?") {
			p, q = ps.PathRedirect, ""
		} else {
			p = ps.PathRedirect
		}
	case *routev3.RedirectAction_PrefixRewrite:
		p = rewritePrefix(m, h, ps.PrefixRewrite)
	case *routev3.RedirectAction_RegexRewrite:
		var err error
		if p, err = regexRewrite(ps.RegexRewrite, p); err != nil {
			return "", err
		}
	}
	if ra.GetStripQuery() && !strings.Contains(p, "?") {
		q = ""
	}
	if !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	return newScheme + "://" + host + port + p + q, nil
}

// hostPortIndex is where ":port" starts in a host, or -1.
func hostPortIndex(host string) int {
	if strings.HasPrefix(host, "[") {
		if i := strings.LastIndex(host, "]:"); i >= 0 {
			return i + 1
		}
		return -1
	}
	return strings.LastIndex(host, ":")
}

// rewritePrefix replaces the part of the path the route's prefix (or path) matched. It
// returns the path without the query.
func rewritePrefix(m *routev3.RouteMatch, h *httpRequest, rewrite string) string {
	p := h.pathOnly()
	var matched string
	switch ps := m.GetPathSpecifier().(type) {
	case *routev3.RouteMatch_Prefix:
		matched = ps.Prefix
	case *routev3.RouteMatch_Path:
		matched = ps.Path
	case *routev3.RouteMatch_PathSeparatedPrefix:
		matched = ps.PathSeparatedPrefix
	default:
		matched = p
	}
	if len(matched) > len(p) {
		return rewrite
	}
	return rewrite + p[len(matched):]
}

var backref = regexp.MustCompile(`\\(\d)`)

// regexRewrite substitutes every match in the path (query excluded), RE2 GlobalReplace with
// \N back-references.
func regexRewrite(rr *matcherv3.RegexMatchAndSubstitute, p string) (string, error) {
	re, err := compileRegex(rr.GetPattern().GetRegex(), false)
	if err != nil {
		return "", err
	}
	return re.ReplaceAllString(p, backref.ReplaceAllString(strings.ReplaceAll(rr.GetSubstitution(), "$", "$$"), "${$1}")), nil
}

func durationOf(d interface{ AsDuration() time.Duration }) *Duration {
	v := Duration(d.AsDuration())
	return &v
}
