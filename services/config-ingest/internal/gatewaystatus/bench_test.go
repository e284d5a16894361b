package gatewaystatus

import (
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"sailplane.dev/shared/gatewayapi"
	"sailplane.dev/shared/testwait"
)

// BenchmarkWriter1000Routes: 1,000 HTTPRoutes on 50 Gateways, statuses from the real
// gatewayapi.Translate, the writer at its defaults (50 writes/s, burst 100). It reports the
// initial writes per second (every object's first status) and the time from an HTTPRoute
// edit to its status write (p50, p99 over the edits).
//
//	go test -run '^$' -bench BenchmarkWriter1000Routes -benchtime 1x ./internal/gatewaystatus/
func BenchmarkWriter1000Routes(b *testing.B) {
	const gateways, routes, edits = 50, 1000, 40
	e := newEnv(b)
	for i := range gateways {
		e.gateway(fmt.Sprintf("gw-%d", i))
	}
	for i := range routes {
		e.route(fmt.Sprintf("r-%d", i), nil, routeSpec(fmt.Sprintf("gw-%d", i%gateways), "backend", "/"))
	}
	b.ResetTimer()
	start := time.Now()
	w := e.start(Config{Translate: gatewayapi.Translate}, true, nil)
	all := func() bool {
		list, err := e.gw.GatewayV1().HTTPRoutes(e.ns).List(b.Context(), metav1.ListOptions{})
		if err != nil {
			return false
		}
		n := 0
		for i := range list.Items {
			if _, ok := ourParent(&list.Items[i]); ok {
				n++
			}
		}
		return n == routes
	}
	testwait.Until(b, 5*time.Minute, "every route's status", all)
	initial := time.Since(start)
	b.ReportMetric(float64(w.allPuts())/initial.Seconds(), "writes/s")
	b.ReportMetric(initial.Seconds(), "s-initial")

	var lat []time.Duration
	for i := range edits {
		name := fmt.Sprintf("r-%d", i*routes/edits)
		edited := time.Now()
		r := e.editRoute(name, func(r *gwv1.HTTPRoute) { *r.Spec.Rules[0].Matches[0].Path.Value = fmt.Sprintf("/e%d", i) })
		testwait.Until(b, time.Minute, name+" status of its new generation", func() bool {
			got, err := e.gw.GatewayV1().HTTPRoutes(e.ns).Get(b.Context(), name, metav1.GetOptions{})
			if err != nil {
				return false
			}
			p, ok := ourParent(got)
			return ok && len(p.Conditions) > 0 && p.Conditions[0].ObservedGeneration == r.Generation
		})
		lat = append(lat, time.Since(edited))
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Milliseconds()), "ms-p50-edit-to-status")
	b.ReportMetric(float64(lat[len(lat)*99/100].Milliseconds()), "ms-p99-edit-to-status")
}
