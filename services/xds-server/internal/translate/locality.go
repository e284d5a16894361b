package translate

import (
	"math"
	"slices"
	"strings"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/xds-server/internal/model"
)

// LocalityLB is locality-aware load balancing for one cluster as seen from one proxy: istiod's
// ApplyLocalityLoadBalancer inputs.
type LocalityLB struct {
	// Setting is the DestinationRule's localityLbSetting, else the mesh's; nil when disabled.
	Setting *networking.LocalityLoadBalancerSetting
	// Failover is on when the cluster has outlier detection: without it Envoy would never see
	// the local endpoints fail, so istiod only prioritizes localities then.
	Failover bool
	// Locality and Labels are the proxy's; Labels include its topology labels (TopologyLabels).
	Locality *discoveryv1.Locality
	Labels   map[string]string
}

// NewLocalityLB is the locality load balancing pol asks for under mesh, for a proxy at locality
// with labels; nil when none applies. As istiod (GetEffectiveLbSetting): the rule's setting
// wins unless absent, and either one disabled turns it off.
func NewLocalityLB(pol Policy, mesh *meshv1alpha1.MeshConfig, locality *discoveryv1.Locality,
	labels map[string]string) *LocalityLB {
	s := pol.LB.GetLocalityLbSetting()
	if s == nil {
		s = mesh.GetLocalityLbSetting()
	}
	if s == nil || (s.GetEnabled() != nil && !s.GetEnabled().GetValue()) {
		return nil
	}
	return &LocalityLB{Setting: s, Failover: pol.Outlier != nil, Locality: locality, Labels: labels}
}

// WeightedLocalities reports whether the cluster must weigh localities
// (common_lb_config.locality_weighted_lb_config): with distribute, or with failover settings
// that take effect.
func (l *LocalityLB) WeightedLocalities() bool {
	if l == nil {
		return false
	}
	s := l.Setting
	return s.GetDistribute() != nil || (l.Failover && (s.GetFailover() != nil || s.GetFailoverPriority() != nil))
}

// FailoverPriorityLabels are the label keys failoverPriority entries name ("key" or
// "key=value"): what of a proxy's labels locality load balancing reads.
func FailoverPriorityLabels(s *networking.LocalityLoadBalancerSetting) []string {
	var out []string
	for _, e := range s.GetFailoverPriority() {
		k, _, _ := strings.Cut(e, "=")
		out = append(out, k)
	}
	return out
}

// TopologyLabels returns labels plus the topology labels istiod adds to proxies and endpoints
// (region, zone, subzone, cluster, network), which failoverPriority compares.
func TopologyLabels(labels map[string]string, l *discoveryv1.Locality, cluster, network string) map[string]string {
	out := make(map[string]string, len(labels)+5)
	for k, v := range labels {
		out[k] = v
	}
	set := func(k, v string) {
		if v != "" {
			out[k] = v
		}
	}
	set(model.LabelRegion, l.GetRegion())
	set(model.LabelZone, l.GetZone())
	set(model.LabelSubZone, l.GetSubZone())
	set(model.LabelCluster, cluster)
	if out[model.LabelNetwork] == "" {
		set(model.LabelNetwork, network)
	}
	return out
}

// localityGroup is one LocalityLbEndpoints with the endpoints it was built from, in order.
type localityGroup struct {
	loc *discoveryv1.Locality
	lle *endpointv3.LocalityLbEndpoints
	eps []*discoveryv1.Endpoint
}

// applyLocalityLB gives localities priorities or weights relative to the proxy, as istiod's
// ApplyLocalityLoadBalancer: distribute sets weights (and empties localities it does not
// name); otherwise, only with failover on, failoverPriority splits localities by how many of
// the listed labels an endpoint shares with the proxy, and failover ranks them by region, zone
// and subzone distance, a configured failover region next after the proxy's own.
func applyLocalityLB(groups []localityGroup, l *LocalityLB) []*endpointv3.LocalityLbEndpoints {
	s := l.Setting
	switch {
	case s.GetDistribute() != nil:
		applyDistribute(groups, l.Locality, s.GetDistribute())
	case l.Failover && len(s.GetFailoverPriority()) > 0:
		if len(l.Labels) > 0 {
			groups = applyFailoverPriority(groups, l.Labels, s.GetFailoverPriority())
		}
		if len(s.GetFailover()) > 0 {
			applyFailover(groups, l.Locality, s.GetFailover())
		}
	case l.Failover:
		applyFailover(groups, l.Locality, s.GetFailover())
	}
	out := make([]*endpointv3.LocalityLbEndpoints, len(groups))
	for i, g := range groups {
		out[i] = g.lle
	}
	return out
}

