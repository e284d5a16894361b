package kubesource

import (
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	analysis "istio.io/api/analysis/v1alpha1"
	istiometa "istio.io/api/meta/v1alpha1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sschema "k8s.io/apimachinery/pkg/runtime/schema"

	"sailplane.dev/shared/config"
	"sailplane.dev/shared/schema"
)

// istioStatus is what config-ingest reads of a status: IstioStatus, or ServiceEntryStatus
// (which adds the addresses istiod allocates).
type istioStatus interface {
	GetConditions() []*istiometa.IstioCondition
	GetValidationMessages() []*analysis.AnalysisMessageBase
}

// gvr is the Kubernetes resource serving kind k. Every kind in schema.ConfigKinds is served as v1.
func gvr(k schema.Kind) k8sschema.GroupVersionResource {
	return k8sschema.GroupVersionResource{Group: k.Group, Version: k.Version, Resource: k.Plural}
}

// isGatewayAPI reports whether k is a Gateway API kind: read with a dynamic informer, only when
// its CRD is installed, and its status left to the Gateway API's status writer.
func isGatewayAPI(k schema.Kind) bool { return k.Group == schema.GatewayAPIGroup }

// informerName names kind k's informer in logs, problems and pilot_k8s_cfg_events: its Kind,
// but "KubernetesGateway" for the Gateway API's Gateway (Istio's name for it), which Istio's
// Gateway is not.
func informerName(k schema.Kind) string {
	if k.TypeURL == schema.KubernetesGateway.TypeURL {
		return "KubernetesGateway"
	}
	return k.Kind
}

// parts splits an object from the informers into what config-ingest uses: a typed Istio
// object, or an unstructured Gateway API one (whose status, not Istio's, is nil here). The
// returned spec and status of an Istio object point into obj, which belongs to the informer
// cache: never modify them.
func parts(obj any) (meta metav1.Object, spec proto.Message, status istioStatus, ok bool) {
	switch o := obj.(type) {
	case *unstructured.Unstructured:
		m, _ := o.Object["spec"].(map[string]any)
		s, err := structpb.NewStruct(m)
		if err != nil {
			return nil, nil, nil, false
		}
		return o, s, nil, true
	case *networkingv1.VirtualService:
		return o, &o.Spec, &o.Status, true
	case *networkingv1.DestinationRule:
		return o, &o.Spec, &o.Status, true
	case *networkingv1.Gateway:
		return o, &o.Spec, &o.Status, true
	case *networkingv1.ServiceEntry:
		return o, &o.Spec, &o.Status, true
	case *networkingv1.WorkloadEntry:
		return o, &o.Spec, &o.Status, true
	case *networkingv1.WorkloadGroup:
		return o, &o.Spec, &o.Status, true
	case *networkingv1.Sidecar:
		return o, &o.Spec, &o.Status, true
	case *securityv1.AuthorizationPolicy:
		return o, &o.Spec, &o.Status, true
	case *securityv1.PeerAuthentication:
		return o, &o.Spec, &o.Status, true
	case *securityv1.RequestAuthentication:
		return o, &o.Spec, &o.Status, true
	}
	return nil, nil, nil, false
}

// SourcePrefix starts the Source.File of every Config read from Kubernetes, so that an error
// reads "k8s: VirtualService ns/name: spec.http[0]...: ...".
const SourcePrefix = "k8s"

// toConfig converts an informer object of kind k. The spec is cloned: bus resources are
// immutable and the informer's copy is shared.
func toConfig(k schema.Kind, obj any) (config.Config, bool) {
	meta, spec, _, ok := parts(obj)
	if !ok {
		return config.Config{}, false
	}
	return config.Config{
		Kind:        k,
		Namespace:   meta.GetNamespace(),
		Name:        meta.GetName(),
		Labels:      meta.GetLabels(),
		Annotations: withoutLastApplied(meta.GetAnnotations()),
		CreateTime:  meta.GetCreationTimestamp().Time,
		Spec:        proto.Clone(spec),
		Source:      config.Source{File: SourcePrefix},
	}, true
}

// lastApplied is kubectl's copy of the whole object: publishing it would duplicate the spec
// on the bus and make every status-only change look like a content change.
const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

func withoutLastApplied(a map[string]string) map[string]string {
	if _, ok := a[lastApplied]; !ok {
		return a
	}
	out := make(map[string]string, len(a)-1)
	for k, v := range a {
		if k != lastApplied {
			out[k] = v
		}
	}
	return out
}
