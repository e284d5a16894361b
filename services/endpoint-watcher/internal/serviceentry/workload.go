package serviceentry

import (
	"cmp"
	"maps"
	"slices"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
)

// Workload is one workload instance as another registry sees it: a Kubernetes Pod handed to
// the index so that ServiceEntry workloadSelectors select it (as istiod's SE controller does
// with Pods), or a WorkloadEntry handed out so that Kubernetes Services select it.
type Workload struct {
	ClusterID string
	Namespace string
	Name      string
	Address   string
	// Ports by service port name; set for WorkloadEntries only.
	Ports          map[string]uint32
	Labels         map[string]string
	ServiceAccount string
	Locality       *discoveryv1.Locality
	Network        string
	Weight         uint32
	Health         discoveryv1.Health
}

func podKey(clusterID, name string) string { return clusterID + "/" + name }

// SetWorkload adds or replaces a workload of another registry (a Pod). Workloads without an
// address are ignored, as they cannot be endpoints. Labels are kept, not copied: callers must
// not modify them afterwards.
func (x *Index) SetWorkload(w Workload) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.removeWorkload(w.ClusterID, w.Namespace, w.Name)
	if w.Address == "" {
		return
	}
	we := &workloadEntry{namespace: w.Namespace, name: w.Name, labels: w.Labels, ep: &endpointSource{
		address:        w.Address,
		labels:         w.Labels,
		network:        w.Network,
		locality:       w.Locality,
		weight:         w.Weight,
		serviceAccount: w.ServiceAccount,
		workload:       w.Name,
		clusterID:      w.ClusterID,
		health:         w.Health,
	}}
	if x.pods[w.Namespace] == nil {
		x.pods[w.Namespace] = map[string]*workloadEntry{}
	}
	x.pods[w.Namespace][podKey(w.ClusterID, w.Name)] = we
	x.markSelecting(we)
}

// DeleteWorkload removes a workload set with SetWorkload; unknown ones are ignored.
func (x *Index) DeleteWorkload(clusterID, namespace, name string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.removeWorkload(clusterID, namespace, name)
}

func (x *Index) removeWorkload(clusterID, namespace, name string) {
	k := podKey(clusterID, name)
	old := x.pods[namespace][k]
	if old == nil {
		return
	}
	x.markSelecting(old)
	delete(x.pods[namespace], k)
	if len(x.pods[namespace]) == 0 {
		delete(x.pods, namespace)
	}
}

// SelectWorkloadEntries returns the WorkloadEntries of namespace whose labels include every
// selector label, by name. An empty selector selects nothing, as for Kubernetes Services.
func (x *Index) SelectWorkloadEntries(namespace string, selector map[string]string) []Workload {
	if len(selector) == 0 {
		return nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []Workload
	for _, we := range x.wes[namespace] {
		if !matches(selector, we.labels) {
			continue
		}
		ep := we.ep
		out = append(out, Workload{
			ClusterID: ep.clusterID, Namespace: we.namespace, Name: we.name, Address: ep.address,
			Ports: maps.Clone(ep.ports), Labels: maps.Clone(ep.labels), ServiceAccount: ep.serviceAccount,
			Locality: ep.locality, Network: ep.network, Weight: ep.weight, Health: ep.health,
		})
	}
	slices.SortFunc(out, func(a, b Workload) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

func matches(selector, labels map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}
