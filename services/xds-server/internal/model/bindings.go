package model

import (
	"cmp"
	"maps"
	"slices"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
)

// Viewer is whom VirtualServices and DestinationRules are resolved for: a proxy (sidecar,
// gateway or proxyless client) of Namespace, with Labels (DestinationRule workloadSelectors),
// and the Sidecar that applies to it, if any (its egress hosts import VirtualServices).
type Viewer struct {
	Namespace string
	Labels    map[string]string
	Sidecar   *Config[*networking.Sidecar]
}

// Bindings finds the VirtualService and DestinationRule that bind a host for one viewer,
// memoised because generators ask for a host many times. Not safe for concurrent use.
type Bindings struct {
	snap   *Snapshot
	viewer *Viewer
	vsList []*Config[*networking.VirtualService]
	vs     map[string]*Config[*networking.VirtualService]
	dr     map[string]*Config[*networking.DestinationRule]
}

// Bindings returns the lookups for a viewer, as istiod's SidecarScope resolves them: exportTo
// (with the mesh defaults) and the DestinationRule lookup path apply. A nil viewer sees every
// rule, without lookup path or merging (mesh-wide reports).
func (s *Snapshot) Bindings(v *Viewer) *Bindings {
	return &Bindings{snap: s, viewer: v,
		vs: map[string]*Config[*networking.VirtualService]{}, dr: map[string]*Config[*networking.DestinationRule]{}}
}

// AppliesToMesh reports whether a VirtualService (or match) bound to gateways applies to
// sidecars and proxyless clients rather than only to gateways.
func AppliesToMesh(gateways []string) bool {
	return len(gateways) == 0 || slices.Contains(gateways, "mesh")
}

// ExportedTo reports whether a resource of namespace ns exported to exportTo (defaults when
// empty; no defaults is "*") is visible to namespace viewer: "*" is every namespace, "." ns
// itself, "~" none, any other entry that namespace.
func ExportedTo(ns string, exportTo, defaults []string, viewer string) bool {
	if len(exportTo) == 0 {
		exportTo = defaults
	}
	if len(exportTo) == 0 {
		return true
	}
	for _, e := range exportTo {
		switch e {
		case "*":
			return true
		case ".":
			if ns == viewer {
				return true
			}
		case "~":
		default:
			if e == viewer {
				return true
			}
		}
	}
	return false
}

// ServiceVisible reports whether namespace viewer sees svc: its exportTo (the
// networking.istio.io/exportTo annotation or the ServiceEntry's), else the mesh's
// defaultServiceExportTo.
func (s *Snapshot) ServiceVisible(svc *Service, viewer string) bool {
	return ExportedTo(svc.Spec.GetNamespace(), svc.Spec.GetExportTo(), s.Mesh.GetDefaultServiceExportTo(), viewer)
}

// visibleVirtualServices lists the mesh VirtualServices v sees (exportTo, and the egress hosts
// of its Sidecar) in istiod's order of precedence (see VirtualServicesFor); a nil viewer sees
// every one, by age.
func (s *Snapshot) visibleVirtualServices(v *Viewer) []*Config[*networking.VirtualService] {
	if v == nil {
		var out []*Config[*networking.VirtualService]
		for i := range s.VirtualServices {
			if AppliesToMesh(s.VirtualServices[i].Spec.GetGateways()) {
				out = append(out, &s.VirtualServices[i])
			}
		}
		return out
	}
	out := s.VirtualServicesFor(v.Namespace, func(vs *Config[*networking.VirtualService]) bool {
		if !AppliesToMesh(vs.Spec.GetGateways()) {
			return false
		}
		if vs.GatewayAPI && vs.Namespace != v.Namespace && !s.producerRoute(vs) {
			return false
		}
		sc := v.Sidecar
		return sc == nil || SidecarImportsVirtualService(sc.Spec, sc.Namespace, vs.Namespace, resolvedHosts(vs))
	})
	// GAMMA, as istiod: a consumer's own routes (of its namespace) override the producer's.
	slices.SortStableFunc(out, func(a, b *Config[*networking.VirtualService]) int {
		return cmpBool(b.GatewayAPI && b.Namespace == v.Namespace, a.GatewayAPI && a.Namespace == v.Namespace)
	})
	return out
}

