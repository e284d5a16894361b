package serviceentry

import (
	"cmp"
	"maps"
	"slices"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
)

// hostKey identifies one registry entry: a hostname in a namespace.
type hostKey struct{ namespace, hostname string }

func (k hostKey) name() string { return k.namespace + "/" + k.hostname }

// Index holds the current ServiceEntries and WorkloadEntries and what was last published for
// each hostname. Set*/Delete* record a change and mark the hostnames it may affect; Flush
// recomputes only those and publishes what actually changed.
//
// Several ServiceEntries in one namespace may declare the same host. They are merged oldest
// first (creation time, then name): the Service takes resolution, location, exportTo from the
// oldest; labels are merged with the oldest winning a key; ports are the union, and a newer
// SE's port whose name or number is already taken is dropped; addresses are the union.
// Endpoints are concatenated oldest SE first, and an endpoint repeated (same address, network
// and workload) keeps its first occurrence, with port names it lacked filled from later ones.
//
// An Index is safe for concurrent use.
type Index struct {
	clusterID string

	mu sync.Mutex
	// ServiceEntries and WorkloadEntries by bus name.
	ses map[string]*serviceEntry
	// WorkloadEntries by namespace, then name: selectors only look in their own namespace.
	wes map[string]map[string]*workloadEntry
	// Workloads of other registries (Pods) by namespace, then "clusterID/name".
	pods map[string]map[string]*workloadEntry
	// Per namespace, the SEs that select WorkloadEntries: a WE change only looks at these.
	selectors map[string]map[string]*serviceEntry
	// SEs declaring each host.
	hosts map[hostKey]map[string]*serviceEntry
	dirty map[hostKey]struct{}
	// Last published content per host.
	services  map[hostKey]*discoveryv1.Service
	endpoints map[hostKey]*discoveryv1.Endpoints
}

// NewIndex returns an empty index stamping clusterID on what it produces.
func NewIndex(clusterID string) *Index {
	return &Index{
		clusterID: clusterID,
		ses:       map[string]*serviceEntry{},
		wes:       map[string]map[string]*workloadEntry{},
		pods:      map[string]map[string]*workloadEntry{},
		selectors: map[string]map[string]*serviceEntry{},
		hosts:     map[hostKey]map[string]*serviceEntry{},
		dirty:     map[hostKey]struct{}{},
		services:  map[hostKey]*discoveryv1.Service{},
		endpoints: map[hostKey]*discoveryv1.Endpoints{},
	}
}

