package translate

import (
	"fmt"
	"slices"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	networking "istio.io/api/networking/v1alpha3"
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

func TestGatewayAPIDestinations(t *testing.T) {
	dest := func(host string, w int32) *networking.HTTPRouteDestination {
		d := &networking.HTTPRouteDestination{Destination: &networking.Destination{}, Weight: w}
		if host != "" {
			d.Destination = &networking.Destination{Host: host, Port: &networking.PortSelector{Number: 8080}}
		}
		return d
	}
	for _, tc := range []struct {
		name      string
		in        []*networking.HTTPRouteDestination
		want      []string // cluster:weight
		wantIstio []string // WeightedDestinations, for Istio's own VirtualServices
	}{
		{name: "a refused backend alone",
			in:   []*networking.HTTPRouteDestination{dest("", 0)},
			want: []string{"UnknownService:100"}, wantIstio: nil},
		{name: "keeps its share of a split",
			in:        []*networking.HTTPRouteDestination{dest("a.ns.svc.cluster.local", 80), dest("", 20)},
			want:      []string{"outbound|8080||a.ns.svc.cluster.local:80", "UnknownService:20"},
			wantIstio: []string{"outbound|8080||a.ns.svc.cluster.local:80"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			show := func(ds []WeightedDest) []string {
				var out []string
				for _, d := range ds {
					out = append(out, fmt.Sprintf("%s:%d", d.Cluster, d.Weight))
				}
				return out
			}
			if got := show(GatewayAPIDestinations(nil, tc.in, "ns", "", 0)); !slices.Equal(got, tc.want) {
				t.Errorf("GatewayAPIDestinations: got %v, want %v", got, tc.want)
			}
			if got := show(WeightedDestinations(nil, tc.in, "ns", "", 0)); !slices.Equal(got, tc.wantIstio) {
				t.Errorf("WeightedDestinations: got %v, want %v", got, tc.wantIstio)
			}
		})
	}
}
