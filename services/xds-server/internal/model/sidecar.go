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
		for _, h := range e.GetHosts() {
			ns, host, ok := ParseEgressHost(h, scNS)
			if !ok || ns == "~" || (ns != "*" && ns != hostNS) {
				continue
			}
			if HostMatches(host, hostname) {
				return true
			}
		}
	}
	return false
}

// ParseEgressHost splits a Sidecar egress host "ns/host", "." standing for the Sidecar's own
// namespace; ok is false for entries without a namespace, which Istio rejects.
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
