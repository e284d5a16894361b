package translate

import (
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
)

func TestGatewaySemantics(t *testing.T) {
	route := func(prefix, rewrite string) *routev3.Route {
		return &routev3.Route{Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: prefix}},
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{PrefixRewrite: rewrite}}}
	}
	r := route("/static/", "/")
	GatewaySemantics(r, Envoy)
	if got := r.GetMatch().GetPathSeparatedPrefix(); got != "/static" {
		t.Fatalf("PathPrefix /static/ matches as %v, want the path-separated prefix /static", r.GetMatch())
	}
	act := r.GetRoute()
	if act.GetClusterNotFoundResponseCode() != routev3.RouteAction_INTERNAL_SERVER_ERROR {
		t.Fatal("a missing backend does not answer 500")
	}
	if act.GetPrefixRewrite() != "" || act.GetRegexRewrite().GetPattern().GetRegex() != `^/static(/?)(.*)` ||
		act.GetRegexRewrite().GetSubstitution() != `/\2` {
		t.Fatalf("rewrite to / is %v, want the prefix removed", act)
	}
	all := route("/", "")
	GatewaySemantics(all, Envoy)
	if all.GetMatch().GetPrefix() != "/" {
		t.Fatalf("PathPrefix / is %v, want prefix /", all.GetMatch())
	}
	grpc := route("/svc", "")
	GatewaySemantics(grpc, Proxyless)
	if grpc.GetMatch().GetPrefix() != "/svc" || grpc.GetRoute().GetClusterNotFoundResponseCode() != routev3.RouteAction_INTERNAL_SERVER_ERROR {
		t.Fatalf("proxyless route %v: want its prefix kept (gRPC drops path-separated prefixes) and 500", grpc)
	}
}
