package gatewayapi

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"sailplane.dev/shared/schema"
)

// ruleName is the explicit rule name, or istiod's "<ns>.<route>.<rule index>".
func ruleName(name *gwv1.SectionName, obj object, i int) string {
	if name != nil {
		return string(*name)
	}
	return obj.GetNamespace() + "." + obj.GetName() + "." + strconv.Itoa(i)
}

// joinErr keeps the first error's reason and both messages.
func joinErr(a, b *configError) *configError {
	if a == nil {
		return b
	}
	if b == nil {
		return a
	}
	return &configError{Reason: a.Reason, Message: a.Message + "; " + b.Message}
}

func httpRoute(t *translator, r *gwv1.HTTPRoute) route {
	var backends []gwv1.BackendObjectReference
	for _, rule := range r.Spec.Rules {
		for _, b := range rule.BackendRefs {
			backends = append(backends, b.BackendObjectReference)
		}
	}
	return route{kind: schema.HTTPRoute, obj: r, parents: r.Spec.ParentRefs, hostnames: r.Spec.Hostnames, backends: backends,
		convert: func(mesh bool) (*converted, *configError) {
			return eachMatch(r.Spec.Rules, func(rule gwv1.HTTPRouteRule) []gwv1.HTTPRouteMatch { return rule.Matches },
				func(rule gwv1.HTTPRouteRule, m *gwv1.HTTPRouteMatch, i int) (*networking.HTTPRoute, *configError) {
					return t.httpRule(r, rule, m, i, !mesh)
				})
		}}
}

// eachMatch converts every match of every rule: one Istio rule per match, so that each sorts by
// its own precedence, and one matching everything for a rule without matches. A rule that
// cannot be converted at all fails the route; otherwise the last rule's problem is reported, as
// istiod reports it.
func eachMatch[R, M any](rules []R, matchesOf func(R) []M,
	convert func(rule R, m *M, i int) (*networking.HTTPRoute, *configError)) (*converted, *configError) {
	out := &converted{}
	var soft *configError
	for i, rule := range rules {
		matches := matchesOf(rule)
		for mi := range max(len(matches), 1) {
			var m *M
			if len(matches) > 0 {
				m = &matches[mi]
			}
			hr, err := convert(rule, m, i)
			if hr == nil {
				return nil, err
			}
			if err != nil {
				soft = err
			}
			out.http = append(out.http, hr)
		}
	}
	return out, soft
}

func (t *translator) httpRule(r *gwv1.HTTPRoute, rule gwv1.HTTPRouteRule, m *gwv1.HTTPRouteMatch, i int, enforce bool) (*networking.HTTPRoute, *configError) {
	out := &networking.HTTPRoute{Name: ruleName(rule.Name, r, i)}
	if m != nil {
		mr, err := httpMatch(*m)
		if err != nil {
			return nil, err
		}
		out.Match = []*networking.HTTPMatchRequest{mr}
	}
	var mirrorErr *configError
	for _, f := range rule.Filters {
		switch f.Type {
		case gwv1.HTTPRouteFilterRequestHeaderModifier:
			h, err := headerOps(f.RequestHeaderModifier)
			if err != nil {
				return nil, err
			}
			if h != nil {
				if out.Headers == nil {
					out.Headers = &networking.Headers{}
				}
				out.Headers.Request = h
			}
		case gwv1.HTTPRouteFilterResponseHeaderModifier:
			h, err := headerOps(f.ResponseHeaderModifier)
			if err != nil {
				return nil, err
			}
			if h != nil {
				if out.Headers == nil {
					out.Headers = &networking.Headers{}
				}
				out.Headers.Response = h
			}
		case gwv1.HTTPRouteFilterRequestRedirect:
			out.Redirect = redirect(f.RequestRedirect)
		case gwv1.HTTPRouteFilterRequestMirror:
			mp, err := t.mirror(f.RequestMirror, "HTTPRoute", r.Namespace, enforce)
			if err != nil {
				mirrorErr = err
			} else if mp != nil {
				out.Mirrors = append(out.Mirrors, mp)
			}
		case gwv1.HTTPRouteFilterURLRewrite:
			out.Rewrite = rewrite(f.URLRewrite)
		case gwv1.HTTPRouteFilterCORS:
			out.CorsPolicy = cors(f.CORS)
		default:
			return nil, errorf(reasonInvalidFilter, "unsupported filter type %q", f.Type)
		}
	}
	if rr := rule.Retry; rr != nil {
		on := []string{"connect-failure", "refused-stream", "unavailable", "cancelled"}
		for _, c := range rr.Codes {
			on = append(on, strconv.Itoa(int(c)))
		}
		out.Retries = &networking.HTTPRetry{Attempts: int32(deref(rr.Attempts, 2)), RetryOn: strings.Join(on, ",")}
		if out.Retries.Attempts == 0 {
			out.Retries.RetryOn = ""
		}
		if rr.Backoff != nil {
			d, _ := time.ParseDuration(string(*rr.Backoff))
			out.Retries.Backoff = durationpb.New(d)
		}
	}
	if to := rule.Timeouts; to != nil {
		if to.Request != nil {
			if d, _ := time.ParseDuration(string(*to.Request)); d != 0 {
				out.Timeout = durationpb.New(d)
			}
		}
		if to.BackendRequest != nil {
			if d, _ := time.ParseDuration(string(*to.BackendRequest)); d != 0 {
				if out.Retries != nil {
					out.Retries.PerTryTimeout = durationpb.New(d)
				} else {
					out.Timeout = durationpb.New(d)
				}
			}
		}
	}
	refs := make([]backend, len(rule.BackendRefs))
	for i, b := range rule.BackendRefs {
		refs[i] = backend{ref: b.BackendRef, filters: b.Filters}
	}
	if weightSum(refs) == 0 && out.Redirect == nil {
		// The spec: no backend of weight > 0 answers 500.
		out.DirectResponse = &networking.HTTPDirectResponse{Status: 500}
		return out, mirrorErr
	}
	dests, soft, err := t.httpDestinations(refs, "HTTPRoute", r.Namespace, enforce)
	if err != nil {
		return nil, err
	}
	out.Route = dests
	return out, joinErr(soft, mirrorErr)
}

