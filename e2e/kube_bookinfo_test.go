package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/shared/schema"
	"sailplane.dev/tools/testenv"
)

// The networking resources of Istio's bookinfo sample: its ingress gateway and the route to
// productpage, destination rules with every version's subset, and a route per service.
const bookinfoGatewayYAML = `apiVersion: networking.istio.io/v1
kind: Gateway
metadata:
  name: bookinfo-gateway
spec:
  selector:
    istio: ingressgateway
  servers:
  - port: {number: 8080, name: http, protocol: HTTP}
    hosts: ["*"]
`

const bookinfoDestinationRulesYAML = `apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata:
  name: productpage
spec:
  host: productpage
  subsets:
  - {name: v1, labels: {version: v1}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata:
  name: reviews
spec:
  host: reviews
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
  - {name: v3, labels: {version: v3}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata:
  name: ratings
spec:
  host: ratings
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
  - {name: v2-mysql, labels: {version: v2-mysql}}
  - {name: v2-mysql-vm, labels: {version: v2-mysql-vm}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata:
  name: details
spec:
  host: details
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
`

const bookinfoVirtualServicesYAML = `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: bookinfo
spec:
  hosts: ["*"]
  gateways: [bookinfo-gateway]
  http:
  - match:
    - uri: {exact: /productpage}
    - uri: {prefix: /static}
    - uri: {exact: /login}
    - uri: {exact: /logout}
    - uri: {prefix: /api/v1/products}
    route:
    - destination: {host: productpage, port: {number: 9080}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: productpage
spec:
  hosts: [productpage]
  http:
  - route:
    - destination: {host: productpage, subset: v1}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: reviews
spec:
  hosts: [reviews]
  http:
  - match:
    - headers: {end-user: {exact: jason}}
    route:
    - destination: {host: reviews, subset: v2}
  - route:
    - {destination: {host: reviews, subset: v1}, weight: 50}
    - {destination: {host: reviews, subset: v3}, weight: 50}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: ratings
spec:
  hosts: [ratings]
  http:
  - route:
    - destination: {host: ratings, subset: v1}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: details
spec:
  hosts: [details]
  http:
  - route:
    - destination: {host: details, subset: v1}
`

// Accepted by the CRD's schema, refused by Istio's validation: the weights add up to 80.
const invalidVirtualServiceYAML = `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: ratings-canary
spec:
  hosts: [ratings-canary]
  http:
  - route:
    - {destination: {host: ratings, subset: v1}, weight: 60}
    - {destination: {host: ratings, subset: v2}, weight: -20}
`

// TestKubeBookinfo applies bookinfo's networking resources to a real API server and expects
// Sailplane (hyper, and config-ingest alone) to publish every one on its bus, as an external MCP
// consumer sees it; then an invalid VirtualService gets a validation message in its status
// while the valid ones stay served.
func TestKubeBookinfo(t *testing.T) {
	for _, topo := range kubeTopologies {
		t.Run(topo.name, func(t *testing.T) { testKubeBookinfo(t, topo.start) })
	}
}

func testKubeBookinfo(t *testing.T, start func(*testing.T, *testenv.Kube, *framework.Kube) sailplaneOnKube) {
	k := testenv.KubeForTest(t)
	kube := framework.NewKube(t, k.RestConfig())
	// Part before Sailplane starts (read by its initial list), part after (seen by its watches).
	kube.Apply(t, bookinfoGatewayYAML+"---\n"+bookinfoDestinationRulesYAML)
	sp := start(t, k, kube)
	rec := framework.RecordSecureBus(t, sp.configBus, sp.busSec,
		schema.Gateway.TypeURL, schema.DestinationRule.TypeURL, schema.VirtualService.TypeURL)
	vss := kube.Apply(t, bookinfoVirtualServicesYAML)

	want := map[string][]string{
		schema.Gateway.TypeURL:         {"default/bookinfo-gateway"},
		schema.DestinationRule.TypeURL: {"default/productpage", "default/reviews", "default/ratings", "default/details"},
		schema.VirtualService.TypeURL:  busNames(vss),
	}
	allServed := func() error {
		for typ, names := range want {
			if err := rec.HasAll(typ, names...); err != nil {
				return err
			}
		}
		return nil
	}
	t.Run("every resource reaches the bus", func(t *testing.T) {
		// Generous for the same reason as startTwoOfThreeOnKube's first wait.
		framework.Eventually(t, 2*time.Minute, allServed)
		// The bodies are the specs as applied, not just the names.
		r, _ := rec.Get(schema.VirtualService.TypeURL, "default/reviews")
		if got := fmt.Sprint(r.Body); !containsAll(got, "jason", "v3") {
			t.Fatalf("default/reviews on the bus does not carry the applied spec: %s", got)
		}
	})

	t.Run("invalid VirtualService gets a status, valid ones stay served", func(t *testing.T) {
		kube.Apply(t, invalidVirtualServiceYAML)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var msgs []any
		framework.Eventually(t, time.Minute, func() error {
			vs, err := kube.Get(ctx, "VirtualService.networking.istio.io", "default", "ratings-canary")
			if err != nil {
				return err
			}
			msgs, _, _ = unstructured.NestedSlice(vs.Object, "status", "validationMessages")
			if len(msgs) == 0 {
				return fmt.Errorf("no status.validationMessages on default/ratings-canary yet (status: %v)", vs.Object["status"])
			}
			return nil
		})
		t.Logf("status.validationMessages of default/ratings-canary: %v", msgs)
		if err := allServed(); err != nil {
			t.Fatalf("after an invalid VirtualService: %v", err)
		}
		if _, ok := rec.Get(schema.VirtualService.TypeURL, "default/ratings-canary"); ok {
			t.Fatalf("the invalid VirtualService default/ratings-canary is served on the bus")
		}
		// Still live: a valid change after the invalid one is published.
		kube.Apply(t, `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: details}
spec:
  hosts: [details]
  http:
  - route:
    - destination: {host: details, subset: v2}
`)
		framework.Eventually(t, time.Minute, func() error {
			r, ok := rec.Get(schema.VirtualService.TypeURL, "default/details")
			if !ok || !containsAll(fmt.Sprint(r.Body), "v2") {
				return fmt.Errorf("default/details on the bus is not the v2 route yet: %v", r)
			}
			return nil
		})
	})
}

// busNames are objects' names on the bus, "namespace/name".
func busNames(objs []*unstructured.Unstructured) []string {
	var names []string
	for _, o := range objs {
		names = append(names, o.GetNamespace()+"/"+o.GetName())
	}
	slices.Sort(names)
	return names
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
