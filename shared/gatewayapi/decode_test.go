package gatewayapi_test

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"
	networking "istio.io/api/networking/v1alpha3"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/gatewayapi"
)

func TestDecode(t *testing.T) {
	spec, err := structpb.NewStruct(map[string]any{
		"parentRefs": []any{map[string]any{"name": "web", "sectionName": "http"}},
		"rules":      []any{map[string]any{"backendRefs": []any{map[string]any{"name": "reviews", "port": 9080, "weight": 3}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	r := &bus.Resource{Name: "apps/reviews", Body: spec, Labels: map[string]string{"a": "b"},
		Annotations: map[string]string{"c": "d"}, CreateTime: created}
	route, err := gatewayapi.Decode[gwv1.HTTPRoute](r)
	if err != nil {
		t.Fatal(err)
	}
	if route.Namespace != "apps" || route.Name != "reviews" || route.Labels["a"] != "b" || route.Annotations["c"] != "d" ||
		!route.CreationTimestamp.Time.Equal(created) || route.Kind != "HTTPRoute" || route.APIVersion != "gateway.networking.k8s.io/v1" {
		t.Errorf("metadata = %+v %+v", route.TypeMeta, route.ObjectMeta)
	}
	ref := route.Spec.Rules[0].BackendRefs[0]
	if route.Spec.ParentRefs[0].Name != "web" || *route.Spec.ParentRefs[0].SectionName != "http" ||
		ref.Name != "reviews" || *ref.Port != 9080 || *ref.Weight != 3 {
		t.Errorf("spec = %+v", route.Spec)
	}

	// Cluster-scoped: the bus name is the name.
	gc, err := gatewayapi.Decode[gwv1.GatewayClass](&bus.Resource{Name: "istio", Body: &structpb.Struct{}})
	if err != nil || gc.Name != "istio" || gc.Namespace != "" {
		t.Errorf("GatewayClass = %+v, %v", gc, err)
	}

	// A spec of the wrong shape or message is refused, naming the resource.
	bad, _ := structpb.NewStruct(map[string]any{"parentRefs": "web"})
	if _, err := gatewayapi.Decode[gwv1.HTTPRoute](&bus.Resource{Name: "apps/bad", Body: bad}); err == nil {
		t.Error("a spec of the wrong shape was decoded")
	}
	if _, err := gatewayapi.Decode[gwv1.Gateway](&bus.Resource{Name: "apps/istio", Body: &networking.Gateway{}}); err == nil {
		t.Error("an Istio Gateway was decoded as a Gateway API one")
	}
}