// backend is an HTTP or gRPC backendRef with its filters.
type backend struct {
	ref     gwv1.BackendRef
	filters []gwv1.HTTPRouteFilter
}

func weightSum(refs []backend) int {
	s := 0
	for _, b := range refs {
		s += int(deref(b.ref.Weight, 1))
	}
	return s
}

// httpDestinations are the weighted destinations of a rule: weight-0 backends dropped, a single
// one unweighted; an invalid backend (not found, not permitted, wrong kind) stays, so its share
// of requests fails as the spec asks, and is reported.
func (t *translator) httpDestinations(refs []backend, kind, ns string, enforce bool) ([]*networking.HTTPRouteDestination, *configError, *configError) {
	var keep []backend
	for _, b := range refs {
		if deref(b.ref.Weight, 1) != 0 {
			keep = append(keep, b)
		}
	}
	var soft *configError
	var out []*networking.HTTPRouteDestination
	for _, b := range keep {
		dst, bad, err := t.destination(b.ref.BackendObjectReference, kind, ns, enforce)
		if err != nil {
			return nil, nil, err
		}
		if bad != nil {
			soft = bad
		}
		rd := &networking.HTTPRouteDestination{Destination: dst}
		if len(keep) > 1 {
			rd.Weight = deref(b.ref.Weight, 1)
		}
		for _, f := range b.filters {
			switch f.Type {
			case gwv1.HTTPRouteFilterRequestHeaderModifier, gwv1.HTTPRouteFilterResponseHeaderModifier:
				src := f.RequestHeaderModifier
				if f.Type == gwv1.HTTPRouteFilterResponseHeaderModifier {
					src = f.ResponseHeaderModifier
				}
				h, err := headerOps(src)
				if err != nil {
					return nil, nil, err
				}
				if h == nil {
					continue
				}
				if rd.Headers == nil {
					rd.Headers = &networking.Headers{}
				}
				if f.Type == gwv1.HTTPRouteFilterRequestHeaderModifier {
					rd.Headers.Request = h
				} else {
					rd.Headers.Response = h
				}
			default:
				return nil, nil, errorf(reasonInvalidFilter, "unsupported filter type %q", f.Type)
			}
		}
		out = append(out, rd)
	}
	return out, soft, nil
}

