// Package ndsgen builds Istio's name table (NDS, istio.networking.nds.v1.NameTable) for a proxy:
// every host the proxy can see (exportTo, and the Sidecar's egress for sidecars) with the
// addresses its DNS proxy answers, as istiod's pkg/dns/server.BuildNameTable does —
//
//   - a service's VIPs (a Kubernetes service's filtered to the proxy's IP families when the
//     proxy is single-stack; a ServiceEntry's as written, CIDRs left out);
//   - a ServiceEntry without addresses, when the proxy captures DNS and auto-allocation is on,
//     its auto-allocated addresses (see model.Allocator);
//   - a service without VIP nor resolution (a headless Kubernetes service, a ServiceEntry with
//     resolution NONE) its healthy endpoints on the proxy's network, and for a Kubernetes
//     service the name of each of its pods that sets a subdomain (Kubernetes DNS's
//     <hostname>.<subdomain>.<namespace>.svc.<domain>), to its address.
package ndsgen

import (
	"net/netip"
	"strings"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	ndsv1 "sailplane.dev/proto/istio/networking/nds/v1"
	"sailplane.dev/services/xds-server/internal/model"
)

// Registries as the name table names them (istiod's provider IDs); the agent derives short
// names only for "Kubernetes" entries.
const (
	RegistryKubernetes = "Kubernetes"
	RegistryExternal   = "External"
)

// unspecified is how a service without VIP carries its address.
const unspecified = "0.0.0.0"

// Generator builds name tables.
type Generator struct {
	// alloc gives ServiceEntry hosts without addresses theirs; the Envoy generator shares it,
	// so that the names a proxy resolves lead to its listeners.
	alloc *model.Allocator
}

// New returns a generator taking auto-allocated addresses from alloc.
func New(alloc *model.Allocator) *Generator { return &Generator{alloc: alloc} }

// CacheScope names every proxy input Table reads: its type and namespace (exportTo), the
// Sidecar that applies, whether it uses auto-allocated addresses, its IP families, and its
// cluster and network (headless endpoints).
func (g *Generator) CacheScope(snap *model.Snapshot, p *model.Proxy) string {
	var b strings.Builder
	b.WriteString("nds/" + string(p.Type) + "/" + p.Namespace + "/sc=")
	if p.IsSidecar() {
		if sc := model.SelectSidecar(snap, p); sc != nil {
			b.WriteString(sc.Namespace + "/" + sc.Name)
		}
	}
	v4, v6 := p.IPFamilies()
	b.WriteString("/auto=")
	if g.alloc.Uses(p) {
		b.WriteString("1")
	}
	b.WriteString("/f=")
	if v4 {
		b.WriteString("4")
	}
	if v6 {
		b.WriteString("6")
	}
	b.WriteString("/c=" + p.ClusterID + "/n=" + p.Network)
	return b.String()
}

// Table is the name table of proxy p at snap.
func (g *Generator) Table(snap *model.Snapshot, p *model.Proxy) *ndsv1.NameTable {
	out := &ndsv1.NameTable{Table: map[string]*ndsv1.NameTable_NameInfo{}}
	scope := model.SelectSidecar(snap, p)
	if !p.IsSidecar() {
		scope = nil
	}
	v4, v6 := p.IPFamilies()
	auto := g.alloc.For(snap, p)
	for _, h := range snap.Hostnames() {
		svc := snap.Services[h]
		spec := svc.Spec
		if !model.ExportVisibility(spec.GetNamespace(), spec.GetExportTo()).Sees(p.Namespace) {
			continue
		}
		if scope != nil && !model.SidecarImports(scope.Spec, scope.Namespace, spec.GetNamespace(), h) {
			continue
		}
		kube := spec.GetRegistry() == "kubernetes"
		ips, headless := vips(spec)
		switch {
		case kube:
			ips = filterFamilies(ips, v4, v6)
		case len(ips) == 0 && headless && auto != nil:
			if a, ok := auto[model.AutoAddressKey(spec)]; ok {
				ips = a.For(v4, v6)
				headless = len(ips) == 0
			}
		}
		if headless && spec.GetResolution() == discoveryv1.Resolution_NONE && len(spec.GetPorts()) > 0 {
			ips = append(ips, headlessEndpoints(out, svc, p, kube)...)
		}
		if len(ips) == 0 {
			continue
		}
		info := &ndsv1.NameTable_NameInfo{Ips: ips, Registry: RegistryExternal}
		if kube {
			info.Registry = RegistryKubernetes
			if !strings.HasSuffix(h, ".svc.clusterset.local") {
				// The agent derives name, name.namespace and name.namespace.svc from these.
				info.Namespace = spec.GetNamespace()
				info.Shortname, _, _ = strings.Cut(h, ".")
			}
		}
		out.Table[h] = info
	}
	return out
}

