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

// TrafficPolicy applies Istio's precedence, field by field: the subset's port settings over
// the subset's policy over the rule's port settings over the rule's policy. subset "" is the
// whole service; a subset the rule does not define gets the rule's policy.
func TrafficPolicy(dr *networking.DestinationRule, port uint32, subset string) Policy {
	var p Policy
	merge := func(tp *networking.TrafficPolicy) {
		if tp == nil {
			return
		}
		apply := func(lb *networking.LoadBalancerSettings, cp *networking.ConnectionPoolSettings,
			od *networking.OutlierDetection, t *networking.ClientTLSSettings) {
			if lb != nil {
				p.LB = lb
			}
			if cp != nil {
				p.Pool = cp
			}
			if od != nil {
				p.Outlier = od
			}
			if t != nil {
				p.TLS = t
			}
		}
		apply(tp.GetLoadBalancer(), tp.GetConnectionPool(), tp.GetOutlierDetection(), tp.GetTls())
		for _, pls := range tp.GetPortLevelSettings() {
			if pls.GetPort().GetNumber() == port {
				apply(pls.GetLoadBalancer(), pls.GetConnectionPool(), pls.GetOutlierDetection(), pls.GetTls())
			}
		}
	}
	merge(dr.GetTrafficPolicy())
	if ss := Subset(dr, subset); ss != nil {
		merge(ss.GetTrafficPolicy())
	}
	return p
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
