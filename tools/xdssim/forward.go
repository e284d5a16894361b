package xdssim

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
)

// headerLevel is the header mutations of one level of the route configuration.
type headerLevel struct {
	reqAdd     []*corev3.HeaderValueOption
	reqRemove  []string
	respAdd    []*corev3.HeaderValueOption
	respRemove []string
}

func routeLevel(r *routev3.Route) headerLevel {
	return headerLevel{r.GetRequestHeadersToAdd(), r.GetRequestHeadersToRemove(), r.GetResponseHeadersToAdd(), r.GetResponseHeadersToRemove()}
}

func vhostLevel(v *routev3.VirtualHost) headerLevel {
	return headerLevel{v.GetRequestHeadersToAdd(), v.GetRequestHeadersToRemove(), v.GetResponseHeadersToAdd(), v.GetResponseHeadersToRemove()}
}

func configLevel(rc *routev3.RouteConfiguration) headerLevel {
	return headerLevel{rc.GetRequestHeadersToAdd(), rc.GetRequestHeadersToRemove(), rc.GetResponseHeadersToAdd(), rc.GetResponseHeadersToRemove()}
}

func clusterLevel(c *routev3.WeightedCluster_ClusterWeight) headerLevel {
	return headerLevel{c.GetRequestHeadersToAdd(), c.GetRequestHeadersToRemove(), c.GetResponseHeadersToAdd(), c.GetResponseHeadersToRemove()}
}

// ordered puts levels (most specific first) in the order Envoy applies them: most specific
// first, so that the enclosing levels' values win, unless most_specific_header_mutations_wins.
func ordered(levels []headerLevel, mostSpecificWins bool) []headerLevel {
	if !mostSpecificWins {
		return levels
	}
	out := make([]headerLevel, len(levels))
	for i, l := range levels {
		out[len(levels)-1-i] = l
	}
	return out
}

// ops lists a level's mutations: removals, then additions (Envoy's remove-before-add).
func ops(add []*corev3.HeaderValueOption, remove []string) []HeaderOp {
	var out []HeaderOp
	for _, r := range remove {
		out = append(out, HeaderOp{Op: "remove", Name: strings.ToLower(r)})
	}
	for _, o := range add {
		op := "append"
		switch o.GetAppendAction() {
		case corev3.HeaderValueOption_ADD_IF_ABSENT:
			op = "add_if_absent"
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD:
			op = "set"
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS:
			op = "overwrite_if_exists"
		}
		// The deprecated append field, when set, decides alone.
		if o.GetAppend() != nil {
			op = "set"
			if o.GetAppend().GetValue() {
				op = "append"
			}
		}
		v := o.GetHeader().GetValue()
		if v == "" && len(o.GetHeader().GetRawValue()) > 0 {
			v = string(o.GetHeader().GetRawValue())
		}
		out = append(out, HeaderOp{Op: op, Name: strings.ToLower(o.GetHeader().GetKey()), Value: v, KeepEmpty: o.GetKeepEmptyValue()})
	}
	return out
}

func requestOps(levels []headerLevel, mostSpecificWins bool) []HeaderOp {
	var out []HeaderOp
	for _, l := range ordered(levels, mostSpecificWins) {
		out = append(out, ops(l.reqAdd, l.reqRemove)...)
	}
	return out
}

func responseOps(levels []headerLevel, mostSpecificWins bool) []HeaderOp {
	var out []HeaderOp
	for _, l := range ordered(levels, mostSpecificWins) {
		out = append(out, ops(l.respAdd, l.respRemove)...)
	}
	return out
}

// Apply performs header mutations on h, as Envoy does.
func Apply(h http.Header, ops []HeaderOp) {
	for _, o := range ops {
		k := http.CanonicalHeaderKey(o.Name)
		_, exists := h[k]
		switch o.Op {
		case "remove":
			h.Del(k)
			continue
		case "add_if_absent":
			if exists {
				continue
			}
		case "overwrite_if_exists":
			if !exists {
				continue
			}
			h.Del(k)
		case "set":
			h.Del(k)
		}
		if o.Value == "" && !o.KeepEmpty {
			continue
		}
		h.Add(k, o.Value)
	}
}