func applyDistribute(groups []localityGroup, proxy *discoveryv1.Locality,
	distribute []*networking.LocalityLoadBalancerSetting_Distribute) {
	for _, d := range distribute {
		if d == nil || !localityMatches(proxy, d.GetFrom()) {
			continue
		}
		unmatched := make([]bool, len(groups))
		for i := range unmatched {
			unmatched[i] = true
		}
		// Sorted, so overlapping patterns resolve the same way every time.
		for _, to := range SortedKeys(d.GetTo()) {
			weight := d.GetTo()[to]
			var total uint64
			var matched []int
			for i, g := range groups {
				if unmatched[i] && localityMatches(g.loc, to) {
					unmatched[i] = false
					matched = append(matched, i)
					total += uint64(g.lle.GetLoadBalancingWeight().GetValue())
				}
			}
			for _, i := range matched {
				w := float64(uint64(groups[i].lle.GetLoadBalancingWeight().GetValue())*uint64(weight)) / float64(total)
				if w > 0 {
					groups[i].lle.LoadBalancingWeight = wrapperspb.UInt32(uint32(min(math.Ceil(w), math.MaxUint32)))
				}
			}
		}
		for i, u := range unmatched {
			if u {
				groups[i].lle.LbEndpoints = nil
			}
		}
		return
	}
}

// applyFailover ranks each locality by its distance from the proxy's (0 same subzone … 3 other
// region, 4 a region failover does not name) on top of any failoverPriority rank, then renumbers
// the ranks densely from 0 as Envoy expects.
func applyFailover(groups []localityGroup, proxy *discoveryv1.Locality,
	failover []*networking.LocalityLoadBalancerSetting_Failover) {
	for _, g := range groups {
		loc := g.loc
		p := lbPriority(proxy, loc)
		if p == 3 {
			for _, f := range failover {
				if f.GetFrom() == proxy.GetRegion() {
					if loc.GetRegion() != f.GetTo() {
						p = 4
					}
					break
				}
			}
		}
		g.lle.Priority = g.lle.GetPriority()*5 + p
	}
	densePriorities(groups)
}

func lbPriority(proxy, l *discoveryv1.Locality) uint32 {
	switch {
	case proxy.GetRegion() != l.GetRegion():
		return 3
	case proxy.GetZone() != l.GetZone():
		return 2
	case proxy.GetSubZone() != l.GetSubZone():
		return 1
	}
	return 0
}

// applyFailoverPriority splits each locality by endpoint priority: the first listed label an
// endpoint differs from the proxy on decides (earlier labels weigh more); a "key=value" entry
// compares with value instead of the proxy's label. A network mismatch, when the network label
// comes first, ranks below every in-network endpoint.
func applyFailoverPriority(groups []localityGroup, proxyLabels map[string]string, priorities []string) []localityGroup {
	keys := make([]string, len(priorities))
	overrides := map[string]string{}
	for i, e := range priorities {
		k, v, ok := strings.Cut(e, "=")
		keys[i] = k
		if ok {
			overrides[k] = v
		}
	}
	includesNetwork := keys[0] == model.LabelNetwork
	var out []localityGroup
	for _, g := range groups {
		byPriority := map[uint32]*localityGroup{}
		var order []uint32
		for i, ep := range g.eps {
			epLabels := TopologyLabels(ep.GetLabels(), ep.GetLocality(), ep.GetClusterId(), ep.GetNetwork())
			var priority, adjust int
			for j, k := range keys {
				want, ok := overrides[k]
				if !ok {
					want = proxyLabels[k]
				}
				if want != epLabels[k] {
					if j == 0 && includesNetwork {
						adjust = len(keys)
						continue
					}
					priority = len(keys) - j
					break
				}
			}
			p := uint32(priority + adjust)
			sub := byPriority[p]
			if sub == nil {
				lle := &endpointv3.LocalityLbEndpoints{Locality: g.lle.GetLocality(), Priority: p,
					LoadBalancingWeight: wrapperspb.UInt32(0)}
				sub = &localityGroup{loc: g.loc, lle: lle}
				byPriority[p] = sub
				order = append(order, p)
			}
			le := g.lle.GetLbEndpoints()[i]
			sub.lle.LbEndpoints = append(sub.lle.LbEndpoints, le)
			sub.lle.LoadBalancingWeight = wrapperspb.UInt32(sub.lle.GetLoadBalancingWeight().GetValue() +
				le.GetLoadBalancingWeight().GetValue())
			sub.eps = append(sub.eps, ep)
		}
		slices.Sort(order)
		for _, p := range order {
			out = append(out, *byPriority[p])
		}
	}
	densePriorities(out)
	return out
}