// SetServiceEntry adds or replaces a ServiceEntry. A ServiceEntry that cannot be translated is
// not applied (its last good version, if any, stays) and a *TranslationError is returned.
func (x *Index) SetServiceEntry(r *bus.Resource) error {
	se, err := convertServiceEntry(r)
	if err != nil {
		return err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.removeSE(se.key())
	x.ses[se.key()] = se
	for _, h := range se.hosts {
		k := hostKey{se.namespace, h}
		if x.hosts[k] == nil {
			x.hosts[k] = map[string]*serviceEntry{}
		}
		x.hosts[k][se.key()] = se
		x.dirty[k] = struct{}{}
	}
	if se.hasSelector() {
		if x.selectors[se.namespace] == nil {
			x.selectors[se.namespace] = map[string]*serviceEntry{}
		}
		x.selectors[se.namespace][se.key()] = se
	}
	return nil
}

// DeleteServiceEntry removes a ServiceEntry by bus name; unknown names are ignored.
func (x *Index) DeleteServiceEntry(name string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.removeSE(name)
}

func (x *Index) removeSE(key string) {
	old, ok := x.ses[key]
	if !ok {
		return
	}
	delete(x.ses, key)
	for _, h := range old.hosts {
		k := hostKey{old.namespace, h}
		delete(x.hosts[k], key)
		if len(x.hosts[k]) == 0 {
			delete(x.hosts, k)
		}
		x.dirty[k] = struct{}{}
	}
	if sel := x.selectors[old.namespace]; sel != nil {
		delete(sel, key)
		if len(sel) == 0 {
			delete(x.selectors, old.namespace)
		}
	}
}

// SetWorkloadEntry adds or replaces a WorkloadEntry. One that cannot be translated is not
// applied and a *TranslationError is returned.
func (x *Index) SetWorkloadEntry(r *bus.Resource) error {
	we, err := convertWorkloadEntry(r)
	if err != nil {
		return err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if old := x.wes[we.namespace][we.name]; old != nil {
		x.markSelecting(old)
	}
	if x.wes[we.namespace] == nil {
		x.wes[we.namespace] = map[string]*workloadEntry{}
	}
	x.wes[we.namespace][we.name] = we
	x.markSelecting(we)
	return nil
}

// DeleteWorkloadEntry removes a WorkloadEntry by bus name; unknown names are ignored.
func (x *Index) DeleteWorkloadEntry(name string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	ns, n := schema.SplitName(name)
	if old := x.wes[ns][n]; old != nil {
		x.markSelecting(old)
		delete(x.wes[ns], n)
		if len(x.wes[ns]) == 0 {
			delete(x.wes, ns)
		}
	}
}

// markSelecting marks the hosts of every SE that selects we.
func (x *Index) markSelecting(we *workloadEntry) {
	for _, se := range x.selectors[we.namespace] {
		if se.selects(we) {
			for _, h := range se.hosts {
				x.dirty[hostKey{se.namespace, h}] = struct{}{}
			}
		}
	}
}

// Flush recomputes the hosts marked since the last Flush and publishes to p what changed: at
// most one Upsert and one Delete call per type, Services before Endpoints.
func (x *Index) Flush(p bus.Publisher) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if len(x.dirty) == 0 {
		return
	}
	keys := slices.SortedFunc(maps.Keys(x.dirty), func(a, b hostKey) int {
		return cmp.Or(cmp.Compare(a.namespace, b.namespace), cmp.Compare(a.hostname, b.hostname))
	})
	clear(x.dirty)

	var upSvc, upEps []*bus.Resource
	var delSvc, delEps []string
	for _, k := range keys {
		svc, eps := x.compute(k)
		if svc == nil {
			if _, ok := x.services[k]; ok {
				delete(x.services, k)
				delSvc = append(delSvc, k.name())
			}
			if _, ok := x.endpoints[k]; ok {
				delete(x.endpoints, k)
				delEps = append(delEps, k.name())
			}
			continue
		}
		if old, ok := x.services[k]; !ok || !proto.Equal(old, svc) {
			x.services[k] = svc
			upSvc = append(upSvc, &bus.Resource{Name: k.name(), Body: svc})
		}
		if old, ok := x.endpoints[k]; !ok || !proto.Equal(old, eps) {
			x.endpoints[k] = eps
			upEps = append(upEps, &bus.Resource{Name: k.name(), Body: eps})
		}
	}
	if len(upSvc) > 0 {
		p.Upsert(schema.Service.TypeURL, upSvc...)
	}
	if len(delSvc) > 0 {
		p.Delete(schema.Service.TypeURL, delSvc...)
	}
	if len(upEps) > 0 {
		p.Upsert(schema.Endpoints.TypeURL, upEps...)
	}
	if len(delEps) > 0 {
		p.Delete(schema.Endpoints.TypeURL, delEps...)
	}
}

// compute builds the Service and Endpoints of one host from the current state; nil when no SE
// declares it any more.
func (x *Index) compute(k hostKey) (*discoveryv1.Service, *discoveryv1.Endpoints) {
	ses := slices.SortedFunc(maps.Values(x.hosts[k]), func(a, b *serviceEntry) int {
		return cmp.Or(a.created.Compare(b.created), cmp.Compare(a.name, b.name))
	})
	if len(ses) == 0 {
		return nil, nil
	}
	oldest := ses[0]
	res, _ := resolution(oldest.spec.GetResolution()) // validated in convertServiceEntry
	svc := &discoveryv1.Service{
		Hostname:     k.hostname,
		Namespace:    k.namespace,
		Resolution:   res,
		MeshExternal: oldest.spec.GetLocation() == networking.ServiceEntry_MESH_EXTERNAL,
		Registry:     Registry,
		ExportTo:     exportTo(k.namespace, oldest.spec.GetExportTo()),
		ClusterId:    x.clusterID,
	}
	eps := &discoveryv1.Endpoints{Hostname: k.hostname, Namespace: k.namespace}

	portNames, portNumbers := map[string]bool{}, map[uint32]bool{}
	seen := map[[3]string]*discoveryv1.Endpoint{}
	for _, se := range ses {
		for lk, lv := range se.labels {
			if _, ok := svc.Labels[lk]; !ok {
				if svc.Labels == nil {
					svc.Labels = map[string]string{}
				}
				svc.Labels[lk] = lv
			}
		}
		for _, a := range se.spec.GetAddresses() {
			a, _ = listenAddress(a) // validated in convertServiceEntry
			if !slices.Contains(svc.Addresses, a) {
				svc.Addresses = append(svc.Addresses, a)
			}
		}
		for _, san := range se.spec.GetSubjectAltNames() {
			if !slices.Contains(svc.SubjectAltNames, san) {
				svc.SubjectAltNames = append(svc.SubjectAltNames, san)
			}
		}
		for _, sp := range se.spec.GetPorts() {
			if portNames[sp.GetName()] || portNumbers[sp.GetNumber()] {
				continue
			}
			portNames[sp.GetName()], portNumbers[sp.GetNumber()] = true, true
			svc.Ports = append(svc.Ports, &discoveryv1.Port{
				Name: sp.GetName(), Number: sp.GetNumber(), Protocol: sp.GetProtocol(), TargetPort: sp.GetTargetPort(),
			})
		}
		for _, src := range x.endpointSources(se, k.hostname) {
			ep := bind(src, se, x.clusterID)
			id := [3]string{ep.Address, ep.Network, ep.Workload}
			if first, ok := seen[id]; ok {
				for name, port := range ep.Ports {
					if _, ok := first.Ports[name]; !ok && portNames[name] {
						first.Ports[name] = port
					}
				}
				continue
			}
			// A port a newer SE lost to an older one is not the service's; drop it.
			maps.DeleteFunc(ep.Ports, func(name string, _ uint32) bool { return !portNames[name] })
			seen[id] = ep
			eps.Endpoints = append(eps.Endpoints, ep)
		}
	}
	return svc, eps
}

// endpointSources lists where the endpoints of se come from, in a stable order: selected
// WorkloadEntries by name, inline endpoints in declaration order, or, for a DNS SE with
// neither, the host itself (as istiod does), unless it is a wildcard.
func (x *Index) endpointSources(se *serviceEntry, host string) []*endpointSource {
	if se.hasSelector() {
		var wes []*workloadEntry
		for _, we := range x.wes[se.namespace] {
			if se.selects(we) {
				wes = append(wes, we)
			}
		}
		slices.SortFunc(wes, func(a, b *workloadEntry) int { return cmp.Compare(a.name, b.name) })
		// Selected Pods come after WorkloadEntries, by cluster then name.
		var pods []*workloadEntry
		for _, p := range x.pods[se.namespace] {
			if se.selects(p) {
				pods = append(pods, p)
			}
		}
		slices.SortFunc(pods, func(a, b *workloadEntry) int {
			return cmp.Or(cmp.Compare(a.ep.clusterID, b.ep.clusterID), cmp.Compare(a.name, b.name))
		})
		out := make([]*endpointSource, 0, len(wes)+len(pods))
		for _, we := range append(wes, pods...) {
			out = append(out, we.ep)
		}
		return out
	}
	if len(se.endpoints) > 0 {
		return se.endpoints
	}
	if isDNS(se.spec.GetResolution()) && !isWildcard(host) {
		return []*endpointSource{{address: host}}
	}
	return nil
}

func isWildcard(host string) bool { return strings.HasPrefix(host, "*") }