// destination resolves a backendRef: a Service (by name, in its namespace) or an Istio
// Hostname (a ServiceEntry host). bad is a backend to keep but report; err a hard error.
func (t *translator) destination(ref gwv1.BackendObjectReference, kind, ns string, enforce bool) (dst *networking.Destination, bad, err *configError) {
	group, k := string(deref(ref.Group, "")), string(deref(ref.Kind, "Service"))
	toNs := string(deref(ref.Namespace, gwv1.Namespace(ns)))
	if enforce && toNs != ns && !t.allowed(kind, ns, group, k, toNs, string(ref.Name)) {
		return &networking.Destination{}, errorf(string(gwv1.RouteReasonRefNotPermitted),
			"backendRef %s/%s not accessible to a %s in namespace %q (missing a ReferenceGrant?)", ref.Name, toNs, kind, ns), nil
	}
	var host string
	switch {
	case (group == "" || group == "core") && k == "Service":
		if strings.Contains(string(ref.Name), ".") {
			return nil, nil, errorf(reasonInvalidDestination, "service name invalid; the name of the Service must be used, not the hostname.")
		}
		host = fmt.Sprintf("%s.%s.svc.%s", ref.Name, toNs, t.domain)
	case group == "multicluster.x-k8s.io" && k == "ServiceImport":
		// As istiod without MCS hosts: the Service of the name, already cluster-wide here.
		host = fmt.Sprintf("%s.%s.svc.%s", ref.Name, toNs, t.domain)
	case group == "networking.istio.io" && k == "Hostname":
		if ref.Namespace != nil {
			return nil, nil, errorf(reasonInvalidDestination, "namespace may not be set with Hostname type")
		}
		host = string(ref.Name)
	default:
		return &networking.Destination{}, errorf(string(gwv1.RouteReasonInvalidKind),
			"referencing unsupported backendRef: group %q kind %q", group, k), nil
	}
	if !t.serviceExists(host, toNs) {
		bad = errorf(string(gwv1.RouteReasonBackendNotFound), "backend(%s) not found", host)
	}
	if ref.Port == nil {
		return nil, nil, errorf(reasonInvalidDestination, "port is required in backendRef")
	}
	return &networking.Destination{Host: host, Port: &networking.PortSelector{Number: uint32(*ref.Port)}}, bad, nil
}

func (t *translator) mirror(f *gwv1.HTTPRequestMirrorFilter, kind, ns string, enforce bool) (*networking.HTTPMirrorPolicy, *configError) {
	if f == nil {
		return nil, nil
	}
	dst, bad, err := t.destination(f.BackendRef, kind, ns, enforce)
	if err != nil {
		return nil, err
	}
	if bad != nil {
		return nil, bad
	}
	mp := &networking.HTTPMirrorPolicy{Destination: dst}
	if fr := f.Fraction; fr != nil {
		mp.Percentage = &networking.Percent{Value: 100 * float64(fr.Numerator) / float64(deref(fr.Denominator, 100))}
	} else if f.Percent != nil {
		mp.Percentage = &networking.Percent{Value: float64(*f.Percent)}
	}
	return mp, nil
}

func httpMatch(m gwv1.HTTPRouteMatch) (*networking.HTTPMatchRequest, *configError) {
	out := &networking.HTTPMatchRequest{}
	if m.Path != nil {
		v := deref(m.Path.Value, "/")
		switch deref(m.Path.Type, gwv1.PathMatchPathPrefix) {
		case gwv1.PathMatchPathPrefix:
			if v != "/" {
				v = strings.TrimSuffix(v, "/") // "a trailing / is ignored"
			}
			out.Uri = &networking.StringMatch{MatchType: &networking.StringMatch_Prefix{Prefix: v}}
		case gwv1.PathMatchExact:
			out.Uri = &networking.StringMatch{MatchType: &networking.StringMatch_Exact{Exact: v}}
		case gwv1.PathMatchRegularExpression:
			out.Uri = &networking.StringMatch{MatchType: &networking.StringMatch_Regex{Regex: v}}
		default:
			return nil, errorf(reasonInvalidConfig, "unknown type: %q is not supported Path match type", *m.Path.Type)
		}
	}
	for _, h := range m.Headers {
		if out.Headers == nil {
			out.Headers = map[string]*networking.StringMatch{}
		}
		switch deref(h.Type, gwv1.HeaderMatchExact) {
		case gwv1.HeaderMatchExact:
			out.Headers[string(h.Name)] = &networking.StringMatch{MatchType: &networking.StringMatch_Exact{Exact: h.Value}}
		case gwv1.HeaderMatchRegularExpression:
			out.Headers[string(h.Name)] = &networking.StringMatch{MatchType: &networking.StringMatch_Regex{Regex: h.Value}}
		default:
			return nil, errorf(reasonInvalidConfig, "unknown type: %q is not supported HeaderMatch type", *h.Type)
		}
	}
	for _, q := range m.QueryParams {
		if out.QueryParams == nil {
			out.QueryParams = map[string]*networking.StringMatch{}
		}
		switch deref(q.Type, gwv1.QueryParamMatchExact) {
		case gwv1.QueryParamMatchExact:
			out.QueryParams[string(q.Name)] = &networking.StringMatch{MatchType: &networking.StringMatch_Exact{Exact: q.Value}}
		case gwv1.QueryParamMatchRegularExpression:
			out.QueryParams[string(q.Name)] = &networking.StringMatch{MatchType: &networking.StringMatch_Regex{Regex: q.Value}}
		default:
			return nil, errorf(reasonInvalidConfig, "unknown type: %q is not supported QueryParams type", *q.Type)
		}
	}
	if m.Method != nil {
		out.Method = &networking.StringMatch{MatchType: &networking.StringMatch_Exact{Exact: string(*m.Method)}}
	}
	return out, nil
}

