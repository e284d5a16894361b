package analyze

import (
	"fmt"
	"slices"
	"strings"

	networking "istio.io/api/networking/v1alpha3"

	"sailplane.dev/shared/schema"
)

// DomainSuffix is the suffix of Kubernetes service hosts, as the mesh's default.
const DomainSuffix = "cluster.local"

// meshGateway is the reserved gateway name of the sidecars.
const meshGateway = "mesh"

// Analyze runs every analyzer on s and returns their messages, sorted by file, document,
// resource and field.
func Analyze(s *Set) []Message {
	var msgs []Message
	for _, a := range []func(*Set) []Message{destinationSubsets, destinationHosts, gateways, conflictingVirtualServices, conflictingDestinationRules, gatewayAPI} {
		msgs = append(msgs, a(s)...)
	}
	return Sort(msgs)
}

// destination is one destination of a VirtualService, with its field path.
type destination struct {
	field string
	// mirror: a mirror destination (Istio names the reference "mirror host" then).
	mirror bool
	*networking.Destination
}

// destinations lists every destination of vs: routes of http, tcp and tls rules, and mirrors.
func destinations(vs *networking.VirtualService) []destination {
	var out []destination
	for i, r := range vs.GetHttp() {
		for j, d := range r.GetRoute() {
			out = append(out, destination{fmt.Sprintf("spec.http[%d].route[%d].destination", i, j), false, d.GetDestination()})
		}
		if m := r.GetMirror(); m != nil {
			out = append(out, destination{fmt.Sprintf("spec.http[%d].mirror", i), true, m})
		}
		for j, m := range r.GetMirrors() {
			out = append(out, destination{fmt.Sprintf("spec.http[%d].mirrors[%d].destination", i, j), true, m.GetDestination()})
		}
	}
	for i, r := range vs.GetTcp() {
		for j, d := range r.GetRoute() {
			out = append(out, destination{fmt.Sprintf("spec.tcp[%d].route[%d].destination", i, j), false, d.GetDestination()})
		}
	}
	for i, r := range vs.GetTls() {
		for j, d := range r.GetRoute() {
			out = append(out, destination{fmt.Sprintf("spec.tls[%d].route[%d].destination", i, j), false, d.GetDestination()})
		}
	}
	return out
}

// destinationSubsets: a destination's subset must be defined by a DestinationRule for its host
// (Istio's virtualservice.DestinationRuleAnalyzer).
func destinationSubsets(s *Set) []Message {
	subsets := map[string]bool{} // host + "+" + subset
	var wildcards []typed[*networking.DestinationRule]
	for _, dr := range of[*networking.DestinationRule](s, schema.DestinationRule) {
		host := resolveHost(dr.spec.GetHost(), dr.Namespace)
		if strings.HasPrefix(host, "*") {
			wildcards = append(wildcards, dr)
		}
		for _, ss := range dr.spec.GetSubsets() {
			subsets[host+"+"+ss.GetName()] = true
		}
	}
	defined := func(host, subset string) bool {
		if subsets[host+"+"+subset] {
			return true
		}
		return slices.ContainsFunc(wildcards, func(dr typed[*networking.DestinationRule]) bool {
			return hostMatches(resolveHost(dr.spec.GetHost(), dr.Namespace), host) &&
				slices.ContainsFunc(dr.spec.GetSubsets(), func(ss *networking.Subset) bool { return ss.GetName() == subset })
		})
	}
	var msgs []Message
	for _, vs := range of[*networking.VirtualService](s, schema.VirtualService) {
		for _, d := range destinations(vs.spec) {
			if d.GetSubset() == "" || defined(resolveHost(d.GetHost(), vs.Namespace), d.GetSubset()) {
				continue
			}
			ref := "host+subset in destinationrule"
			if d.mirror {
				ref = "mirror+subset in destinationrule"
			}
			msgs = append(msgs, about(vs.Config, Error, CodeReferencedResourceNotFound, d.field+".subset",
				referencedNotFound(ref, d.GetHost()+"+"+d.GetSubset())))
		}
	}
	return msgs
}

