package translate

import (
	"fmt"
	"regexp"
	"strings"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
)

// GatewaySemantics adapts an Envoy route built from a Gateway API route, as istiod does for
// its "route-semantics: gateway": a path prefix matches whole segments (PathPrefix /foo is not
// /foobar), a backend that does not exist answers 500, and rewriting a prefix to "/" removes it.
// Proxyless gRPC clients take only the 500 (gRPC drops a route whose path is segment-matched).
func GatewaySemantics(r *routev3.Route, client Client) {
	if client == Envoy {
		if p, ok := r.GetMatch().GetPathSpecifier().(*routev3.RouteMatch_Prefix); ok && p.Prefix != "/" {
			r.Match.PathSpecifier = &routev3.RouteMatch_PathSeparatedPrefix{PathSeparatedPrefix: strings.TrimSuffix(p.Prefix, "/")}
		}
	}
	act := r.GetRoute()
	if act == nil {
		return
	}
	act.ClusterNotFoundResponseCode = routev3.RouteAction_INTERNAL_SERVER_ERROR
	if client == Envoy && act.GetPrefixRewrite() == "/" {
		if sp := r.GetMatch().GetPathSeparatedPrefix(); sp != "" {
			// Keep a "/" when the whole path was the prefix.
			act.PrefixRewrite = ""
			act.RegexRewrite = &matcherv3.RegexMatchAndSubstitute{
				Pattern:      &matcherv3.RegexMatcher{Regex: fmt.Sprintf(`^%s(/?)(.*)`, regexp.QuoteMeta(sp))},
				Substitution: `/\2`,
			}
		}
	}
}