func validHeaderValue(v string) bool {
	for _, c := range []byte(v) {
		if c != 0x09 && (c < 0x20 || c == 0x7F) {
			return false
		}
	}
	return true
}

func headerOps(f *gwv1.HTTPHeaderFilter) (*networking.Headers_HeaderOperations, *configError) {
	if f == nil {
		return nil, nil
	}
	for _, h := range append(append([]gwv1.HTTPHeader{}, f.Set...), f.Add...) {
		if !validHeaderValue(h.Value) {
			return nil, errorf(reasonInvalidFilter, "header %q value contains invalid characters", h.Name)
		}
	}
	toMap := func(hs []gwv1.HTTPHeader) map[string]string {
		if len(hs) == 0 {
			return nil
		}
		m := map[string]string{}
		for _, h := range hs {
			k := strings.ToLower(string(h.Name))
			if _, dup := m[k]; !dup { // "subsequent entries with an equivalent name MUST be ignored"
				m[k] = h.Value
			}
		}
		return m
	}
	return &networking.Headers_HeaderOperations{Add: toMap(f.Add), Set: toMap(f.Set), Remove: f.Remove}, nil
}

func redirect(f *gwv1.HTTPRequestRedirectFilter) *networking.HTTPRedirect {
	if f == nil {
		return nil
	}
	out := &networking.HTTPRedirect{}
	if f.StatusCode != nil {
		out.RedirectCode = uint32(*f.StatusCode)
	}
	if f.Hostname != nil {
		out.Authority = string(*f.Hostname)
	}
	if f.Scheme != nil {
		out.Scheme = *f.Scheme
	}
	switch {
	case f.Port != nil:
		out.RedirectPort = &networking.HTTPRedirect_Port{Port: uint32(*f.Port)}
	case f.Scheme != nil:
		out.RedirectPort = &networking.HTTPRedirect_DerivePort{DerivePort: networking.HTTPRedirect_FROM_PROTOCOL_DEFAULT}
	default:
		// "When empty, the port of the request is used", unlike Istio's default.
		out.RedirectPort = &networking.HTTPRedirect_DerivePort{DerivePort: networking.HTTPRedirect_FROM_REQUEST_PORT}
	}
	if p := f.Path; p != nil {
		switch p.Type {
		case gwv1.FullPathHTTPPathModifier:
			out.Uri = deref(p.ReplaceFullPath, "")
		case gwv1.PrefixMatchHTTPPathModifier:
			out.PrefixRewrite = deref(p.ReplacePrefixMatch, "")
		}
	}
	return out
}

func rewrite(f *gwv1.HTTPURLRewriteFilter) *networking.HTTPRewrite {
	if f == nil {
		return nil
	}
	out := &networking.HTTPRewrite{}
	if p := f.Path; p != nil {
		switch p.Type {
		case gwv1.PrefixMatchHTTPPathModifier:
			out.Uri = strings.TrimSuffix(deref(p.ReplacePrefixMatch, ""), "/")
			if out.Uri == "" {
				out.Uri = "/" // replacing the prefix by "/" removes it
			}
		case gwv1.FullPathHTTPPathModifier:
			out.UriRegexRewrite = &networking.RegexRewrite{Match: "/.*", Rewrite: deref(p.ReplaceFullPath, "")}
		}
	}
	if f.Hostname != nil {
		out.Authority = string(*f.Hostname)
	}
	if out.Uri == "" && out.UriRegexRewrite == nil && out.Authority == "" {
		return nil
	}
	return out
}