// producerRoute reports whether a GAMMA VirtualService is of its service's own namespace: such a
// route applies to every client, another namespace's only to clients of that namespace.
func (s *Snapshot) producerRoute(vs *Config[*networking.VirtualService]) bool {
	for _, h := range vs.Spec.GetHosts() {
		for _, svc := range append([]*Service{s.Services[h]}, s.shadowed[h]...) {
			if svc != nil && svc.Spec.GetNamespace() == vs.Namespace {
				return true
			}
		}
	}
	return false
}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// VirtualServicesFor lists the VirtualServices that include keeps and a proxy of namespace ns
// sees through their exportTo (else the mesh's defaultVirtualServiceExportTo), in istiod's order
// of precedence: those of ns kept to it, then those exported to ns by name, then the public
// ones, each by age.
func (s *Snapshot) VirtualServicesFor(ns string, include func(*Config[*networking.VirtualService]) bool) []*Config[*networking.VirtualService] {
	var private, named, public []*Config[*networking.VirtualService]
	defaults := s.Mesh.GetDefaultVirtualServiceExportTo()
	for i := range s.VirtualServices {
		vs := &s.VirtualServices[i]
		if !include(vs) {
			continue
		}
		exportTo := vs.Spec.GetExportTo()
		if len(exportTo) == 0 {
			exportTo = defaults
		}
		switch {
		case len(exportTo) == 0 || slices.Contains(exportTo, "*"):
			public = append(public, vs)
		case slices.Contains(exportTo, "~"):
		case vs.Namespace == ns && (slices.Contains(exportTo, ".") || slices.Contains(exportTo, ns)):
			private = append(private, vs)
		case slices.Contains(exportTo, ns):
			named = append(named, vs)
		}
	}
	return slices.Concat(private, named, public)
}

func resolvedHosts(vs *Config[*networking.VirtualService]) []string {
	out := make([]string, 0, len(vs.Spec.GetHosts()))
	for _, h := range vs.Spec.GetHosts() {
		out = append(out, ResolveHost(h, vs.Namespace))
	}
	return out
}

// VirtualServices lists the mesh VirtualServices the viewer sees, in istiod's order of
// precedence (see VirtualServicesFor).
func (b *Bindings) VirtualServices() []*Config[*networking.VirtualService] {
	if b.vsList == nil {
		// Listed on first use: cache scopes resolve only DestinationRules.
		b.vsList = nonNil(b.snap.visibleVirtualServices(b.viewer))
	}
	return b.vsList
}

