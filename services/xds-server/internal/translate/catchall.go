package translate

import (
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	networking "istio.io/api/networking/v1alpha3"
)

// MatchesAll reports whether a route match takes every request (istiod's catch-all test).
func MatchesAll(m *routev3.RouteMatch) bool {
	all := false
	switch p := m.GetPathSpecifier().(type) {
	case *routev3.RouteMatch_Prefix:
		all = p.Prefix == "/"
	case *routev3.RouteMatch_PathSeparatedPrefix:
		all = p.PathSeparatedPrefix == "/"
	case *routev3.RouteMatch_SafeRegex:
		all = p.SafeRegex.GetRegex() == ".*"
	}
	return all && len(m.GetHeaders()) == 0 && len(m.GetQueryParameters()) == 0 && len(m.GetDynamicMetadata()) == 0
}

// MatchRoute starts the route of one match of an http route (nil for a route without match):
// its name and match as istiod writes them. It is nil, logged, when client cannot express the
// match: dropping the whole match is safer than dropping one condition of it, which would
// widen what the route catches.
func MatchRoute(hr *networking.HTTPRoute, m *networking.HTTPMatchRequest, client Client,
	log interface{ Debug(string, ...any) }) *routev3.Route {
	rm, reason := RouteMatch(m, client)
	if rm == nil {
		log.Debug("skipping unsupported match", "reason", reason)
		return nil
	}
	name := hr.GetName()
	if m.GetName() != "" {
		name += "." + m.GetName()
	}
	return &routev3.Route{Name: name, Match: rm}
}

// BuildRoute turns one match of a VirtualService http route (nil for a route without match)
// into a route: nil to skip the match, done to skip the route's remaining matches.
type BuildRoute func(i int, hr *networking.HTTPRoute, m *networking.HTTPMatchRequest) (r *routev3.Route, done bool)

// HTTPRoutes builds a VirtualService's http routes in order, each match with build. Clients
// match routes in order, so, as istiod does, it stops after a catch-all: a route without
// match (even one build skips), or a match built into a route that takes every request.
// skipped counts the http routes left out after it.
func HTTPRoutes(hrs []*networking.HTTPRoute, build BuildRoute) (out []*routev3.Route, skipped int) {
	for i, hr := range hrs {
		matches := hr.GetMatch()
		catchAll := len(matches) == 0
		if catchAll {
			matches = []*networking.HTTPMatchRequest{nil}
		}
		for _, m := range matches {
			r, done := build(i, hr, m)
			if r != nil {
				out = append(out, r)
				if MatchesAll(r.GetMatch()) {
					catchAll = true
					break
				}
			}
			if done {
				break
			}
		}
		if catchAll {
			return out, len(hrs) - i - 1
		}
	}
	return out, 0
}