func cors(f *gwv1.HTTPCORSFilter) *networking.CorsPolicy {
	if f == nil {
		return nil
	}
	out := &networking.CorsPolicy{UnmatchedPreflights: networking.CorsPolicy_IGNORE}
	for _, o := range f.AllowOrigins {
		s := string(o)
		switch {
		case s == "":
			continue
		case s == "*":
			out.AllowOrigins = append(out.AllowOrigins, &networking.StringMatch{MatchType: &networking.StringMatch_Regex{
				Regex: `^[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s?#]+$`}})
		case !strings.Contains(s, "*"):
			out.AllowOrigins = append(out.AllowOrigins, &networking.StringMatch{MatchType: &networking.StringMatch_Exact{Exact: s}})
		case strings.Count(s, "*") == 1 && strings.HasSuffix(s, "*"):
			out.AllowOrigins = append(out.AllowOrigins, &networking.StringMatch{MatchType: &networking.StringMatch_Prefix{
				Prefix: strings.TrimSuffix(s, "*")}})
		default:
			re := strings.ReplaceAll(regexp.QuoteMeta(s), `\*`, ".*")
			out.AllowOrigins = append(out.AllowOrigins, &networking.StringMatch{MatchType: &networking.StringMatch_Regex{Regex: "^" + re + "$"}})
		}
	}
	if deref(f.AllowCredentials, false) {
		out.AllowCredentials = wrapperspb.Bool(true)
	}
	for _, m := range f.AllowMethods {
		out.AllowMethods = append(out.AllowMethods, string(m))
	}
	for _, h := range f.AllowHeaders {
		out.AllowHeaders = append(out.AllowHeaders, string(h))
	}
	for _, h := range f.ExposeHeaders {
		out.ExposeHeaders = append(out.ExposeHeaders, string(h))
	}
	if f.MaxAge > 0 {
		out.MaxAge = durationpb.New(time.Duration(f.MaxAge) * time.Second)
	}
	return out
}

func grpcRoute(t *translator, r *gwv1.GRPCRoute) route {
	var backends []gwv1.BackendObjectReference
	for _, rule := range r.Spec.Rules {
		for _, b := range rule.BackendRefs {
			backends = append(backends, b.BackendObjectReference)
		}
	}
	return route{kind: schema.GRPCRoute, obj: r, parents: r.Spec.ParentRefs, hostnames: r.Spec.Hostnames, backends: backends,
		convert: func(mesh bool) (*converted, *configError) {
			return eachMatch(r.Spec.Rules, func(rule gwv1.GRPCRouteRule) []gwv1.GRPCRouteMatch { return rule.Matches },
				func(rule gwv1.GRPCRouteRule, m *gwv1.GRPCRouteMatch, i int) (*networking.HTTPRoute, *configError) {
					return t.grpcRule(r, rule, m, i, !mesh)
				})
		}}
}

