// Package authn resolves the PeerAuthentication policies that apply to a workload into the
// mutual TLS mode of each of its ports, with istiod's rules: the mesh-wide policy (root
// namespace, no selector), then the namespace-wide one, then the workload one (a selector
// matching the workload's labels, not in the root namespace) each override the mode of the
// level above unless theirs is UNSET; the workload policy's portLevelMtls overrides per
// target port; where several policies compete at one level the oldest wins; with none the
// mode is PERMISSIVE.
package authn

import (
	security "istio.io/api/security/v1beta1"

	"sailplane.dev/services/xds-server/internal/model"
)

// Mode is the mutual TLS mode of a port. The zero value is Permissive, Istio's default.
type Mode int

// The modes, as PeerAuthentication names them.
const (
	// Permissive accepts mutual TLS and plaintext.
	Permissive Mode = iota
	// Strict accepts mutual TLS only.
	Strict
	// Disable accepts plaintext only.
	Disable
)

func (m Mode) String() string {
	switch m {
	case Strict:
		return "STRICT"
	case Disable:
		return "DISABLE"
	default:
		return "PERMISSIVE"
	}
}

// Policy is a workload's resolved PeerAuthentication.
type Policy struct {
	// Mode applies to every port without its own.
	Mode Mode
	// PerPort overrides Mode by the workload's target port (the port it listens on).
	PerPort map[uint32]Mode
}

// ModeFor is the mode of the workload's target port.
func (p Policy) ModeFor(port uint32) Mode {
	if m, ok := p.PerPort[port]; ok {
		return m
	}
	return p.Mode
}

// ForWorkload resolves the PeerAuthentications of snap for a workload of namespace ns with
// labels. Its labels matter only through authz.SelectorLabelKeys, which cache keys use.
func ForWorkload(snap *model.Snapshot, ns string, labels map[string]string) Policy {
	root := snap.RootNamespace()
	var mesh, namespace, workload *security.PeerAuthentication
	// The snapshot lists them oldest first, so the first found at a level wins.
	for _, c := range snap.PeerAuthentications {
		match := c.Spec.GetSelector().GetMatchLabels()
		switch {
		case len(match) == 0 && c.Namespace == root:
			if mesh == nil {
				mesh = c.Spec
			}
		case len(match) == 0 && c.Namespace == ns:
			if namespace == nil {
				namespace = c.Spec
			}
		case len(match) > 0 && c.Namespace == ns && ns != root && selects(match, labels):
			// A selector in the root namespace selects nothing, as in istiod.
			if workload == nil {
				workload = c.Spec
			}
		}
	}
	var p Policy
	for _, level := range []*security.PeerAuthentication{mesh, namespace, workload} {
		if m, ok := mode(level.GetMtls()); ok {
			p.Mode = m
		}
	}
	if ports := workload.GetPortLevelMtls(); len(ports) > 0 {
		p.PerPort = make(map[uint32]Mode, len(ports))
		for port, mtls := range ports {
			p.PerPort[port] = p.Mode
			if m, ok := mode(mtls); ok {
				p.PerPort[port] = m
			}
		}
	}
	return p
}

// NamespaceMode is the mode of a namespace's workloads that no workload policy selects, as
// istiod infers a destination's mode when it decides on auto mutual TLS.
func NamespaceMode(snap *model.Snapshot, ns string) Mode {
	return ForWorkload(snap, ns, nil).Mode
}

// mode converts a PeerAuthentication mode; false for UNSET, which inherits.
func mode(mtls *security.PeerAuthentication_MutualTLS) (Mode, bool) {
	switch mtls.GetMode() {
	case security.PeerAuthentication_MutualTLS_STRICT:
		return Strict, true
	case security.PeerAuthentication_MutualTLS_PERMISSIVE:
		return Permissive, true
	case security.PeerAuthentication_MutualTLS_DISABLE:
		return Disable, true
	}
	return Permissive, false
}

func selects(selector, labels map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}