// destinationHosts: a destination's host must be a service: a registry service or a
// ServiceEntry host (Istio's virtualservice.DestinationHostAnalyzer); so should a
// DestinationRule's host (a warning, Istio's UnknownDestinationRuleHost).
func destinationHosts(s *Set) []Message {
	known := s.knownHost()
	if known == nil {
		return nil
	}
	var msgs []Message
	for _, vs := range of[*networking.VirtualService](s, schema.VirtualService) {
		for _, d := range destinations(vs.spec) {
			if d.GetHost() == "" || known(resolveHost(d.GetHost(), vs.Namespace)) {
				continue
			}
			ref := "host"
			if d.mirror {
				ref = "mirror host"
			}
			msgs = append(msgs, about(vs.Config, Error, CodeReferencedResourceNotFound, d.field+".host", referencedNotFound(ref, d.GetHost())))
		}
	}
	for _, dr := range of[*networking.DestinationRule](s, schema.DestinationRule) {
		if h := dr.spec.GetHost(); h != "" && !known(resolveHost(h, dr.Namespace)) {
			msgs = append(msgs, about(dr.Config, Warning, CodeUnknownDestinationRuleHost, "spec.host",
				fmt.Sprintf("The host %s defined in the DestinationRule does not match any services in the mesh.", h)))
		}
	}
	return msgs
}

// knownHost reports whether a host is a service's: a registry service or a ServiceEntry host,
// either covering the other. Nil when the registry was not read (NoRegistry): hosts are not
// checked then.
func (s *Set) knownHost() func(host string) bool {
	if s.NoRegistry {
		return nil
	}
	var hosts []string
	for _, svc := range s.Services {
		hosts = append(hosts, svc.GetHostname())
	}
	for _, se := range of[*networking.ServiceEntry](s, schema.ServiceEntry) {
		for _, h := range se.spec.GetHosts() {
			hosts = append(hosts, resolveHost(h, se.Namespace))
		}
	}
	return func(host string) bool {
		return slices.ContainsFunc(hosts, func(h string) bool { return hostMatches(h, host) || hostMatches(host, h) })
	}
}

// gateways: a VirtualService's gateways must exist, "name" in its own namespace or "ns/name", and
// serve one of its hosts (Istio's virtualservice.GatewayAnalyzer).
func gateways(s *Set) []Message {
	byName := map[string]typed[*networking.Gateway]{}
	for _, gw := range of[*networking.Gateway](s, schema.Gateway) {
		byName[gw.Namespace+"/"+gw.Name] = gw
	}
	var msgs []Message
	for _, vs := range of[*networking.VirtualService](s, schema.VirtualService) {
		for i, g := range vs.spec.GetGateways() {
			if g == meshGateway {
				continue
			}
			full := g
			if !strings.Contains(g, "/") {
				full = vs.Namespace + "/" + g
			}
			field := fmt.Sprintf("spec.gateways[%d]", i)
			gw, ok := byName[full]
			if !ok {
				msgs = append(msgs, about(vs.Config, Error, CodeReferencedResourceNotFound, field, referencedNotFound("gateway", g)))
				continue
			}
			if !servesAnyHost(gw, vs.spec.GetHosts(), vs.Namespace) {
				msgs = append(msgs, about(vs.Config, Warning, CodeVirtualServiceHostNotFoundInGateway, field,
					fmt.Sprintf("one or more host %v defined in VirtualService %s not found in Gateway %s.", vs.spec.GetHosts(), vs.Namespace+"/"+vs.Name, full)))
			}
		}
	}
	return msgs
}

// servesAnyHost reports whether one of gw's server hosts ("host", "ns/host", "./host", "*/host")
// offered to namespace vsNS covers one of hosts, or is covered by it.
func servesAnyHost(gw typed[*networking.Gateway], hosts []string, vsNS string) bool {
	for _, srv := range gw.spec.GetServers() {
		for _, h := range srv.GetHosts() {
			ns, gh, ok := strings.Cut(h, "/")
			if !ok {
				gh = h
			} else if ns == "." {
				ns = gw.Namespace
			}
			if ok && ns != "*" && ns != vsNS {
				continue
			}
			for _, vh := range hosts {
				if hostMatches(gh, vh) || hostMatches(vh, gh) {
					return true
				}
			}
		}
	}
	return false
}