func (t *translator) grpcRule(r *gwv1.GRPCRoute, rule gwv1.GRPCRouteRule, m *gwv1.GRPCRouteMatch, i int, enforce bool) (*networking.HTTPRoute, *configError) {
	out := &networking.HTTPRoute{Name: ruleName(rule.Name, r, i)}
	if m != nil {
		mr := &networking.HTTPMatchRequest{}
		if mm := m.Method; mm != nil {
			if mm.Service == nil && mm.Method == nil {
				return nil, errorf(reasonInvalidConfig, "gRPC match must have method or service defined")
			}
			svc, meth := deref(mm.Service, ""), deref(mm.Method, "")
			exact := deref(mm.Type, gwv1.GRPCMethodMatchExact) == gwv1.GRPCMethodMatchExact
			switch {
			case mm.Method == nil && exact:
				mr.Uri = &networking.StringMatch{MatchType: &networking.StringMatch_Prefix{Prefix: "/" + svc + "/"}}
			case mm.Method == nil:
				mr.Uri = &networking.StringMatch{MatchType: &networking.StringMatch_Regex{Regex: "/" + svc + "/.+"}}
			case mm.Service == nil:
				mr.Uri = &networking.StringMatch{MatchType: &networking.StringMatch_Regex{Regex: "/[^/]+/" + meth}}
			case exact:
				mr.Uri = &networking.StringMatch{MatchType: &networking.StringMatch_Exact{Exact: "/" + svc + "/" + meth}}
			default:
				mr.Uri = &networking.StringMatch{MatchType: &networking.StringMatch_Regex{Regex: "/" + svc + "/" + meth}}
			}
		}
		for _, h := range m.Headers {
			if mr.Headers == nil {
				mr.Headers = map[string]*networking.StringMatch{}
			}
			if deref(h.Type, gwv1.GRPCHeaderMatchExact) == gwv1.GRPCHeaderMatchRegularExpression {
				mr.Headers[string(h.Name)] = &networking.StringMatch{MatchType: &networking.StringMatch_Regex{Regex: h.Value}}
			} else {
				mr.Headers[string(h.Name)] = &networking.StringMatch{MatchType: &networking.StringMatch_Exact{Exact: h.Value}}
			}
		}
		out.Match = []*networking.HTTPMatchRequest{mr}
	}
	for _, f := range rule.Filters {
		switch f.Type {
		case gwv1.GRPCRouteFilterRequestHeaderModifier, gwv1.GRPCRouteFilterResponseHeaderModifier:
			src := f.RequestHeaderModifier
			if f.Type == gwv1.GRPCRouteFilterResponseHeaderModifier {
				src = f.ResponseHeaderModifier
			}
			h, err := headerOps(src)
			if err != nil {
				return nil, err
			}
			if h == nil {
				continue
			}
			if out.Headers == nil {
				out.Headers = &networking.Headers{}
			}
			if f.Type == gwv1.GRPCRouteFilterRequestHeaderModifier {
				out.Headers.Request = h
			} else {
				out.Headers.Response = h
			}
		case gwv1.GRPCRouteFilterRequestMirror:
			mp, err := t.mirror(f.RequestMirror, "GRPCRoute", r.Namespace, enforce)
			if err != nil {
				return nil, err
			}
			out.Mirrors = append(out.Mirrors, mp)
		default:
			return nil, errorf(reasonInvalidFilter, "unsupported filter type %q", f.Type)
		}
	}
	refs := make([]backend, len(rule.BackendRefs))
	for i, b := range rule.BackendRefs {
		var fs []gwv1.HTTPRouteFilter
		for _, f := range b.Filters {
			switch f.Type {
			case gwv1.GRPCRouteFilterRequestHeaderModifier:
				fs = append(fs, gwv1.HTTPRouteFilter{Type: gwv1.HTTPRouteFilterRequestHeaderModifier, RequestHeaderModifier: f.RequestHeaderModifier})
			case gwv1.GRPCRouteFilterResponseHeaderModifier:
				fs = append(fs, gwv1.HTTPRouteFilter{Type: gwv1.HTTPRouteFilterResponseHeaderModifier, ResponseHeaderModifier: f.ResponseHeaderModifier})
			default:
				return nil, errorf(reasonInvalidFilter, "unsupported filter type %q", f.Type)
			}
		}
		refs[i] = backend{ref: b.BackendRef, filters: fs}
	}
	if weightSum(refs) == 0 {
		out.DirectResponse = &networking.HTTPDirectResponse{Status: 500}
		return out, nil
	}
	dests, soft, err := t.httpDestinations(refs, "GRPCRoute", r.Namespace, enforce)
	if err != nil {
		return nil, err
	}
	out.Route = dests
	return out, soft
}

// l4Destinations are a TCP or TLS rule's destinations; no backend of weight > 0 routes to a
// destination that does not exist, refusing connections as the spec asks.
func (t *translator) l4Destinations(refs []gwv1.BackendRef, kind, ns string, enforce bool) ([]*networking.RouteDestination, *configError, *configError) {
	var keep []gwv1.BackendRef
	for _, b := range refs {
		if deref(b.Weight, 1) != 0 {
			keep = append(keep, b)
		}
	}
	if len(keep) == 0 {
		return []*networking.RouteDestination{{Destination: &networking.Destination{Host: "internal.cluster.local",
			Subset: "zero-weight", Port: &networking.PortSelector{Number: 65535}}}}, nil, nil
	}
	var soft *configError
	var out []*networking.RouteDestination
	for _, b := range keep {
		dst, bad, err := t.destination(b.BackendObjectReference, kind, ns, enforce)
		if err != nil {
			return nil, nil, err
		}
		if bad != nil {
			soft = bad
		}
		rd := &networking.RouteDestination{Destination: dst}
		if len(keep) > 1 {
			rd.Weight = deref(b.Weight, 1)
		}
		out = append(out, rd)
	}
	return out, soft, nil
}

