package translate

import (
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"
)

// Client is the kind of xDS client a match is written for; they differ in what they can match on.
type Client int

const (
	// Envoy matches on everything a VirtualService can say. For both clients source matches
	// (sourceLabels, sourceNamespace, gateways) are applied by the caller, which knows the client
	// (model.SourceMatches).
	Envoy Client = iota
	// Proxyless gRPC has no query parameters and no pseudo-header matches.
	Proxyless
)

// RouteMatch converts a VirtualService match; nil and a reason when client cannot express it,
// so the caller can skip the whole match (dropping one condition would widen it).
func RouteMatch(m *networking.HTTPMatchRequest, client Client) (*routev3.RouteMatch, string) {
	rm := &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}}
	if m == nil {
		return rm, ""
	}
	if client == Proxyless {
		switch {
		case len(m.GetQueryParams()) > 0:
			return nil, "queryParams"
		case m.GetMethod() != nil, m.GetAuthority() != nil, m.GetScheme() != nil:
			return nil, "method, authority and scheme matches"
		}
	}
	switch u := m.GetUri().GetMatchType().(type) {
	case *networking.StringMatch_Exact:
		rm.PathSpecifier = &routev3.RouteMatch_Path{Path: u.Exact}
	case *networking.StringMatch_Prefix:
		rm.PathSpecifier = &routev3.RouteMatch_Prefix{Prefix: u.Prefix}
	case *networking.StringMatch_Regex:
		if u.Regex == "" {
			return nil, "empty uri regex"
		}
		rm.PathSpecifier = &routev3.RouteMatch_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: u.Regex}}
	}
	if m.GetIgnoreUriCase() {
		rm.CaseSensitive = wrapperspb.Bool(false)
	}
	// Proxyless has returned above if any of these is set, so this adds nothing for it.
	pseudo := []struct {
		name string
		sm   *networking.StringMatch
	}{{":authority", m.GetAuthority()}, {":method", m.GetMethod()}, {":scheme", m.GetScheme()}}
	for _, p := range pseudo {
		if p.sm != nil {
			rm.Headers = append(rm.Headers, HeaderMatcher(p.name, p.sm, false))
		}
	}
	for _, k := range SortedKeys(m.GetHeaders()) {
		rm.Headers = append(rm.Headers, HeaderMatcher(k, m.GetHeaders()[k], false))
	}
	for _, k := range SortedKeys(m.GetWithoutHeaders()) {
		rm.Headers = append(rm.Headers, HeaderMatcher(k, m.GetWithoutHeaders()[k], true))
	}
	for _, k := range SortedKeys(m.GetQueryParams()) {
		qp := &routev3.QueryParameterMatcher{Name: k}
		if sm := StringMatcher(m.GetQueryParams()[k]); sm != nil {
			qp.QueryParameterMatchSpecifier = &routev3.QueryParameterMatcher_StringMatch{StringMatch: sm}
		} else {
			qp.QueryParameterMatchSpecifier = &routev3.QueryParameterMatcher_PresentMatch{PresentMatch: true}
		}
		rm.QueryParameters = append(rm.QueryParameters, qp)
	}
	return rm, ""
}

// StringMatcher converts a StringMatch; nil for an empty one (or an empty prefix or regex).
func StringMatcher(sm *networking.StringMatch) *matcherv3.StringMatcher {
	switch t := sm.GetMatchType().(type) {
	case *networking.StringMatch_Exact:
		return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: t.Exact}}
	case *networking.StringMatch_Prefix:
		if t.Prefix != "" {
			return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: t.Prefix}}
		}
	case *networking.StringMatch_Regex:
		if t.Regex != "" {
			return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{
				SafeRegex: &matcherv3.RegexMatcher{Regex: t.Regex}}}
		}
	}
	return nil
}

// HeaderMatcher matches header name against sm, or its absence when invert is set.
func HeaderMatcher(name string, sm *networking.StringMatch, invert bool) *routev3.HeaderMatcher {
	hm := &routev3.HeaderMatcher{Name: name, InvertMatch: invert}
	if s := StringMatcher(sm); s != nil {
		hm.HeaderMatchSpecifier = &routev3.HeaderMatcher_StringMatch{StringMatch: s}
		// withoutHeaders must match requests that lack the header, which Envoy's inverted
		// string match does only when a missing header counts as empty (as istiod sets it).
		hm.TreatMissingHeaderAsEmpty = invert
	} else {
		// An empty match means "header present", as in Istio.
		hm.HeaderMatchSpecifier = &routev3.HeaderMatcher_PresentMatch{PresentMatch: true}
	}
	return hm
}
