package translate

import (
	"slices"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	networking "istio.io/api/networking/v1alpha3"
)

func TestHTTPRoutesStopAfterCatchAll(t *testing.T) {
	prefix := func(p string) *networking.HTTPMatchRequest {
		return &networking.HTTPMatchRequest{Name: p, Uri: &networking.StringMatch{
			MatchType: &networking.StringMatch_Prefix{Prefix: p}}}
	}
	header := &networking.HTTPMatchRequest{Name: "h", Headers: map[string]*networking.StringMatch{
		"x": {MatchType: &networking.StringMatch_Exact{Exact: "1"}}}}
	route := func(name string, ms ...*networking.HTTPMatchRequest) *networking.HTTPRoute {
		return &networking.HTTPRoute{Name: name, Match: ms}
	}
	for _, tc := range []struct {
		name        string
		routes      []*networking.HTTPRoute
		skip        string // a route build skips, with its remaining matches
		want        []string
		wantSkipped int
	}{
		{name: "no catch-all", routes: []*networking.HTTPRoute{route("a", prefix("/a")), route("b", header)},
			want: []string{"a./a", "b.h"}},
		{name: "a route without match ends the list",
			routes: []*networking.HTTPRoute{route("a", prefix("/a")), route("all"), route("late", prefix("/late"))},
			want:   []string{"a./a", "all."}, wantSkipped: 1},
		{name: "even when it is skipped", skip: "all",
			routes: []*networking.HTTPRoute{route("all"), route("late", prefix("/late"))},
			want:   nil, wantSkipped: 1},
		{name: "a match taking every request ends its route's matches and the list",
			routes: []*networking.HTTPRoute{route("a", prefix("/a"), prefix("/"), prefix("/b")), route("late")},
			want:   []string{"a./a", "a./"}, wantSkipped: 1},
		{name: "a header condition is no catch-all",
			routes: []*networking.HTTPRoute{route("h", header), route("all")},
			want:   []string{"h.h", "all."}},
		{name: "a skipped route's catch-all match does not count", skip: "a",
			routes: []*networking.HTTPRoute{route("a", prefix("/")), route("b", prefix("/b"))},
			want:   []string{"b./b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, skipped := HTTPRoutes(tc.routes, func(_ int, hr *networking.HTTPRoute,
				m *networking.HTTPMatchRequest) (*routev3.Route, bool) {
				if hr.GetName() == tc.skip {
					return nil, true
				}
				rm, _ := RouteMatch(m, Envoy)
				return &routev3.Route{Name: hr.GetName() + "." + m.GetName(), Match: rm}, false
			})
			var got []string
			for _, r := range out {
				got = append(got, r.GetName())
			}
			if !slices.Equal(got, tc.want) || skipped != tc.wantSkipped {
				t.Errorf("HTTPRoutes = %v, %d skipped; want %v, %d", got, skipped, tc.want, tc.wantSkipped)
			}
		})
	}
}