func tcpRoute(t *translator, r *gwv1.TCPRoute) route {
	var backends []gwv1.BackendObjectReference
	for _, rule := range r.Spec.Rules {
		for _, b := range rule.BackendRefs {
			backends = append(backends, b.BackendObjectReference)
		}
	}
	return route{kind: schema.TCPRoute, obj: r, parents: r.Spec.ParentRefs, backends: backends,
		convert: func(mesh bool) (*converted, *configError) {
			out := &converted{}
			var soft *configError
			for _, rule := range r.Spec.Rules {
				d, bad, err := t.l4Destinations(rule.BackendRefs, "TCPRoute", r.Namespace, !mesh)
				if err != nil {
					return nil, err
				}
				if bad != nil {
					soft = bad
				}
				out.tcp = append(out.tcp, &networking.TCPRoute{Route: d})
			}
			return out, soft
		}}
}

func tlsRoute(t *translator, r *gwv1.TLSRoute) route {
	var backends []gwv1.BackendObjectReference
	for _, rule := range r.Spec.Rules {
		for _, b := range rule.BackendRefs {
			backends = append(backends, b.BackendObjectReference)
		}
	}
	return route{kind: schema.TLSRoute, obj: r, parents: r.Spec.ParentRefs, hostnames: r.Spec.Hostnames, backends: backends,
		convert: func(mesh bool) (*converted, *configError) {
			out := &converted{}
			var soft *configError
			for _, rule := range r.Spec.Rules {
				d, bad, err := t.l4Destinations(rule.BackendRefs, "TLSRoute", r.Namespace, !mesh)
				if err != nil {
					return nil, err
				}
				if bad != nil {
					soft = bad
				}
				out.tls = append(out.tls, &networking.TLSRoute{Route: d,
					Match: []*networking.TLSMatchAttributes{{SniHosts: hostStrings(r.Spec.Hostnames)}}})
			}
			return out, soft
		}}
}

// meshSNI gives TLS rules without hostnames the mesh parent's hosts as SNI.
func meshSNI(rs []*networking.TLSRoute, hosts []string) []*networking.TLSRoute {
	var out []*networking.TLSRoute
	for _, r := range rs {
		if len(r.Match) == 1 && slices.Equal(r.Match[0].SniHosts, []string{"*"}) {
			r = r.DeepCopy()
			r.Match[0].SniHosts = hosts
		}
		out = append(out, r)
	}
	return out
}

// sniFor keeps, of a rule's several SNI hosts, those the mesh host matches.
func sniFor(rs []*networking.TLSRoute, host string) []*networking.TLSRoute {
	var out []*networking.TLSRoute
	for _, r := range rs {
		if len(r.Match) == 1 && len(r.Match[0].SniHosts) > 1 {
			r = r.DeepCopy()
			var keep []string
			for _, h := range r.Match[0].SniHosts {
				if hostsMatch(host, h) {
					keep = append(keep, h)
				}
			}
			r.Match[0].SniHosts = keep
		}
		out = append(out, r)
	}
	return out
}

// listenerTLS narrows TLS rules' SNI hosts to what the listener's hostname admits; rules left
// without a host are dropped.
func listenerTLS(rs []*networking.TLSRoute, lh string) []*networking.TLSRoute {
	if lh == "" || len(rs) == 0 {
		return rs
	}
	var out []*networking.TLSRoute
	for _, r := range rs {
		r = r.DeepCopy()
		has := false
		for _, m := range r.Match {
			var hosts []string
			for _, h := range m.SniHosts {
				switch {
				case hostSubsetOf(h, lh):
					hosts = append(hosts, h)
				case hostSubsetOf(lh, h):
					hosts = append(hosts, lh)
				}
			}
			m.SniHosts = hosts
			has = has || len(hosts) > 0
		}
		if has || len(r.Match) == 0 {
			out = append(out, r)
		}
	}
	return out
}
