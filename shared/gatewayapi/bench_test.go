package gatewayapi

import (
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// BenchmarkTranslate translates 1,000 HTTPRoutes bound to 50 Gateways (two listeners each), with
// header and path matches and a weighted split per route.
func BenchmarkTranslate(b *testing.B) {
	reg := testServices{byHost: map[string]Service{}}
	in := Input{Services: reg, DomainSuffix: "cluster.local"}
	all := gwv1.NamespacesFromAll
	for i := range 50 {
		in.Gateways = append(in.Gateways, &gwv1.Gateway{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("gw-%d", i), Namespace: "istio-system"},
			Spec: gwv1.GatewaySpec{GatewayClassName: "istio", Listeners: []gwv1.Listener{
				{Name: "http", Port: 80, Protocol: gwv1.HTTPProtocolType, AllowedRoutes: &gwv1.AllowedRoutes{Namespaces: &gwv1.RouteNamespaces{From: &all}}},
				{Name: "other", Port: 8080, Protocol: gwv1.HTTPProtocolType, Hostname: ptr(gwv1.Hostname("*.example.com")),
					AllowedRoutes: &gwv1.AllowedRoutes{Namespaces: &gwv1.RouteNamespaces{From: &all}}},
			}}})
		h := fmt.Sprintf("svc-%d.apps.svc.cluster.local", i)
		reg.byHost[h] = Service{Hostname: h, Ports: []ServicePort{{Number: 80}}, Ready: true}
	}
	for i := range 1000 {
		ns := gwv1.Namespace("istio-system")
		in.HTTPRoutes = append(in.HTTPRoutes, &gwv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("r-%d", i), Namespace: "apps"},
			Spec: gwv1.HTTPRouteSpec{
				CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{{Name: gwv1.ObjectName(fmt.Sprintf("gw-%d", i%50)), Namespace: &ns}}},
				Hostnames:       []gwv1.Hostname{gwv1.Hostname(fmt.Sprintf("h%d.example.com", i))},
				Rules: []gwv1.HTTPRouteRule{{
					Matches: []gwv1.HTTPRouteMatch{{Path: &gwv1.HTTPPathMatch{Value: ptr("/api")},
						Headers: []gwv1.HTTPHeaderMatch{{Name: "x-user", Value: "a"}}}, {Path: &gwv1.HTTPPathMatch{Value: ptr("/")}}},
					BackendRefs: []gwv1.HTTPBackendRef{
						{BackendRef: gwv1.BackendRef{BackendObjectReference: gwv1.BackendObjectReference{Name: gwv1.ObjectName(fmt.Sprintf("svc-%d", i%50)), Port: ptr(gwv1.PortNumber(80))}, Weight: ptr(int32(90))}},
						{BackendRef: gwv1.BackendRef{BackendObjectReference: gwv1.BackendObjectReference{Name: gwv1.ObjectName(fmt.Sprintf("svc-%d", (i+1)%50)), Port: ptr(gwv1.PortNumber(80))}, Weight: ptr(int32(10))}},
					},
				}},
			}})
	}
	out := Translate(in)
	if len(out.VirtualServices) != 2000 {
		b.Fatalf("%d virtual services, want 2000", len(out.VirtualServices))
	}
	for b.Loop() {
		Translate(in)
	}
}