// VirtualService finds the mesh VirtualService the viewer uses for host: the first (see
// visibleVirtualServices) naming host exactly, else the first with the most specific
// wildcard matching it.
func (b *Bindings) VirtualService(host string) *Config[*networking.VirtualService] {
	if vs, ok := b.vs[host]; ok {
		return vs
	}
	var best *Config[*networking.VirtualService]
	bestHost := ""
	for _, vs := range b.VirtualServices() {
		for _, h := range vs.Spec.GetHosts() {
			rh := ResolveHost(h, vs.Namespace)
			if rh == host {
				b.vs[host] = vs
				return vs
			}
			if strings.HasPrefix(rh, "*") && HostMatches(rh, host) && (best == nil || moreSpecific(rh, bestHost)) {
				best, bestHost = vs, rh
			}
		}
	}
	b.vs[host] = best
	return best
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// moreSpecific orders wildcard hosts as istiod does: longer first, then alphabetically.
func moreSpecific(a, b string) bool {
	if len(a) == len(b) {
		return a < b
	}
	return len(a) > len(b)
}

// DestinationRule finds the rule the viewer applies to host, as istiod's lookup path does:
// the rules of the viewer's namespace, else those the service's namespace exports to it, else
// those the root namespace exports to it; in the first that has any, the most specific host
// wins, and several rules of one namespace for that host merge (see mergeDestinationRule).
// Among the merged rules one whose workloadSelector matches the viewer wins, else the last
// without selector.
func (b *Bindings) DestinationRule(host string) *Config[*networking.DestinationRule] {
	if dr, ok := b.dr[host]; ok {
		return dr
	}
	var dr *Config[*networking.DestinationRule]
	if b.viewer == nil {
		dr = b.anyDestinationRule(host)
	} else {
		dr = b.pick(b.snap.drIndex().lookup(b.snap, b.viewer.Namespace, host))
	}
	b.dr[host] = dr
	return dr
}

// anyDestinationRule is the nil viewer's rule: the most specific host, then the oldest.
func (b *Bindings) anyDestinationRule(host string) *Config[*networking.DestinationRule] {
	var best *Config[*networking.DestinationRule]
	bestHost := ""
	for i := range b.snap.DestinationRules {
		dr := &b.snap.DestinationRules[i]
		rh := ResolveHost(dr.Spec.GetHost(), dr.Namespace)
		if !HostMatches(rh, host) {
			continue
		}
		if rh == host {
			return dr
		}
		if best == nil || moreSpecific(rh, bestHost) {
			best, bestHost = dr, rh
		}
	}
	return best
}

// InboundDestinationRule is the rule of host for the viewer's inbound side (the services its
// workload serves): as DestinationRule, but workloadSelectors, which istiod honours only for
// outbound traffic, never pick a rule.
func (b *Bindings) InboundDestinationRule(host string) *Config[*networking.DestinationRule] {
	if b.viewer == nil {
		return b.anyDestinationRule(host)
	}
	return b.pickFor(b.snap.drIndex().lookup(b.snap, b.viewer.Namespace, host), false)
}

func (b *Bindings) pick(rules []*mergedRule) *Config[*networking.DestinationRule] {
	return b.pickFor(rules, true)
}

func (b *Bindings) pickFor(rules []*mergedRule, outbound bool) *Config[*networking.DestinationRule] {
	var catchAll *Config[*networking.DestinationRule]
	for _, r := range rules {
		sel := r.cfg.Spec.GetWorkloadSelector()
		if sel == nil {
			catchAll = r.cfg
			continue
		}
		// Selectors apply only to outbound traffic of workloads in the rule's own namespace.
		if outbound && r.cfg.Namespace == b.viewer.Namespace && LabelsMatch(sel.GetMatchLabels(), b.viewer.Labels) {
			return r.cfg
		}
	}
	return catchAll
}

// mergedRule is one or more DestinationRules of a namespace for one host, merged.
type mergedRule struct {
	exportTo []string // sorted, deduplicated; empty when the rule sets none
	cfg      *Config[*networking.DestinationRule]
}

// hostRules are the merged rules of one namespace (or visibility) by resolved host.
type hostRules map[string][]*mergedRule

// destRules indexes DestinationRules as istiod's destinationRuleIndex does.
type destRules struct {
	// local holds, per namespace, its rules visible to itself; exported those it exports
	// elsewhere; rootLocal the root namespace's rules kept to itself.
	local, exported map[string]hostRules
	rootLocal       hostRules
}

// drIndexOnce builds a snapshot's destRules on first use.
type drIndexOnce struct {
	once sync.Once
	ix   *destRules
}

func (s *Snapshot) drIndex() *destRules {
	h := s.drs
	if h == nil {
		h = &drIndexOnce{}
	}
	h.once.Do(func() { h.ix = newDestRules(s) })
	return h.ix
}

func newDestRules(s *Snapshot) *destRules {
	ix := &destRules{local: map[string]hostRules{}, exported: map[string]hostRules{}, rootLocal: hostRules{}}
	root := s.RootNamespace()
	defaultPrivate := slices.Contains(s.Mesh.GetDefaultDestinationRuleExportTo(), ".")
	rules := make([]*Config[*networking.DestinationRule], 0, len(s.DestinationRules))
	for i := range s.DestinationRules {
		rules = append(rules, &s.DestinationRules[i])
	}
	// istiod's order: rules with a workloadSelector first, then by age, name, namespace.
	slices.SortStableFunc(rules, func(a, b *Config[*networking.DestinationRule]) int {
		as, bs := a.Spec.GetWorkloadSelector() != nil, b.Spec.GetWorkloadSelector() != nil
		switch {
		case as && !bs:
			return -1
		case !as && bs:
			return 1
		}
		if c := a.CreateTime.Compare(b.CreateTime); c != 0 {
			return c
		}
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return strings.Compare(a.Namespace, b.Namespace)
	})
	add := func(m map[string]hostRules, ns string, dr *Config[*networking.DestinationRule], exportTo []string) {
		if m[ns] == nil {
			m[ns] = hostRules{}
		}
		m[ns].merge(dr, exportTo)
	}
	for _, dr := range rules {
		var exportTo []string
		if dr.Spec.GetWorkloadSelector() == nil {
			exportTo = slices.Compact(slices.Sorted(slices.Values(dr.Spec.GetExportTo())))
		} else {
			// A rule selecting workloads is never exported.
			exportTo = []string{"."}
		}
		if len(exportTo) == 0 || slices.Contains(exportTo, "*") || slices.Contains(exportTo, ".") || slices.Contains(exportTo, dr.Namespace) {
			add(ix.local, dr.Namespace, dr, exportTo)
		}
		// Of the mesh default only "." narrows: any other default is as good as "*" here.
		private := (len(exportTo) == 0 && defaultPrivate) ||
			(len(exportTo) == 1 && (exportTo[0] == "." || exportTo[0] == dr.Namespace))
		switch {
		case !private:
			add(ix.exported, dr.Namespace, dr, exportTo)
		case dr.Namespace == root:
			ix.rootLocal.merge(dr, exportTo)
		}
	}
	return ix
}

// merge adds dr for its host, merging it into the rules already there as istiod does: into
// those with the same exportTo (or one it widens) and the same workloadSelector (or where
// either has none), adding subsets of new names and the traffic policy when the merged rule
// has none; as a rule of its own when it merges into none of the same kind.
func (m hostRules) merge(dr *Config[*networking.DestinationRule], exportTo []string) {
	host := ResolveHost(dr.Spec.GetHost(), dr.Namespace)
	existing := m[host]
	separate := true
	for _, mr := range existing {
		switch {
		case slices.Equal(exportTo, mr.exportTo):
			separate = false
		case len(mr.exportTo) > 0 && supersetOf(exportTo, mr.exportTo):
			separate = true
		default:
			separate = true
			continue
		}
		sel, oldSel := dr.Spec.GetWorkloadSelector(), mr.cfg.Spec.GetWorkloadSelector()
		bothWith, bothWithout := sel != nil && oldSel != nil, sel == nil && oldSel == nil
		sameSel := maps2Equal(sel.GetMatchLabels(), oldSel.GetMatchLabels())
		if bothWith && !sameSel {
			separate = true
			continue
		}
		if bothWithout || bothWith {
			separate = false
		}
		merged := proto.Clone(mr.cfg.Spec).(*networking.DestinationRule)
		names := map[string]bool{}
		for _, ss := range merged.GetSubsets() {
			names[ss.GetName()] = true
		}
		for _, ss := range dr.Spec.GetSubsets() {
			if !names[ss.GetName()] {
				merged.Subsets = append(merged.Subsets, ss)
			}
		}
		if merged.GetTrafficPolicy() == nil {
			merged.TrafficPolicy = dr.Spec.GetTrafficPolicy()
		}
		cfg := *mr.cfg
		cfg.Spec = merged
		mr.cfg = &cfg
	}
	if len(existing) == 0 || separate {
		m[host] = append(existing, &mergedRule{exportTo: exportTo, cfg: dr})
	}
}

func supersetOf(a, b []string) bool {
	for _, e := range b {
		if !slices.Contains(a, e) {
			return false
		}
	}
	return true
}

func maps2Equal(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// mostSpecific finds the rules of host in m: its exact entry, else the most specific wildcard.
func (m hostRules) mostSpecific(host string) []*mergedRule {
	if rules, ok := m[host]; ok && !strings.HasPrefix(host, "*") {
		return rules
	}
	var best []*mergedRule
	bestHost := ""
	for h, rules := range m {
		if !strings.HasPrefix(h, "*") || !HostMatches(h, host) {
			continue
		}
		if best == nil || moreSpecific(h, bestHost) {
			best, bestHost = rules, h
		}
	}
	return best
}

// lookup walks istiod's path for a proxy of namespace ns: its own namespace's rules (the root
// namespace's kept to itself when ns is the root), then the service's namespace's and the root
// namespace's rules exported to ns.
func (ix *destRules) lookup(s *Snapshot, ns, host string) []*mergedRule {
	root := s.RootNamespace()
	if ns != root {
		if rules := ix.local[ns].mostSpecific(host); rules != nil {
			return rules
		}
	} else if rules := ix.rootLocal.mostSpecific(host); rules != nil {
		return rules
	}
	if svc := s.Services[host]; svc != nil && svc.Spec.GetNamespace() != "" {
		if rules := ix.exportedTo(svc.Spec.GetNamespace(), host, ns); len(rules) > 0 {
			return rules
		}
	}
	return ix.exportedTo(root, host, ns)
}

func (ix *destRules) exportedTo(owner, host, client string) []*mergedRule {
	var out []*mergedRule
	for _, r := range ix.exported[owner].mostSpecific(host) {
		if len(r.exportTo) == 0 || slices.Contains(r.exportTo, "*") || slices.Contains(r.exportTo, client) {
			out = append(out, r)
		}
	}
	return out
}

// SourceMatches reports whether an HTTP match applies to a sidecar or proxyless client v, as
// istiod's sourceMatchHTTP: a match naming gateways applies when they include "mesh", whatever
// its source conditions; else its sourceLabels and sourceNamespace must hold for v.
func SourceMatches(m *networking.HTTPMatchRequest, v *Viewer) bool {
	if len(m.GetGateways()) > 0 {
		return slices.Contains(m.GetGateways(), "mesh")
	}
	return LabelsMatch(m.GetSourceLabels(), v.Labels) &&
		(m.GetSourceNamespace() == "" || m.GetSourceNamespace() == v.Namespace)
}

// ViewerLabelKeys are the label keys through which a client's labels can change what
// Bindings and SourceMatches give it: those VirtualService matches' sourceLabels and
// DestinationRule workloadSelectors name. Sorted.
func (s *Snapshot) ViewerLabelKeys() []string {
	var keys []string
	add := func(m map[string]string) {
		for k := range m {
			keys = append(keys, k)
		}
	}
	for _, vs := range s.VirtualServices {
		for _, hr := range vs.Spec.GetHttp() {
			for _, m := range hr.GetMatch() {
				add(m.GetSourceLabels())
			}
		}
		for _, r := range vs.Spec.GetTcp() {
			for _, m := range r.GetMatch() {
				add(m.GetSourceLabels())
			}
		}
		for _, r := range vs.Spec.GetTls() {
			for _, m := range r.GetMatch() {
				add(m.GetSourceLabels())
			}
		}
	}
	for _, dr := range s.DestinationRules {
		add(dr.Spec.GetWorkloadSelector().GetMatchLabels())
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// ForNamespace is the snapshot as proxies of namespace ns see services published under one
// hostname by several namespaces, as istiod's SidecarScope picks among them: of those visible
// to ns, the one of ns itself (sidecar and proxyless clients; not gateways, where istiod keeps
// the first), else a Kubernetes Service, else the first by bus name. s itself when no hostname
// is published twice or ns sees the same as everyone.
func (s *Snapshot) ForNamespace(ns string, gateway bool) *Snapshot {
	if len(s.shadowed) == 0 {
		return s
	}
	var out *Snapshot
	for h, others := range s.shadowed {
		var own, kube, first *Service
		for _, c := range append([]*Service{s.Services[h]}, others...) {
			if !s.ServiceVisible(c, ns) {
				continue
			}
			if first == nil {
				first = c
			}
			if kube == nil && c.Spec.GetRegistry() == "kubernetes" {
				kube = c
			}
			if own == nil && !gateway && c.Spec.GetNamespace() == ns {
				own = c
			}
		}
		pick := cmp.Or(own, kube, first)
		if pick == nil || pick == s.Services[h] {
			continue
		}
		if out == nil {
			cp := *s
			cp.Services = maps.Clone(s.Services)
			// The address index reads Services: this copy needs its own.
			cp.workloads = &workloadIndex{}
			out = &cp
		}
		out.Services[h] = pick
	}
	if out == nil {
		return s
	}
	return out
}