type weighted struct {
	name   string
	weight uint32
}

// pickWeighted walks the clusters by weight as Envoy does with its random draw; Pick stands
// for the draw.
func pickWeighted(ws []weighted, pick uint64) string {
	var total uint64
	for _, w := range ws {
		total += uint64(w.weight)
	}
	if total == 0 {
		return ""
	}
	v := pick % total
	var acc uint64
	for _, w := range ws {
		acc += uint64(w.weight)
		if v < acc {
			return w.name
		}
	}
	return ws[len(ws)-1].name
}

// forward applies a RouteAction: cluster choice, rewrites, header mutations, policies.
func (s *Simulator) forward(res *Result, ra *routev3.RouteAction, r *routev3.Route, vh *routev3.VirtualHost,
	rc *routev3.RouteConfiguration, levels []headerLevel, h *httpRequest, req Request) error {
	res.Action = Forward
	up := &UpstreamRequest{Method: h.method, Scheme: h.scheme, Host: h.host, Path: h.path, Headers: h.headers.Clone()}
	hostRewrite := ""
	switch c := ra.GetClusterSpecifier().(type) {
	case *routev3.RouteAction_Cluster:
		res.Cluster = c.Cluster
	case *routev3.RouteAction_ClusterHeader:
		res.Cluster, _ = h.header(c.ClusterHeader)
	case *routev3.RouteAction_WeightedClusters:
		var ws []weighted
		for _, cw := range c.WeightedClusters.GetClusters() {
			ws = append(ws, weighted{cw.GetName(), cw.GetWeight().GetValue()})
			res.WeightedClusters = append(res.WeightedClusters, WeightedCluster{cw.GetName(), cw.GetWeight().GetValue()})
		}
		name := pickWeighted(ws, req.Pick)
		for _, cw := range c.WeightedClusters.GetClusters() {
			if cw.GetName() == name {
				if cw.GetClusterHeader() != "" {
					name, _ = h.header(cw.GetClusterHeader())
				}
				levels = append([]headerLevel{clusterLevel(cw)}, levels...)
				hostRewrite = cw.GetHostRewriteLiteral()
				break
			}
		}
		res.Cluster = name
	default:
		return fail(res, ErrUnsupported, "route %s: cluster specifier %T", res.Route, c)
	}
	// Path rewrites.
	switch {
	case ra.GetPrefixRewrite() != "":
		up.Path = rewritePrefix(r.GetMatch(), h, ra.GetPrefixRewrite()) + h.query()
	case ra.GetRegexRewrite() != nil:
		p, err := regexRewrite(ra.GetRegexRewrite(), h.pathOnly())
		if err != nil {
			return fail(res, ErrInvalid, "route %s: %v", res.Route, err)
		}
		up.Path = p + h.query()
	case ra.GetPathRewritePolicy() != nil:
		return fail(res, ErrUnsupported, "route %s: path_rewrite_policy", res.Route)
	}
	if up.Path != h.path {
		up.Headers.Set("x-envoy-original-path", h.path)
	}
	// Host rewrites (auto_host_rewrite is resolved once the endpoint is known).
	switch hr := ra.GetHostRewriteSpecifier().(type) {
	case *routev3.RouteAction_HostRewriteLiteral:
		up.Host = hr.HostRewriteLiteral
	case *routev3.RouteAction_HostRewriteHeader:
		if v, ok := h.header(hr.HostRewriteHeader); ok && v != "" {
			up.Host = v
		}
	case *routev3.RouteAction_HostRewritePathRegex:
		re, err := compileRegex(hr.HostRewritePathRegex.GetPattern().GetRegex(), false)
		if err != nil {
			return fail(res, ErrInvalid, "route %s: %v", res.Route, err)
		}
		up.Host = re.ReplaceAllString(h.pathOnly(), backref.ReplaceAllString(hr.HostRewritePathRegex.GetSubstitution(), "${$1}"))
	}
	if hostRewrite != "" {
		up.Host = hostRewrite
	}
	Apply(up.Headers, requestOps(levels, rc.GetMostSpecificHeaderMutationsWins()))
	if vh.GetIncludeRequestAttemptCount() {
		up.Headers.Set("x-envoy-attempt-count", "1")
	}
	res.ResponseHeaders = responseOps(levels, rc.GetMostSpecificHeaderMutationsWins())
	res.Upstream = up
	// Policies, reported.
	t := Duration(15 * time.Second) // Envoy's default route timeout
	if ra.GetTimeout() != nil {
		t = Duration(ra.GetTimeout().AsDuration())
	}
	res.Timeout = &t
	if ra.GetIdleTimeout() != nil {
		res.IdleTimeout = durationOf(ra.GetIdleTimeout())
	}
	rp := ra.GetRetryPolicy()
	if rp == nil {
		rp = vh.GetRetryPolicy()
	}
	if rp != nil {
		res.Retry = &Retry{RetryOn: rp.GetRetryOn(), NumRetries: 1}
		if rp.GetNumRetries() != nil {
			res.Retry.NumRetries = rp.GetNumRetries().GetValue()
		}
		if rp.GetPerTryTimeout() != nil {
			res.Retry.PerTryTimeout = durationOf(rp.GetPerTryTimeout())
		}
	}
	// The router tells the upstream how long it will wait: the per-try timeout when it is the
	// shorter, else the route's.
	expect := time.Duration(t)
	if res.Retry != nil && res.Retry.PerTryTimeout != nil && *res.Retry.PerTryTimeout > 0 &&
		(expect == 0 || time.Duration(*res.Retry.PerTryTimeout) < expect) {
		expect = time.Duration(*res.Retry.PerTryTimeout)
	}
	if expect > 0 && h.envoyHeaders {
		up.Headers.Set("x-envoy-expected-rq-timeout-ms", strconv.FormatInt(expect.Milliseconds(), 10))
	}
	for _, m := range ra.GetRequestMirrorPolicies() {
		pct := 100.0
		if rf := m.GetRuntimeFraction(); rf != nil {
			pct = 100 * fraction(rf.GetDefaultValue())
		}
		mr := Mirror{Cluster: m.GetCluster(), Percent: pct, Host: up.Host}
		if !m.GetDisableShadowHostSuffixAppend() {
			mr.Host = shadowHost(up.Host)
		}
		probe := &Result{NetworkFilter: res.NetworkFilter, downstreamH2: res.downstreamH2}
		if s.upstream(probe, m.GetCluster(), req) == nil {
			mr.Endpoint = probe.Endpoint
		}
		res.Mirrors = append(res.Mirrors, mr)
	}
	if res.Cluster == "" || s.clusters[res.Cluster] == nil {
		e := fail(res, ErrClusterNotFound, "route %s: cluster %q", res.Route, res.Cluster)
		switch ra.GetClusterNotFoundResponseCode() {
		case routev3.RouteAction_NOT_FOUND:
			e.Status = http.StatusNotFound
		case routev3.RouteAction_INTERNAL_SERVER_ERROR:
			e.Status = http.StatusInternalServerError
		}
		return e
	}
	if err := s.upstream(res, res.Cluster, req); err != nil {
		return err
	}
	if ra.GetAutoHostRewrite().GetValue() {
		up.Host = res.endpointHost
	}
	return nil
}

// shadowHost appends "-shadow" to the host name, before any port.
func shadowHost(host string) string {
	if i := hostPortIndex(host); i >= 0 {
		return host[:i] + "-shadow" + host[i:]
	}
	return host + "-shadow"
}
