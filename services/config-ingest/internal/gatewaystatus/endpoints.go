package gatewaystatus

import (
	"sync"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// endpoints knows which Services have endpoints, from their EndpointSlices: as in istiod, a
// Gateway is Programmed only once the Service it runs behind has instances. istiod counts every
// endpoint with an address, ready or not (its registry keeps unready ones, marked unhealthy), so
// this does too. Only a Service's flipping between none and some recomputes the status: endpoint
// churn alone does not.
type endpoints struct {
	inf      cache.SharedIndexInformer
	onChange func()

	mu  sync.Mutex
	has map[string]bool // namespace/name of the Services with endpoints
}

const byService = "service"

func newEndpoints(inf cache.SharedIndexInformer, onChange func()) (*endpoints, error) {
	e := &endpoints{inf: inf, onChange: onChange, has: map[string]bool{}}
	// Only whether a slice has an address matters: the cache keeps no more of the cluster's
	// EndpointSlices than that.
	if err := inf.SetTransform(trimSlice); err != nil {
		return nil, err
	}
	if err := inf.AddIndexers(cache.Indexers{byService: func(obj any) ([]string, error) {
		if k := serviceOf(obj); k != "" {
			return []string{k}, nil
		}
		return nil, nil
	}}); err != nil {
		return nil, err
	}
	update := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if k := serviceOf(obj); k != "" {
			e.refresh(k)
		}
	}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    update,
		DeleteFunc: update,
		UpdateFunc: func(_, n any) { update(n) },
	})
	return e, err
}

// trimSlice keeps of an EndpointSlice its name, namespace, Service label and one address, if
// it has any.
func trimSlice(obj any) (any, error) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return obj, nil
	}
	out := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace,
		ResourceVersion: s.ResourceVersion}}
	if svc := s.Labels[discoveryv1.LabelServiceName]; svc != "" {
		out.Labels = map[string]string{discoveryv1.LabelServiceName: svc}
	}
	for _, ep := range s.Endpoints {
		if len(ep.Addresses) > 0 {
			out.Endpoints = []discoveryv1.Endpoint{{Addresses: ep.Addresses[:1]}}
			break
		}
	}
	return out, nil
}

// serviceOf is namespace/name of the Service a slice belongs to, "" if none.
func serviceOf(obj any) string {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok || s.Labels[discoveryv1.LabelServiceName] == "" {
		return ""
	}
	return s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName]
}

func (e *endpoints) refresh(svc string) {
	objs, _ := e.inf.GetIndexer().ByIndex(byService, svc)
	has := false
	for _, o := range objs {
		for _, ep := range o.(*discoveryv1.EndpointSlice).Endpoints {
			if len(ep.Addresses) > 0 {
				has = true
			}
		}
	}
	e.mu.Lock()
	changed := e.has[svc] != has
	if has {
		e.has[svc] = true
	} else {
		delete(e.has, svc)
	}
	e.mu.Unlock()
	if changed {
		e.onChange()
	}
}

// Has reports whether the Service namespace/name has endpoints.
func (e *endpoints) Has(ns, name string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.has[ns+"/"+name]
}
