package configingest_test

import (
	"strings"
	"testing"

	networking "istio.io/api/networking/v1alpha3"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"sailplane.dev/shared/gatewayapi"
	"sailplane.dev/shared/schema"
)

const gatewayClassDoc = `apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: istio}
spec: {controllerName: istio.io/gateway-controller}
`

func k8sGatewayDoc(port string) string {
	return `apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: web, namespace: apps, labels: {team: a}}
spec:
  gatewayClassName: istio
  listeners:
  - {name: http, port: ` + port + `, protocol: HTTP}
`
}

const httpRouteDoc = `apiVersion: gateway.networking.k8s.io/v1beta1
kind: HTTPRoute
metadata: {name: reviews, namespace: apps}
spec:
  parentRefs: [{name: web}]
  hostnames: [reviews.example.com]
  rules:
  - matches: [{path: {type: PathPrefix, value: /v1}}]
    backendRefs: [{name: reviews, port: 9080}]
`

// Istio's Gateway of the same namespace/name as the Gateway API's one.
const istioGatewayDoc = `apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: web, namespace: apps}
spec:
  selector: {istio: ingressgateway}
  servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ["*"]}]
`

// The Gateway API kinds in a config folder reach the bus as v1, whatever version they are
// written in, and decode into the typed objects.
func TestGatewayAPIFiles(t *testing.T) {
	e := start(t, func(e *env) {
		e.write("gw.yaml", gatewayClassDoc+"---\n"+k8sGatewayDoc("80")+"---\n"+httpRouteDoc+"---\n"+istioGatewayDoc)
	})
	if p := e.svc.Problems(); len(p) != 0 {
		t.Fatalf("problems: %v", p)
	}
	if r := e.rec.get(schema.GatewayClass, "istio"); r == nil {
		t.Fatal("GatewayClass not published")
	}
	gw, err := gatewayapi.Decode[gwv1.Gateway](e.rec.get(schema.KubernetesGateway, "apps/web"))
	if err != nil {
		t.Fatal(err)
	}
	if gw.Namespace != "apps" || gw.Name != "web" || gw.Labels["team"] != "a" || gw.Spec.GatewayClassName != "istio" ||
		len(gw.Spec.Listeners) != 1 || gw.Spec.Listeners[0].Port != 80 {
		t.Errorf("Gateway = %+v", gw)
	}
	route, err := gatewayapi.Decode[gwv1.HTTPRoute](e.rec.get(schema.HTTPRoute, "apps/reviews"))
	if err != nil {
		t.Fatal(err)
	}
	if got := *route.Spec.Rules[0].Matches[0].Path.Value; got != "/v1" || route.Spec.Rules[0].BackendRefs[0].Name != "reviews" {
		t.Errorf("HTTPRoute = %+v", route.Spec)
	}
	if e.rec.get(schema.Gateway, "apps/web") == nil {
		t.Fatal("Istio's Gateway of the same name not published")
	}

	// A Gateway API Gateway that can no longer be read (a key set twice) keeps its last version,
	// told apart from Istio's Gateway of the same name, which changes.
	broken := k8sGatewayDoc("8080") + "spec: {}\n"
	e.write("gw.yaml", gatewayClassDoc+"---\n"+broken+"---\n"+httpRouteDoc+"---\n"+strings.Replace(istioGatewayDoc, `"*"`, `"*.example.com"`, 1))
	eventually(t, "duplicate key reported", func() bool { return e.problem("gw.yaml", "document 2", `key "spec" already set`) != nil })
	eventually(t, "Istio Gateway updated", func() bool {
		r := e.rec.get(schema.Gateway, "apps/web")
		return r != nil && r.Body.(*networking.Gateway).Servers[0].Hosts[0] == "*.example.com"
	})
	if r := e.rec.get(schema.KubernetesGateway, "apps/web"); r == nil {
		t.Fatal("the Gateway API Gateway lost its last valid version")
	}
}

// A document the API server would refuse for one of its CRD's CEL rules is refused in files
// mode too, naming file, document and field, and the route's last valid version stays served,
// with the CRD's defaults set as the API server stores them.
func TestGatewayAPIFilesRefusedByCEL(t *testing.T) {
	e := start(t, func(e *env) {
		e.write("gw.yaml", k8sGatewayDoc("80")+"---\n"+httpRouteDoc)
	})
	route := func() *gwv1.HTTPRoute {
		r, err := gatewayapi.Decode[gwv1.HTTPRoute](e.rec.get(schema.HTTPRoute, "apps/reviews"))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	ref := route().Spec.Rules[0].BackendRefs[0]
	if *ref.Port != 9080 || ref.Weight == nil || *ref.Weight != 1 || *ref.Kind != "Service" {
		t.Fatalf("backendRef = %+v, want port 9080 and the defaults weight 1, kind Service", ref)
	}
	// A backendRef to a Service without a port: the CRD's rule "Must have port for Service
	// reference" refuses it.
	noPort := strings.Replace(httpRouteDoc, "{name: reviews, port: 9080}", "{name: reviews-v2}", 1)
	e.write("gw.yaml", k8sGatewayDoc("8080")+"---\n"+noPort)
	eventually(t, "CEL refusal reported", func() bool {
		return e.problem("gw.yaml", "document 2", "HTTPRoute apps/reviews", "spec.rules[0].backendRefs[0]", "Must have port for Service reference") != nil
	})
	eventually(t, "the good document updated", func() bool {
		gw, err := gatewayapi.Decode[gwv1.Gateway](e.rec.get(schema.KubernetesGateway, "apps/web"))
		return err == nil && gw.Spec.Listeners[0].Port == 8080
	})
	if got := route().Spec.Rules[0].BackendRefs[0].Name; got != "reviews" {
		t.Fatalf("the refused route replaced its last valid version: backend %s", got)
	}
	// Fixed: served, the problem gone.
	e.write("gw.yaml", k8sGatewayDoc("8080")+"---\n"+strings.Replace(noPort, "{name: reviews-v2}", "{name: reviews-v2, port: 9080}", 1))
	eventually(t, "fixed", func() bool {
		r := e.rec.get(schema.HTTPRoute, "apps/reviews")
		rt, err := gatewayapi.Decode[gwv1.HTTPRoute](r)
		return err == nil && rt.Spec.Rules[0].BackendRefs[0].Name == "reviews-v2" && len(e.svc.Problems()) == 0
	})
}
