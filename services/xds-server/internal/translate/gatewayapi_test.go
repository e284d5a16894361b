package translate

import (
	"fmt"
	"slices"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	networking "istio.io/api/networking/v1alpha3"
)

func TestSegmentPrefix(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   *routev3.RouteMatch
		want *routev3.RouteMatch
	}{
		{name: "a prefix matches whole segments",
			in:   &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/v1"}},
			want: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_PathSeparatedPrefix{PathSeparatedPrefix: "/v1"}}},
		{name: "without its trailing slash",
			in:   &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/v1/"}},
			want: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_PathSeparatedPrefix{PathSeparatedPrefix: "/v1"}}},
		{name: "the root stays a prefix",
			in:   &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
			want: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}}},
		{name: "an exact path is left alone",
			in:   &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Path{Path: "/login"}},
			want: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Path{Path: "/login"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			SegmentPrefix(tc.in)
			if got, want := tc.in.String(), tc.want.String(); got != want {
				t.Errorf("got %s, want %s", got, want)
			}
		})
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
