package gatewaystatus

import (
	"context"
	"fmt"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	gwinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions"

	"sailplane.dev/shared/schema"
)

// object is what every Gateway API type is.
type object interface {
	metav1.Object
	comparable
}

// statusClient is the part of a typed client the writer uses.
type statusClient[O any] interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (O, error)
	UpdateStatus(ctx context.Context, obj O, opts metav1.UpdateOptions) (O, error)
}

// kind is one Gateway API kind as the writer handles it, its type hidden behind closures.
type kind struct {
	schema.Kind
	informer cache.SharedIndexInformer
	// parented kinds (routes, policies) carry entries of several controllers: an object with
	// no status in Translate's output still has ours removed.
	parented bool
	// merge returns the object to write (a copy of obj with its status merged with want, nil
	// want meaning "none of ours"), or false when obj already carries it.
	merge func(obj any, want any, now metav1.Time) (updated any, changed bool, err error)
	// get reads the object from the API server, for a retry after a conflict.
	get func(ctx context.Context, ns, name string) (any, error)
	// update writes the object's status (PUT /status, failing on a stale resourceVersion).
	update func(ctx context.Context, obj any) error
	// list returns the informer's objects, for Translate's input.
	list func() []any
	// forget drops what merge remembers of a deleted object.
	forget func(ns, name string)
}

// kindOf builds a kind: status points into an object at the part merged, want turns
// Translate's value (nil: none) into what merge takes.
func kindOf[O object, S any, W any](k schema.Kind, inf cache.SharedIndexInformer, parented bool,
	client func(ns string) statusClient[O], deepCopy func(O) O, status func(O) *S,
	want func(any) (W, bool), merge func(cur S, want W, ns string, now metav1.Time) S,
) *kind {
	// sent remembers, by namespace/name, the last status written and the status the API server
	// stored for it, which may differ by defaults merge does not know of: then the object
	// already carries what would be written again.
	type written struct{ sent, stored S }
	var (
		mu   sync.Mutex
		sent = map[string]written{}
	)
	return &kind{
		Kind: k, informer: inf, parented: parented,
		merge: func(obj any, w any, now metav1.Time) (any, bool, error) {
			o, ok := obj.(O)
			if !ok {
				return nil, false, fmt.Errorf("%s: unexpected object %T", k.Kind, obj)
			}
			var wv W
			if w != nil {
				if wv, ok = want(w); !ok {
					return nil, false, fmt.Errorf("%s %s/%s: Translate's status is a %T", k.Kind, o.GetNamespace(), o.GetName(), w)
				}
			}
			cur := *status(o)
			merged := merge(cur, wv, o.GetNamespace(), now)
			if Equal(cur, merged) {
				return nil, false, nil
			}
			mu.Lock()
			last, ok := sent[o.GetNamespace()+"/"+o.GetName()]
			mu.Unlock()
			if ok && Equal(last.sent, merged) && Equal(last.stored, cur) {
				return nil, false, nil
			}
			cp := deepCopy(o)
			*status(cp) = merged
			return cp, true, nil
		},
		get: func(ctx context.Context, ns, name string) (any, error) {
			return client(ns).Get(ctx, name, metav1.GetOptions{})
		},
		update: func(ctx context.Context, obj any) error {
			o := obj.(O)
			stored, err := client(o.GetNamespace()).UpdateStatus(ctx, o, metav1.UpdateOptions{})
			if err != nil {
				return err
			}
			mu.Lock()
			sent[o.GetNamespace()+"/"+o.GetName()] = written{sent: *status(o), stored: *status(stored)}
			mu.Unlock()
			return nil
		},
		list: func() []any { return inf.GetStore().List() },
		forget: func(ns, name string) {
			mu.Lock()
			defer mu.Unlock()
			delete(sent, ns+"/"+name)
		},
	}
}

// listOf converts an informer's objects to Translate's slices.
func listOf[O any](objs []any) []O {
	out := make([]O, 0, len(objs))
	for _, o := range objs {
		if v, ok := o.(O); ok {
			out = append(out, v)
		}
	}
	return out
}

func whole[S any](cur, want S, _ string, now metav1.Time, merge func(cur, want S, now metav1.Time) S) S {
	return merge(cur, want, now)
}

