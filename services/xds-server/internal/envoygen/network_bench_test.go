package envoygen

import (
	"fmt"
	"testing"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
)

// BenchmarkEndpointsMultiNetwork measures a sidecar's EDS over 200 services of 20 endpoints,
// half of them in another network, with and without that network's gateway (split horizon).
func BenchmarkEndpointsMultiNetwork(b *testing.B) {
	for _, gateway := range []bool{false, true} {
		b.Run(fmt.Sprintf("gateway=%v", gateway), func(b *testing.B) {
			store := model.NewStore()
			h := store.Handler(nil)
			var svcs, eps []*bus.Resource
			for i := range 200 {
				host := fmt.Sprintf("s%d.ns.svc.cluster.local", i)
				svc := &discoveryv1.Service{Hostname: host, Namespace: "ns", Addresses: []string{fmt.Sprintf("10.96.%d.%d", i/250, i%250)},
					Ports: []*discoveryv1.Port{{Name: "http", Number: 8080, Protocol: "HTTP"}}}
				if gateway && i == 0 {
					svc.NetworkGateways = []*discoveryv1.NetworkGateway{{Network: "net2", ClusterId: "c2", Address: "198.18.2.1", Port: 15443}}
				}
				svcs = append(svcs, &bus.Resource{Name: "ns/" + host, Body: svc})
				e := &discoveryv1.Endpoints{Hostname: host, Namespace: "ns"}
				for j := range 20 {
					nw := "net1"
					if j%2 == 1 {
						nw = "net2"
					}
					e.Endpoints = append(e.Endpoints, &discoveryv1.Endpoint{Address: fmt.Sprintf("10.%d.%d.%d", 1+j%2, i, j), Network: nw,
						Labels: map[string]string{model.TLSModeLabel: "istio"}})
				}
				eps = append(eps, &bus.Resource{Name: "ns/" + host, Body: e})
			}
			for _, c := range []bus.Change{{TypeURL: schema.Service.TypeURL, Updated: svcs}, {TypeURL: schema.Endpoints.TypeURL, Updated: eps}} {
				if err := h.Apply(c); err != nil {
					b.Fatal(err)
				}
			}
			snap := store.Snapshot()
			p := &model.Proxy{ID: "sidecar~10.1.0.1~c.ns~ns.svc.cluster.local", Type: model.SidecarProxy, Namespace: "ns", Network: "net1", IPs: []string{"10.1.0.1"}}
			g := New(nil)
			b.ResetTimer()
			for b.Loop() {
				if _, err := g.Generate(snap, p, resourcev3.EndpointType, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
