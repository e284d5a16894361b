package gatewayapi

import (
	"encoding/json"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
)

// Object is a Gateway API object type that travels on the bus.
type Object interface {
	gwv1.GatewayClass | gwv1.Gateway | gwv1.ListenerSet | gwv1.HTTPRoute | gwv1.GRPCRoute |
		gwv1.TCPRoute | gwv1.TLSRoute | gwv1.ReferenceGrant | gwv1.BackendTLSPolicy
}

// Decode turns a bus resource of T's kind (its spec a google.protobuf.Struct, as config-ingest
// publishes it) into the typed object: name and namespace from the bus name, labels, annotations
// and creation time from the resource's metadata. The bus carries neither generation nor status.
// config-ingest validated the spec; Decode only refuses one that does not fit T (another
// producer's).
//
//	route, err := gatewayapi.Decode[gwv1.HTTPRoute](r)
func Decode[T Object, P interface {
	*T
	metav1.Object
	runtime.Object
}](r *bus.Resource) (P, error) {
	obj := P(new(T))
	k := KindOf(obj)
	spec, ok := r.Body.(*structpb.Struct)
	if !ok {
		return nil, fmt.Errorf("%s %s: the spec is a %T, not a google.protobuf.Struct", k.Kind, r.Name, r.Body)
	}
	js, err := protojson.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", k.Kind, r.Name, err)
	}
	// The spec is the object's only JSON part: decode it in place of the whole object.
	if err := json.Unmarshal([]byte(`{"spec":`+string(js)+`}`), obj); err != nil {
		return nil, fmt.Errorf("%s %s: spec: %w", k.Kind, r.Name, err)
	}
	obj.GetObjectKind().SetGroupVersionKind(gwv1.SchemeGroupVersion.WithKind(k.Kind))
	ns, name := schema.SplitName(r.Name)
	if k.ClusterScoped {
		ns, name = "", r.Name
	}
	obj.SetNamespace(ns)
	obj.SetName(name)
	obj.SetLabels(r.Labels)
	obj.SetAnnotations(r.Annotations)
	if !r.CreateTime.IsZero() {
		obj.SetCreationTimestamp(metav1.NewTime(r.CreateTime))
	}
	return obj, nil
}

// KindOf is the schema kind of a Gateway API object.
func KindOf(obj runtime.Object) schema.Kind {
	switch obj.(type) {
	case *gwv1.GatewayClass:
		return schema.GatewayClass
	case *gwv1.Gateway:
		return schema.KubernetesGateway
	case *gwv1.ListenerSet:
		return schema.ListenerSet
	case *gwv1.HTTPRoute:
		return schema.HTTPRoute
	case *gwv1.GRPCRoute:
		return schema.GRPCRoute
	case *gwv1.TCPRoute:
		return schema.TCPRoute
	case *gwv1.TLSRoute:
		return schema.TLSRoute
	case *gwv1.ReferenceGrant:
		return schema.ReferenceGrant
	case *gwv1.BackendTLSPolicy:
		return schema.BackendTLSPolicy
	}
	return schema.Kind{}
}

// DecodeAny is Decode for a resource of any Gateway API kind, named by kind.
func DecodeAny(kind schema.Kind, r *bus.Resource) (metav1.Object, error) {
	switch kind.TypeURL {
	case schema.GatewayClass.TypeURL:
		return Decode[gwv1.GatewayClass](r)
	case schema.KubernetesGateway.TypeURL:
		return Decode[gwv1.Gateway](r)
	case schema.ListenerSet.TypeURL:
		return Decode[gwv1.ListenerSet](r)
	case schema.HTTPRoute.TypeURL:
		return Decode[gwv1.HTTPRoute](r)
	case schema.GRPCRoute.TypeURL:
		return Decode[gwv1.GRPCRoute](r)
	case schema.TCPRoute.TypeURL:
		return Decode[gwv1.TCPRoute](r)
	case schema.TLSRoute.TypeURL:
		return Decode[gwv1.TLSRoute](r)
	case schema.ReferenceGrant.TypeURL:
		return Decode[gwv1.ReferenceGrant](r)
	case schema.BackendTLSPolicy.TypeURL:
		return Decode[gwv1.BackendTLSPolicy](r)
	}
	return nil, fmt.Errorf("%s is not a Gateway API kind", kind.Kind)
}

// Add appends a decoded object to the list of its kind in the input; false for any other type.
func (in *Input) Add(obj metav1.Object) bool {
	switch o := obj.(type) {
	case *gwv1.GatewayClass:
		in.GatewayClasses = append(in.GatewayClasses, o)
	case *gwv1.Gateway:
		in.Gateways = append(in.Gateways, o)
	case *gwv1.ListenerSet:
		in.ListenerSets = append(in.ListenerSets, o)
	case *gwv1.HTTPRoute:
		in.HTTPRoutes = append(in.HTTPRoutes, o)
	case *gwv1.GRPCRoute:
		in.GRPCRoutes = append(in.GRPCRoutes, o)
	case *gwv1.TCPRoute:
		in.TCPRoutes = append(in.TCPRoutes, o)
	case *gwv1.TLSRoute:
		in.TLSRoutes = append(in.TLSRoutes, o)
	case *gwv1.ReferenceGrant:
		in.ReferenceGrants = append(in.ReferenceGrants, o)
	case *gwv1.BackendTLSPolicy:
		in.BackendTLSPolicies = append(in.BackendTLSPolicies, o)
	default:
		return false
	}
	return true
}
