package kubesource

import (
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
)

// The namespaces of the mesh travel on the bus with their labels (schema.Namespace), because the
// xds-server translates the Gateway API too, and a listener's allowedRoutes selector admits
// routes by their namespace's labels: it must see the same labels the status writer matches
// here. Only the namespaces the discoverySelectors admit are published, as for config: routes
// elsewhere are not on the bus either. Names and labels only; annotations stay in the cluster.

// syncNamespaceLocked brings the bus in line with one namespace: published with its labels
// while it exists and is selected, deleted otherwise. Before the initial sync it only records.
func (s *Source) syncNamespaceLocked(name string) {
	var labels map[string]string
	exists := false
	if obj, err := s.caches.nsLister.Get(name); err == nil {
		if n, ok := obj.(*corev1.Namespace); ok && s.selectedLocked(name) {
			labels, exists = n.Labels, true
		}
	}
	prev, published := s.namespaces[name]
	switch {
	case !exists && published:
		delete(s.namespaces, name)
		if s.synced {
			s.pub.Delete(schema.Namespace.TypeURL, name)
		}
	case exists && (!published || !maps.Equal(prev, labels)):
		labels = maps.Clone(labels)
		s.namespaces[name] = labels
		if s.synced {
			s.pub.Upsert(schema.Namespace.TypeURL, namespaceResource(name, labels))
		}
	}
}

// resyncNamespacesLocked re-evaluates every namespace known to the informer or the bus.
func (s *Source) resyncNamespacesLocked() {
	names := map[string]bool{}
	for _, k := range s.caches.ns.GetIndexer().ListKeys() {
		names[k] = true
	}
	for name := range s.namespaces {
		names[name] = true
	}
	for _, name := range slices.Sorted(maps.Keys(names)) {
		s.syncNamespaceLocked(name)
	}
}

// namespaceResourcesLocked is the published namespaces, for the initial full state.
func (s *Source) namespaceResourcesLocked() []*bus.Resource {
	out := make([]*bus.Resource, 0, len(s.namespaces))
	for _, name := range slices.Sorted(maps.Keys(s.namespaces)) {
		out = append(out, namespaceResource(name, s.namespaces[name]))
	}
	return out
}

func namespaceResource(name string, labels map[string]string) *bus.Resource {
	return &bus.Resource{Name: name, Body: &discoveryv1.Namespace{Name: name, Labels: labels}}
}

// oneNamespace is an informer holding only the namespace name, without labels, for a Source
// watching one namespace: Namespaces are cluster-scoped, and a Role cannot grant reading even
// its own. Its watch never sends.
func oneNamespace(name string) cache.SharedIndexInformer {
	lw := &cache.ListWatch{
		ListFunc: func(metav1.ListOptions) (runtime.Object, error) {
			return &corev1.NamespaceList{Items: []corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: name}}}}, nil
		},
		WatchFunc: func(metav1.ListOptions) (watch.Interface, error) { return watch.NewFake(), nil },
	}
	return cache.NewSharedIndexInformer(noWatchList{lw}, &corev1.Namespace{}, 0, cache.Indexers{})
}

// noWatchList tells the reflector to list, not stream the initial state from a watch (which the
// fake watch would never end).
type noWatchList struct{ *cache.ListWatch }

func (noWatchList) IsWatchListSemanticsUnSupported() bool { return true }

// informerRunner runs one informer as the caches' factories are run.
type informerRunner struct{ inf cache.SharedIndexInformer }

func (r informerRunner) Start(stop <-chan struct{}) { go r.inf.Run(stop) }

// Shutdown returns at once: Run ends with the stop channel, which stop closes first.
func (r informerRunner) Shutdown() {}