// densePriorities renumbers priorities 0, 1, 2, … keeping their order: Envoy wants no gaps.
func densePriorities(groups []localityGroup) {
	var ps []uint32
	for _, g := range groups {
		ps = append(ps, g.lle.GetPriority())
	}
	slices.Sort(ps)
	ps = slices.Compact(ps)
	for _, g := range groups {
		i, _ := slices.BinarySearch(ps, g.lle.GetPriority())
		g.lle.Priority = uint32(i)
	}
}

// localityMatches reports whether l matches a rule locality "region/zone/subzone", where "*"
// matches anything and a missing zone or subzone matches any.
func localityMatches(l *discoveryv1.Locality, rule string) bool {
	parts := append(strings.SplitN(rule, "/", 3), "", "")
	match := func(rule, v string, optional bool) bool {
		return rule == "*" || (optional && rule == "") || rule == v
	}
	return match(parts[0], l.GetRegion(), false) && match(parts[1], l.GetZone(), true) &&
		match(parts[2], l.GetSubZone(), true)
}

// LocalityInputs tells what of a proxy locality load balancing may read in snap: nothing
// unless some DestinationRule has outlier detection or a locality setting, or the mesh
// distributes by locality; and the label keys failoverPriority entries name, sorted.
func LocalityInputs(snap *model.Snapshot) (matters bool, failoverKeys []string) {
	keys := map[string]bool{}
	setting := func(s *networking.LocalityLoadBalancerSetting) {
		for _, k := range FailoverPriorityLabels(s) {
			keys[k] = true
		}
	}
	mesh := snap.Mesh.GetLocalityLbSetting()
	matters = mesh.GetDistribute() != nil
	setting(mesh)
	policy := func(lb *networking.LoadBalancerSettings, od *networking.OutlierDetection) {
		if s := lb.GetLocalityLbSetting(); s != nil || od != nil {
			matters = true
			setting(s)
		}
	}
	for _, dr := range snap.DestinationRules {
		tps := []*networking.TrafficPolicy{dr.Spec.GetTrafficPolicy()}
		for _, ss := range dr.Spec.GetSubsets() {
			tps = append(tps, ss.GetTrafficPolicy())
		}
		for _, tp := range tps {
			policy(tp.GetLoadBalancer(), tp.GetOutlierDetection())
			for _, pls := range tp.GetPortLevelSettings() {
				policy(pls.GetLoadBalancer(), pls.GetOutlierDetection())
			}
		}
	}
	return matters, SortedKeys(keys)
}

// LocalityKey spells what locality load balancing reads of proxy, for cache scopes: its
// locality and its values of failoverKeys (topology labels included).
func LocalityKey(snap *model.Snapshot, proxy *model.Proxy, failoverKeys []string) string {
	loc := proxy.Locality(snap.ProxyEndpoint(proxy))
	var b strings.Builder
	b.WriteString("/loc=" + loc.GetRegion() + "/" + loc.GetZone() + "/" + loc.GetSubZone() + "/fp=")
	labels := TopologyLabels(proxy.Labels, loc, proxy.ClusterID, proxy.Network)
	for _, k := range failoverKeys {
		if v, ok := labels[k]; ok {
			b.WriteString(k + "=" + v + ";")
		}
	}
	return b.String()
}
