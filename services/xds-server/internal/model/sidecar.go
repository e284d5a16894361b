package model

import (
	"cmp"
	"strings"

	networking "istio.io/api/networking/v1alpha3"
)

// DefaultRootNamespace is where mesh-wide Sidecar defaults live when MeshConfig names none.
const DefaultRootNamespace = "istio-system"

// RootNamespace is the snapshot's mesh root namespace.
func (s *Snapshot) RootNamespace() string {
	return cmp.Or(s.Mesh.GetRootNamespace(), DefaultRootNamespace)
}

// SelectSidecar applies Istio's precedence to find the Sidecar of a sidecar proxy: one in the
// proxy's namespace whose workloadSelector matches it, else that namespace's default, else the
// root namespace's default; nil if none applies.
func SelectSidecar(snap *Snapshot, proxy *Proxy) *Config[*networking.Sidecar] {
	root := snap.RootNamespace()
	var nsDefault, rootDefault *Config[*networking.Sidecar]
	for i := range snap.Sidecars {
		sc := &snap.Sidecars[i]
		sel := sc.Spec.GetWorkloadSelector().GetLabels()
		switch {
		case sc.Namespace == proxy.Namespace && len(sel) > 0:
			if LabelsMatch(sel, proxy.Labels) {
				return sc
			}
		case sc.Namespace == proxy.Namespace:
			if nsDefault == nil {
				nsDefault = sc
			}
		case sc.Namespace == root && len(sel) == 0:
			if rootDefault == nil {
				rootDefault = sc
			}
		}
	}
	if nsDefault != nil {
		return nsDefault
	}
	return rootDefault
}

// SidecarImports reports whether a Sidecar of sidecarNamespace imports the service hostname of
// hostNamespace on any egress port. A nil Sidecar, or one without egress, imports everything.
func SidecarImports(sc *networking.Sidecar, sidecarNamespace, hostNamespace, hostname string) bool {
	return sidecarImports(sc, sidecarNamespace, hostNamespace, hostname, 0, true)
}

// SidecarImportsPort is SidecarImports for one service port: egress listeners bound to another
// port do not count.
func SidecarImportsPort(sc *networking.Sidecar, sidecarNamespace, hostNamespace, hostname string, port uint32) bool {
	return sidecarImports(sc, sidecarNamespace, hostNamespace, hostname, port, false)
}

func sidecarImports(sc *networking.Sidecar, scNS, hostNS, hostname string, port uint32, anyPort bool) bool {
	if len(sc.GetEgress()) == 0 {
		return true
	}
	for _, e := range sc.GetEgress() {
		if n := e.GetPort().GetNumber(); !anyPort && n != 0 && n != port {
			continue
		}
		matches := func(h string) bool { return HostMatches(h, hostname) }
		if egressImports(e.GetHosts(), scNS, hostNS, matches, matches) {
			return true
		}
	}
	return false
}

// egressImports applies one egress listener's hosts to a resource of namespace ns, as istiod's
// selectServices and SelectVirtualServices do: an entry "~ns/host" ("~/host": any namespace)
// whose host excludes it does, whatever else imports it; otherwise an entry of namespace ns or
// "*" whose host matches imports it.
func egressImports(hosts []string, scNS, ns string, matches, excludes func(host string) bool) bool {
	imported := false
	for _, h := range hosts {
		ens, host, ok := ParseEgressHost(h, scNS)
		if !ok {
			continue
		}
		exclude := false
		if rest, found := strings.CutPrefix(ens, "~"); found {
			exclude = true
			ens = cmp.Or(rest, "*")
			if ens == "." {
				ens = scNS
			}
		}
		if ens != "*" && ens != ns {
			continue
		}
		if exclude && excludes(host) {
			return false
		}
		if !exclude && matches(host) {
			imported = true
		}
	}
	return imported
}

// SidecarImportsVirtualService reports whether a Sidecar of sidecarNamespace imports a
// VirtualService of vsNamespace with hosts (resolved): some egress listener's entry for its
// namespace (or "*") overlaps one of its hosts that no exclusion names. A nil Sidecar, or one
// without egress, imports every VirtualService.
func SidecarImportsVirtualService(sc *networking.Sidecar, sidecarNamespace, vsNamespace string, hosts []string) bool {
	if len(sc.GetEgress()) == 0 {
		return true
	}
	for _, e := range sc.GetEgress() {
		for _, vh := range hosts {
			// istiod matches VirtualService hosts both ways: "*.com" imports "a.com" and back.
			overlaps := func(h string) bool { return HostMatches(h, vh) || HostMatches(vh, h) }
			within := func(h string) bool { return HostMatches(h, vh) }
			if egressImports(e.GetHosts(), sidecarNamespace, vsNamespace, overlaps, within) {
				return true
			}
		}
	}
	return false
}

// ParseEgressHost splits a Sidecar egress host "ns/host", "." standing for the Sidecar's own
// namespace (also after the exclusion prefix "~"); ok is false for entries without a
// namespace, which Istio rejects.
func ParseEgressHost(h, sidecarNamespace string) (ns, host string, ok bool) {
	ns, host, ok = strings.Cut(h, "/")
	if ns == "." {
		ns = sidecarNamespace
	}
	return ns, host, ok
}

// LabelsMatch reports whether labels carry every key/value of selector (an empty selector
// matches everything), as Kubernetes equality selectors do.
func LabelsMatch(selector, labels map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}
