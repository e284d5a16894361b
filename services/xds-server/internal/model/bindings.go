package model

import (
	"slices"

	networking "istio.io/api/networking/v1alpha3"
)

// Visible reports whether config of namespace ns exported to exportTo is visible to the viewer;
// nil means everything is (proxyless clients do not apply exportTo).
type Visible func(ns string, exportTo []string) bool

// DestinationRuleRank orders candidate rules of namespace ruleNS for host, lower first (ranks
// stay below 1<<20, the wildcard penalty); nil ranks all namespaces the same (proxyless
// clients), leaving only exact-before-wildcard and age.
type DestinationRuleRank func(ruleNS, host string) int

// Bindings finds the VirtualService and DestinationRule that bind a host for one viewer (a
// proxy, or all proxyless clients), memoised because generators ask for a host many times.
// Not safe for concurrent use.
type Bindings struct {
	snap    *Snapshot
	visible Visible
	rank    DestinationRuleRank
	vs      map[string]*Config[*networking.VirtualService]
	dr      map[string]*Config[*networking.DestinationRule]
}

// Bindings returns the lookups for a viewer; see Visible and DestinationRuleRank for nil.
func (s *Snapshot) Bindings(visible Visible, rank DestinationRuleRank) *Bindings {
	return &Bindings{snap: s, visible: visible, rank: rank,
		vs: map[string]*Config[*networking.VirtualService]{}, dr: map[string]*Config[*networking.DestinationRule]{}}
}

// AppliesToMesh reports whether a VirtualService (or match) bound to gateways applies to
// sidecars and proxyless clients rather than only to gateways.
func AppliesToMesh(gateways []string) bool {
	return len(gateways) == 0 || slices.Contains(gateways, "mesh")
}

func (b *Bindings) isVisible(ns string, exportTo []string) bool {
	return b.visible == nil || b.visible(ns, exportTo)
}

// VirtualService finds the visible mesh VirtualService for host: an exact host wins over a
// wildcard, then the oldest (the snapshot's order).
func (b *Bindings) VirtualService(host string) *Config[*networking.VirtualService] {
	if vs, ok := b.vs[host]; ok {
		return vs
	}
	var wildcard *Config[*networking.VirtualService]
	for i := range b.snap.VirtualServices {
		vs := &b.snap.VirtualServices[i]
		if !AppliesToMesh(vs.Spec.GetGateways()) || !b.isVisible(vs.Namespace, vs.Spec.GetExportTo()) {
			continue
		}
		for _, h := range vs.Spec.GetHosts() {
			rh := ResolveHost(h, vs.Namespace)
			if rh == host {
				b.vs[host] = vs
				return vs
			}
			if wildcard == nil && HostMatches(rh, host) {
				wildcard = vs
			}
		}
	}
	b.vs[host] = wildcard
	return wildcard
}

// DestinationRule finds the visible rule for host: exact hosts before wildcards, then by rank,
// then the oldest (the snapshot's order).
func (b *Bindings) DestinationRule(host string) *Config[*networking.DestinationRule] {
	if dr, ok := b.dr[host]; ok {
		return dr
	}
	var best *Config[*networking.DestinationRule]
	bestScore := 1 << 30
	for i := range b.snap.DestinationRules {
		dr := &b.snap.DestinationRules[i]
		if !b.isVisible(dr.Namespace, dr.Spec.GetExportTo()) {
			continue
		}
		rh := ResolveHost(dr.Spec.GetHost(), dr.Namespace)
		if !HostMatches(rh, host) {
			continue
		}
		score := 0
		if b.rank != nil {
			score = b.rank(dr.Namespace, host)
		}
		// Any exact host outranks every wildcard, whatever the namespace ranks.
		if rh != host {
			score += 1 << 20
		}
		if score < bestScore {
			best, bestScore = dr, score
		}
	}
	b.dr[host] = best
	return best
}