// newKinds builds the writer's view of the Gateway API kinds the API server serves (by plural).
func newKinds(cs gwclient.Interface, f gwinformers.SharedInformerFactory, served func(plural string) bool) map[string]*kind {
	v1 := f.Gateway().V1()
	c := cs.GatewayV1()
	// Each kind's informer is made (and so started by the factory) only if the kind is served.
	type lazy func() *kind
	ks := []lazy{
		func() *kind {
			return kindOf(schema.GatewayClass, v1.GatewayClasses().Informer(), false,
				func(string) statusClient[*gwv1.GatewayClass] { return c.GatewayClasses() },
				(*gwv1.GatewayClass).DeepCopy, func(o *gwv1.GatewayClass) *gwv1.GatewayClassStatus { return &o.Status },
				wantValue[gwv1.GatewayClassStatus],
				func(cur, w gwv1.GatewayClassStatus, ns string, now metav1.Time) gwv1.GatewayClassStatus {
					return whole(cur, w, ns, now, MergeGatewayClass)
				})
		},
		func() *kind {
			return kindOf(schema.KubernetesGateway, v1.Gateways().Informer(), false,
				func(ns string) statusClient[*gwv1.Gateway] { return c.Gateways(ns) },
				(*gwv1.Gateway).DeepCopy, func(o *gwv1.Gateway) *gwv1.GatewayStatus { return &o.Status },
				wantValue[gwv1.GatewayStatus],
				func(cur, w gwv1.GatewayStatus, ns string, now metav1.Time) gwv1.GatewayStatus {
					return whole(cur, w, ns, now, MergeGateway)
				})
		},
		func() *kind {
			return kindOf(schema.ListenerSet, v1.ListenerSets().Informer(), false,
				func(ns string) statusClient[*gwv1.ListenerSet] { return c.ListenerSets(ns) },
				(*gwv1.ListenerSet).DeepCopy, func(o *gwv1.ListenerSet) *gwv1.ListenerSetStatus { return &o.Status },
				wantValue[gwv1.ListenerSetStatus],
				func(cur, w gwv1.ListenerSetStatus, ns string, now metav1.Time) gwv1.ListenerSetStatus {
					return whole(cur, w, ns, now, MergeListenerSet)
				})
		},
		func() *kind {
			return kindOf(schema.HTTPRoute, v1.HTTPRoutes().Informer(), true,
				func(ns string) statusClient[*gwv1.HTTPRoute] { return c.HTTPRoutes(ns) },
				(*gwv1.HTTPRoute).DeepCopy, func(o *gwv1.HTTPRoute) *gwv1.RouteStatus { return &o.Status.RouteStatus },
				func(v any) ([]gwv1.RouteParentStatus, bool) {
					s, ok := v.(*gwv1.HTTPRouteStatus)
					return routeParents(s, ok, func() []gwv1.RouteParentStatus { return s.Parents })
				}, MergeRoute)
		},
		func() *kind {
			return kindOf(schema.GRPCRoute, v1.GRPCRoutes().Informer(), true,
				func(ns string) statusClient[*gwv1.GRPCRoute] { return c.GRPCRoutes(ns) },
				(*gwv1.GRPCRoute).DeepCopy, func(o *gwv1.GRPCRoute) *gwv1.RouteStatus { return &o.Status.RouteStatus },
				func(v any) ([]gwv1.RouteParentStatus, bool) {
					s, ok := v.(*gwv1.GRPCRouteStatus)
					return routeParents(s, ok, func() []gwv1.RouteParentStatus { return s.Parents })
				}, MergeRoute)
		},
		func() *kind {
			return kindOf(schema.TCPRoute, v1.TCPRoutes().Informer(), true,
				func(ns string) statusClient[*gwv1.TCPRoute] { return c.TCPRoutes(ns) },
				(*gwv1.TCPRoute).DeepCopy, func(o *gwv1.TCPRoute) *gwv1.RouteStatus { return &o.Status.RouteStatus },
				func(v any) ([]gwv1.RouteParentStatus, bool) {
					s, ok := v.(*gwv1.TCPRouteStatus)
					return routeParents(s, ok, func() []gwv1.RouteParentStatus { return s.Parents })
				}, MergeRoute)
		},
		func() *kind {
			return kindOf(schema.TLSRoute, v1.TLSRoutes().Informer(), true,
				func(ns string) statusClient[*gwv1.TLSRoute] { return c.TLSRoutes(ns) },
				(*gwv1.TLSRoute).DeepCopy, func(o *gwv1.TLSRoute) *gwv1.RouteStatus { return &o.Status.RouteStatus },
				func(v any) ([]gwv1.RouteParentStatus, bool) {
					s, ok := v.(*gwv1.TLSRouteStatus)
					return routeParents(s, ok, func() []gwv1.RouteParentStatus { return s.Parents })
				}, MergeRoute)
		},
		func() *kind {
			return kindOf(schema.BackendTLSPolicy, v1.BackendTLSPolicies().Informer(), true,
				func(ns string) statusClient[*gwv1.BackendTLSPolicy] { return c.BackendTLSPolicies(ns) },
				(*gwv1.BackendTLSPolicy).DeepCopy, func(o *gwv1.BackendTLSPolicy) *gwv1.PolicyStatus { return &o.Status },
				func(v any) ([]gwv1.PolicyAncestorStatus, bool) {
					s, ok := v.(*gwv1.PolicyStatus)
					if !ok || s == nil {
						return nil, ok
					}
					return s.Ancestors, true
				}, MergePolicy)
		},
	}
	plurals := []string{"gatewayclasses", "gateways", "listenersets", "httproutes", "grpcroutes", "tcproutes", "tlsroutes", "backendtlspolicies"}
	out := map[string]*kind{}
	for i, k := range ks {
		if served(plurals[i]) {
			kd := k()
			out[kd.Kind.Kind] = kd
		}
	}
	return out
}

func wantValue[S any](v any) (S, bool) {
	s, ok := v.(*S)
	if !ok || s == nil {
		var zero S
		return zero, ok
	}
	return *s, true
}

func routeParents[T any](s *T, ok bool, parents func() []gwv1.RouteParentStatus) ([]gwv1.RouteParentStatus, bool) {
	if !ok || s == nil {
		return nil, ok
	}
	return parents(), true
}