// conflictingVirtualServices: two VirtualServices of the mesh gateway for one host, visible in
// the same namespaces; a sidecar uses one of them (Istio's
// virtualservice.ConflictingMeshGatewayHostsAnalyzer). Every one of them gets the message.
func conflictingVirtualServices(s *Set) []Message {
	type scoped struct{ scope, host string }
	byHost := map[scoped][]typed[*networking.VirtualService]{}
	var order []scoped
	for _, vs := range of[*networking.VirtualService](s, schema.VirtualService) {
		gws := vs.spec.GetGateways()
		if len(gws) > 0 && !slices.Contains(gws, meshGateway) {
			continue
		}
		for _, scope := range exportScopes(vs.spec.GetExportTo(), vs.Namespace) {
			for _, h := range vs.spec.GetHosts() {
				k := scoped{scope, resolveHost(h, vs.Namespace)}
				if byHost[k] == nil {
					order = append(order, k)
				}
				byHost[k] = append(byHost[k], vs)
			}
		}
	}
	var msgs []Message
	reported := map[string]bool{}
	for _, k := range order {
		list := byHost[k]
		if k.scope != "*" {
			// What is exported everywhere is visible in k.scope too.
			list = append(list, byHost[scoped{"*", k.host}]...)
		}
		if len(list) < 2 {
			continue
		}
		var names []string
		for _, vs := range list {
			names = append(names, vs.Namespace+"/"+vs.Name)
		}
		slices.Sort(names)
		names = slices.Compact(names)
		if len(names) < 2 {
			continue
		}
		for _, vs := range list {
			id := vs.Namespace + "/" + vs.Name
			if reported[id] {
				continue
			}
			reported[id] = true
			msgs = append(msgs, about(vs.Config, Error, CodeConflictingMeshGatewayVirtualServiceHosts, "spec.hosts",
				fmt.Sprintf("The VirtualServices %s associated with mesh gateway define the same host %s which can lead to undefined behavior. This can be fixed by merging the conflicting VirtualServices into a single resource.",
					strings.Join(names, ","), k.scope+"/"+k.host)))
		}
	}
	return msgs
}

// conflictingDestinationRules: two DestinationRules of one namespace for one host, neither with a
// workload selector. Istio merges them; Sailplane, like a sidecar's view of one host, applies one
// (the oldest), so the other's settings are silently lost.
func conflictingDestinationRules(s *Set) []Message {
	byHost := map[string][]typed[*networking.DestinationRule]{}
	var order []string
	for _, dr := range of[*networking.DestinationRule](s, schema.DestinationRule) {
		if len(dr.spec.GetWorkloadSelector().GetMatchLabels()) > 0 {
			continue
		}
		k := dr.Namespace + "/" + resolveHost(dr.spec.GetHost(), dr.Namespace)
		if byHost[k] == nil {
			order = append(order, k)
		}
		byHost[k] = append(byHost[k], dr)
	}
	var msgs []Message
	for _, k := range order {
		list := byHost[k]
		if len(list) < 2 {
			continue
		}
		names := make([]string, len(list))
		for i, dr := range list {
			names[i] = dr.Namespace + "/" + dr.Name
		}
		slices.Sort(names)
		for _, dr := range list {
			msgs = append(msgs, about(dr.Config, Error, CodeConflictingDestinationRules, "spec.host",
				fmt.Sprintf("The DestinationRules %s define the same host %s: Sailplane applies only the oldest one and ignores the others. This can be fixed by merging the conflicting DestinationRules into a single resource.",
					strings.Join(names, ","), resolveHost(dr.spec.GetHost(), dr.Namespace))))
		}
	}
	return msgs
}

// exportScopes are the namespaces a resource of ns exported to exportTo is visible in: "*" for
// all.
func exportScopes(exportTo []string, ns string) []string {
	if len(exportTo) == 0 || slices.Contains(exportTo, "*") {
		return []string{"*"}
	}
	var out []string
	for _, e := range exportTo {
		if e == "." {
			e = ns
		}
		if !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	return out
}

// referencedNotFound is Istio's ReferencedResourceNotFound text.
func referencedNotFound(refType, refValue string) string {
	return fmt.Sprintf("Referenced %s not found: %q", refType, refValue)
}

// resolveHost turns a short host of namespace ns into its FQDN, as sidecars do: "reviews" in
// "demo" is reviews.demo.svc.cluster.local; a host with a dot is already one.
func resolveHost(host, ns string) string {
	if host == "" || host == "*" || strings.Contains(host, ".") || ns == "" {
		return host
	}
	return host + "." + ns + ".svc." + DomainSuffix
}

// hostMatches reports whether pattern (a host, or "*.suffix") covers host.
func hostMatches(pattern, host string) bool {
	if pattern == host || pattern == "*" {
		return true
	}
	suffix, ok := strings.CutPrefix(pattern, "*")
	return ok && strings.HasSuffix(host, suffix)
}
