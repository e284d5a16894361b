package translate

import (
	networking "istio.io/api/networking/v1alpha3"
)

// Policy is a DestinationRule's traffic policy as it applies to one port of one subset.
type Policy struct {
	LB      *networking.LoadBalancerSettings
	Pool    *networking.ConnectionPoolSettings
	Outlier *networking.OutlierDetection
	TLS     *networking.ClientTLSSettings
}

// TrafficPolicy is the policy istiod applies to one port of one subset (subset "" is the whole
// service; a name the rule does not define gets the rule's policy):
//
//   - a portLevelSettings entry for the port replaces its policy wholesale: fields the entry
//     leaves out take their defaults, not the policy's values (as Istio documents and
//     istiod's util.GetPortLevelTrafficPolicy does);
//   - the subset's policy (so replaced for the port) then overrides the rule's field by field;
//     when the subset has an entry for the port, that entry replaces all four fields.
func TrafficPolicy(dr *networking.DestinationRule, port uint32, subset string) Policy {
	p, _ := portPolicy(dr.GetTrafficPolicy(), port)
	ss := Subset(dr, subset)
	if ss.GetTrafficPolicy() == nil {
		return p
	}
	sp, replace := portPolicy(ss.GetTrafficPolicy(), port)
	if sp.LB != nil || replace {
		p.LB = sp.LB
	}
	if sp.Pool != nil || replace {
		p.Pool = sp.Pool
	}
	if sp.Outlier != nil || replace {
		p.Outlier = sp.Outlier
	}
	if sp.TLS != nil || replace {
		p.TLS = sp.TLS
	}
	return p
}

// portPolicy is tp's entry for port when it has one (true), else tp's own settings.
func portPolicy(tp *networking.TrafficPolicy, port uint32) (Policy, bool) {
	for _, pls := range tp.GetPortLevelSettings() {
		if pls.GetPort() != nil && pls.GetPort().GetNumber() == port {
			return Policy{LB: pls.GetLoadBalancer(), Pool: pls.GetConnectionPool(), Outlier: pls.GetOutlierDetection(),
				TLS: pls.GetTls()}, true
		}
	}
	return Policy{LB: tp.GetLoadBalancer(), Pool: tp.GetConnectionPool(), Outlier: tp.GetOutlierDetection(),
		TLS: tp.GetTls()}, false
}

// Subset is the rule's subset named name; nil for "" or a name the rule does not define.
func Subset(dr *networking.DestinationRule, name string) *networking.Subset {
	if name == "" {
		return nil
	}
	for _, ss := range dr.GetSubsets() {
		if ss.GetName() == name {
			return ss
		}
	}
	return nil
}

// Subsets are the rule's named subsets, first of each name, in order: each becomes a cluster.
func Subsets(dr *networking.DestinationRule) []*networking.Subset {
	var out []*networking.Subset
	seen := map[string]bool{}
	for _, ss := range dr.GetSubsets() {
		if ss.GetName() == "" || seen[ss.GetName()] {
			continue
		}
		seen[ss.GetName()] = true
		out = append(out, ss)
	}
	return out
}