// vips are the addresses a service declares that parse as IPs (a /32 or /128 CIDR counts as
// its address); headless when it declares none, or the unspecified address.
func vips(spec *discoveryv1.Service) (ips []string, headless bool) {
	addrs := spec.GetAddresses()
	if len(addrs) == 0 || addrs[0] == "" || addrs[0] == unspecified {
		return nil, true
	}
	for _, a := range addrs {
		if ip, err := netip.ParseAddr(a); err == nil {
			ips = append(ips, ip.String())
		} else if pf, err := netip.ParsePrefix(a); err == nil && pf.Bits() == pf.Addr().BitLen() {
			ips = append(ips, pf.Addr().String())
		}
	}
	return ips, false
}

// headlessEndpoints are the addresses of a headless service's healthy endpoints serving its
// first port on the proxy's network (istiod takes other clusters' too, as
// ENABLE_MULTICLUSTER_HEADLESS does by default); for a Kubernetes service it also adds each
// pod's name to out, the proxy's cluster's endpoints winning over another's of that name.
func headlessEndpoints(out *ndsv1.NameTable, svc *model.Service, p *model.Proxy, kube bool) []string {
	spec := svc.Spec
	first := spec.GetPorts()[0].GetName()
	_, domain, _ := strings.Cut(spec.GetHostname(), ".")
	var ips []string
	local, remote := map[string][]string{}, map[string][]string{}
	var order []string
	for _, ep := range svc.Endpoints {
		if _, err := netip.ParseAddr(ep.GetAddress()); err != nil || ep.GetHealth() != discoveryv1.Health_HEALTHY {
			continue
		}
		if ports := ep.GetPorts(); len(ports) > 0 && first != "" {
			if _, ok := ports[first]; !ok {
				continue
			}
		}
		if p.Network != "" && ep.GetNetwork() != "" && ep.GetNetwork() != p.Network {
			continue
		}
		if kube && ep.GetPodDnsName() != "" {
			// Kubernetes DNS's pod names: <hostname>.<subdomain>.<namespace>.svc.<domain>.
			host := ep.GetPodDnsName() + "." + domain
			if local[host] == nil && remote[host] == nil {
				order = append(order, host)
			}
			if ep.GetClusterId() == "" || ep.GetClusterId() == p.ClusterID {
				local[host] = append(local[host], ep.GetAddress())
			} else {
				remote[host] = append(remote[host], ep.GetAddress())
			}
		}
		ips = append(ips, ep.GetAddress())
	}
	for _, host := range order {
		addrs := local[host]
		if addrs == nil {
			addrs = remote[host]
		}
		out.Table[host] = &ndsv1.NameTable_NameInfo{Ips: addrs, Registry: RegistryKubernetes,
			Namespace: spec.GetNamespace(), Shortname: strings.TrimSuffix(host, "."+domain)}
	}
	return ips
}

// filterFamilies keeps the addresses of the families a single-stack proxy can reach; a
// dual-stack proxy gets them all.
func filterFamilies(ips []string, v4, v6 bool) []string {
	if v4 && v6 {
		return ips
	}
	var out []string
	for _, s := range ips {
		a, err := netip.ParseAddr(s)
		if err != nil {
			continue
		}
		if (a.Unmap().Is4() && v4) || (!a.Unmap().Is4() && v6) {
			out = append(out, s)
		}
	}
	return out
}
