package analyze

import (
	"fmt"
	"slices"
	"strings"

	networking "istio.io/api/networking/v1alpha3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"sailplane.dev/shared/config"
	"sailplane.dev/shared/gatewayapi"
	"sailplane.dev/shared/schema"
)

// gwAPI is the Gateway API objects of a Set, decoded, with the configs they were read from.
type gwAPI struct {
	in gatewayapi.Input
	// src is the config of each object, by "Kind/namespace/name".
	src map[string]config.Config
}

func srcKey(kind, ns, name string) string { return kind + "/" + ns + "/" + name }

// decodeGatewayAPI decodes the Set's Gateway API configs; one that does not decode is reported
// and left out.
func decodeGatewayAPI(s *Set) (*gwAPI, []Message) {
	g := &gwAPI{src: map[string]config.Config{}}
	var msgs []Message
	for _, c := range s.Configs {
		if c.Kind.Group != schema.GatewayAPIGroup {
			continue
		}
		r := c.Resource()
		obj, err := gatewayapi.DecodeAny(c.Kind, r)
		if err == nil && !g.in.Add(obj) {
			continue
		}
		if err != nil {
			// Decode's error names the object, as the message does already.
			text := strings.TrimPrefix(err.Error(), c.Kind.Kind+" "+r.Name+": ")
			text, isSpec := strings.CutPrefix(text, "spec: ")
			field := ""
			if isSpec {
				field = "spec"
			}
			msgs = append(msgs, about(c, Error, CodeSchemaValidationError, field, text))
			continue
		}
		g.src[srcKey(c.Kind.Kind, c.Namespace, c.Name)] = c
	}
	return g, msgs
}

// empty reports whether the Set has no Gateway API object to analyze.
func (g *gwAPI) empty() bool { return len(g.src) == 0 }

// gatewayAPI runs the Gateway API analyzers: parentRefs and backendRefs that name nothing,
// routes their parents do not accept (as Translate binds them), cross-namespace references
// without a ReferenceGrant, ReferenceGrants nothing uses, Gateways of another controller's class.
func gatewayAPI(s *Set) []Message {
	g, msgs := decodeGatewayAPI(s)
	if g.empty() {
		return msgs
	}
	g.in.DomainSuffix = DomainSuffix
	g.in.Services = newRegistry(s)
	out := gatewayapi.Translate(g.in)
	known := s.knownHost()
	grants := newGrantIndex(g.in.ReferenceGrants)

	msgs = append(msgs, g.classes()...)
	routes := g.routes()
	for _, r := range routes {
		c := g.src[srcKey(r.kind, r.ns, r.name)]
		msgs = append(msgs, g.parentRefs(s, c, r, known)...)
		for _, b := range r.backends {
			msgs = append(msgs, g.backendRef(c, r, b, known, grants)...)
		}
	}
	certMsgs, refused := g.certificateRefs(grants)
	msgs = append(msgs, certMsgs...)
	msgs = append(msgs, g.statusMessages(out.Status, routes, refused)...)
	msgs = append(msgs, g.unusedGrants(grants)...)
	// A condition Translate writes for each parent or ancestor is one problem of the object.
	return slices.Compact(Sort(msgs))
}

// classes: a Gateway of a class Sailplane does not serve is left to another controller, which
// is worth knowing when its routes seem to do nothing (Info).
func (g *gwAPI) classes() []Message {
	classes := map[string]*gwv1.GatewayClass{}
	for _, c := range g.in.GatewayClasses {
		classes[c.Name] = c
	}
	var msgs []Message
	for _, gw := range g.in.Gateways {
		name := string(gw.Spec.GatewayClassName)
		c, ok := classes[name]
		var text string
		switch {
		case !ok && name == gatewayapi.DefaultClassName:
			continue // istiod's class, served without a GatewayClass object
		case !ok:
			text = fmt.Sprintf("GatewayClass %q not found: Sailplane serves class %q and the classes of controller %s, so this Gateway and its routes are left to another controller.",
				name, gatewayapi.DefaultClassName, gatewayapi.ControllerName)
		case c.Spec.ControllerName == gatewayapi.ControllerName || c.Spec.ControllerName == gatewayapi.SailplaneControllerName:
			continue
		default:
			text = fmt.Sprintf("GatewayClass %q is of controller %s, not Sailplane's (%s): this Gateway and its routes are left to that controller.",
				name, c.Spec.ControllerName, gatewayapi.ControllerName)
		}
		msgs = append(msgs, about(g.src[srcKey(schema.KubernetesGateway.Kind, gw.Namespace, gw.Name)], Info, CodeGatewayClassNotServed, "spec.gatewayClassName", text))
	}
	return msgs
}

// route is what the analyzers read of a route of any kind.
type route struct {
	kind, ns, name string
	parents        []gwv1.ParentReference
	backends       []backendRef
}

// backendRef is one backend reference of a route, with its field path.
type backendRef struct {
	field string
	ref   gwv1.BackendObjectReference
}

func (g *gwAPI) routes() []route {
	var out []route
	// Both route kinds' filters mirror with the same filter type.
	mirrors := func(field string, m *gwv1.HTTPRequestMirrorFilter) []backendRef {
		if m == nil {
			return nil
		}
		return []backendRef{{field + ".requestMirror.backendRef", m.BackendRef}}
	}
	for _, r := range g.in.HTTPRoutes {
		rt := route{kind: schema.HTTPRoute.Kind, ns: r.Namespace, name: r.Name, parents: r.Spec.ParentRefs}
		for i, rule := range r.Spec.Rules {
			for k, f := range rule.Filters {
				rt.backends = append(rt.backends, mirrors(fmt.Sprintf("spec.rules[%d].filters[%d]", i, k), f.RequestMirror)...)
			}
			for j, b := range rule.BackendRefs {
				field := fmt.Sprintf("spec.rules[%d].backendRefs[%d]", i, j)
				rt.backends = append(rt.backends, backendRef{field, b.BackendObjectReference})
				for k, f := range b.Filters {
					rt.backends = append(rt.backends, mirrors(fmt.Sprintf("%s.filters[%d]", field, k), f.RequestMirror)...)
				}
			}
		}
		out = append(out, rt)
	}
	for _, r := range g.in.GRPCRoutes {
		rt := route{kind: schema.GRPCRoute.Kind, ns: r.Namespace, name: r.Name, parents: r.Spec.ParentRefs}
		for i, rule := range r.Spec.Rules {
			for k, f := range rule.Filters {
				rt.backends = append(rt.backends, mirrors(fmt.Sprintf("spec.rules[%d].filters[%d]", i, k), f.RequestMirror)...)
			}
			for j, b := range rule.BackendRefs {
				field := fmt.Sprintf("spec.rules[%d].backendRefs[%d]", i, j)
				rt.backends = append(rt.backends, backendRef{field, b.BackendObjectReference})
				for k, f := range b.Filters {
					rt.backends = append(rt.backends, mirrors(fmt.Sprintf("%s.filters[%d]", field, k), f.RequestMirror)...)
				}
			}
		}
		out = append(out, rt)
	}
	l4 := func(kind, ns, name string, parents []gwv1.ParentReference, rules [][]gwv1.BackendRef) route {
		rt := route{kind: kind, ns: ns, name: name, parents: parents}
		for i, refs := range rules {
			for j, b := range refs {
				rt.backends = append(rt.backends, backendRef{fmt.Sprintf("spec.rules[%d].backendRefs[%d]", i, j), b.BackendObjectReference})
			}
		}
		return rt
	}
	for _, r := range g.in.TCPRoutes {
		var rules [][]gwv1.BackendRef
		for _, rule := range r.Spec.Rules {
			rules = append(rules, rule.BackendRefs)
		}
		out = append(out, l4(schema.TCPRoute.Kind, r.Namespace, r.Name, r.Spec.ParentRefs, rules))
	}
	for _, r := range g.in.TLSRoutes {
		var rules [][]gwv1.BackendRef
		for _, rule := range r.Spec.Rules {
			rules = append(rules, rule.BackendRefs)
		}
		out = append(out, l4(schema.TLSRoute.Kind, r.Namespace, r.Name, r.Spec.ParentRefs, rules))
	}
	return out
}

// parentRefs: a route's parentRef must name a Gateway, ListenerSet, Service or ServiceEntry
// that exists (Istio's ReferencedResourceNotFound). A Service counts as existing as for
// destination hosts: in the registry, or a ServiceEntry host.
func (g *gwAPI) parentRefs(s *Set, c config.Config, r route, known func(string) bool) []Message {
	var msgs []Message
	for i, ref := range r.parents {
		group, kind := string(deref(ref.Group, gwv1.GroupName)), string(deref(ref.Kind, "Gateway"))
		ns := string(deref(ref.Namespace, gwv1.Namespace(r.ns)))
		var exists bool
		switch {
		case group == gwv1.GroupName && kind == "Gateway":
			_, exists = g.src[srcKey(schema.KubernetesGateway.Kind, ns, string(ref.Name))]
		case group == gwv1.GroupName && kind == "ListenerSet":
			_, exists = g.src[srcKey(schema.ListenerSet.Kind, ns, string(ref.Name))]
		case (group == "" || group == "core") && kind == "Service":
			exists = known == nil || known(fmt.Sprintf("%s.%s.svc.%s", ref.Name, ns, DomainSuffix))
		case group == "networking.istio.io" && kind == "ServiceEntry":
			exists = slices.ContainsFunc(of[*networking.ServiceEntry](s, schema.ServiceEntry), func(se typed[*networking.ServiceEntry]) bool {
				return se.Namespace == ns && se.Name == string(ref.Name)
			})
		default:
			continue // another controller's kind: not ours to judge
		}
		if !exists {
			msgs = append(msgs, about(c, Error, CodeReferencedResourceNotFound, fmt.Sprintf("spec.parentRefs[%d]", i),
				referencedNotFound("parent "+kind, ns+"/"+string(ref.Name))))
		}
	}
	return msgs
}

// backendRef: a backend must be a service that exists, as a VirtualService destination's host
// (Istio's ReferencedResourceNotFound), and one in another namespace needs a ReferenceGrant
// there; Translate refuses it otherwise, which istioctl reports as the route's negative
// ResolvedRefs condition (NegativeConditionStatus), here with the field at fault.
func (g *gwAPI) backendRef(c config.Config, r route, b backendRef, known func(string) bool, grants *grantIndex) []Message {
	group, kind := string(deref(b.ref.Group, "")), string(deref(b.ref.Kind, "Service"))
	ns := string(deref(b.ref.Namespace, gwv1.Namespace(r.ns)))
	var msgs []Message
	if ns != r.ns && !grants.allow(r.kind, r.ns, group, kind, ns, string(b.ref.Name)) {
		msgs = append(msgs, about(c, Warning, CodeNegativeConditionStatus, b.field, negativeCondition(string(gwv1.RouteConditionResolvedRefs),
			string(gwv1.RouteReasonRefNotPermitted), fmt.Sprintf("backendRef %s/%s not accessible to a %s in namespace %q (missing a ReferenceGrant?)", b.ref.Name, ns, r.kind, r.ns))))
	}
	var host, what string
	switch {
	case (group == "" || group == "core") && kind == "Service", group == "multicluster.x-k8s.io" && kind == "ServiceImport":
		if strings.Contains(string(b.ref.Name), ".") {
			return msgs // invalid: Translate's status says so
		}
		host, what = fmt.Sprintf("%s.%s.svc.%s", b.ref.Name, ns, DomainSuffix), ns+"/"+string(b.ref.Name)
	case group == "networking.istio.io" && kind == "Hostname":
		host, what = string(b.ref.Name), string(b.ref.Name)
	default:
		return msgs // an unsupported kind: Translate's status says so
	}
	if known != nil && !known(host) {
		msgs = append(msgs, about(c, Error, CodeReferencedResourceNotFound, b.field, referencedNotFound("backend "+kind, what)))
	}
	return msgs
}

// certificateRefs: a listener's certificate (or client CA) in another namespace needs a
// ReferenceGrant there, as a backendRef does. refused has the Gateways' listeners ("Kind/ns/name
// spec.listeners[i]") a reference of which is refused: what Translate's status says of them
// follows from that.
func (g *gwAPI) certificateRefs(grants *grantIndex) (msgs []Message, refused map[string]bool) {
	refused = map[string]bool{}
	check := func(c config.Config, fromKind, fromNs, field string, group, kind, ns, name string) {
		if ns == fromNs || grants.allow(fromKind, fromNs, group, kind, ns, name) {
			return
		}
		if l, _, ok := strings.Cut(field, ".tls."); ok {
			refused[srcKey(fromKind, c.Namespace, c.Name)+" "+l] = true
		}
		msgs = append(msgs, about(c, Warning, CodeNegativeConditionStatus, field, negativeCondition(string(gwv1.ListenerConditionResolvedRefs),
			string(gwv1.ListenerReasonRefNotPermitted), fmt.Sprintf("%s %s/%s not accessible to a %s in namespace %q (missing a ReferenceGrant?)", kind, ns, name, fromKind, fromNs))))
	}
	listener := func(c config.Config, fromKind, fromNs, field string, tls *gwv1.ListenerTLSConfig) {
		if tls == nil {
			return
		}
		for j, ref := range tls.CertificateRefs {
			check(c, fromKind, fromNs, fmt.Sprintf("%s.tls.certificateRefs[%d]", field, j), string(deref(ref.Group, "")),
				string(deref(ref.Kind, "Secret")), string(deref(ref.Namespace, gwv1.Namespace(fromNs))), string(ref.Name))
		}
	}
	validation := func(c config.Config, fromNs, field string, v *gwv1.FrontendTLSValidation) {
		if v == nil {
			return
		}
		for j, ref := range v.CACertificateRefs {
			check(c, schema.KubernetesGateway.Kind, fromNs, fmt.Sprintf("%s.validation.caCertificateRefs[%d]", field, j), string(ref.Group),
				string(ref.Kind), string(deref(ref.Namespace, gwv1.Namespace(fromNs))), string(ref.Name))
		}
	}
	for _, gw := range g.in.Gateways {
		c := g.src[srcKey(schema.KubernetesGateway.Kind, gw.Namespace, gw.Name)]
		for i, l := range gw.Spec.Listeners {
			listener(c, schema.KubernetesGateway.Kind, gw.Namespace, fmt.Sprintf("spec.listeners[%d]", i), l.TLS)
		}
		if tls := gw.Spec.TLS; tls != nil && tls.Frontend != nil {
			validation(c, gw.Namespace, "spec.tls.frontend.default", tls.Frontend.Default.Validation)
			for i, p := range tls.Frontend.PerPort {
				validation(c, gw.Namespace, fmt.Sprintf("spec.tls.frontend.perPort[%d].tls", i), p.TLS.Validation)
			}
		}
	}
	for _, ls := range g.in.ListenerSets {
		c := g.src[srcKey(schema.ListenerSet.Kind, ls.Namespace, ls.Name)]
		for i, l := range ls.Spec.Listeners {
			listener(c, schema.ListenerSet.Kind, ls.Namespace, fmt.Sprintf("spec.listeners[%d]", i), l.TLS)
		}
	}
	return msgs, refused
}

// statusMessages turns the negative conditions of the status Translate computes into Istio's
// NegativeConditionStatus, as istioctl analyze reports them from the objects' status: routes
// their parents do not accept (NotAllowedByListeners, NoMatchingListenerHostname, a port or
// sectionName no listener has …), listeners and Gateways that are not accepted. What the
// reference analyzers report with the field at fault is left out here: missing backends and
// parent Services, references without a ReferenceGrant. Programmed is left out too: it needs
// the Gateway's deployment, which files do not have.
func (g *gwAPI) statusMessages(statuses []gatewayapi.Status, routes []route, refused map[string]bool) []Message {
	parentRefs := map[string][]gwv1.ParentReference{}
	for _, r := range routes {
		parentRefs[srcKey(r.kind, r.ns, r.name)] = r.parents
	}
	var msgs []Message
	report := func(c config.Config, field string, conds []metav1.Condition, skip func(metav1.Condition) bool) {
		for _, cd := range conds {
			negative := cd.Status == metav1.ConditionFalse && (cd.Type == "Accepted" || cd.Type == "ResolvedRefs")
			if cd.Type == "Conflicted" && cd.Status == metav1.ConditionTrue {
				negative = true
			}
			if !negative || cd.Reason == string(gwv1.RouteReasonRefNotPermitted) || skip != nil && skip(cd) {
				continue
			}
			msgs = append(msgs, about(c, Warning, CodeNegativeConditionStatus, field, negativeCondition(cd.Type, cd.Reason, cd.Message)))
		}
	}
	routeParents := func(st gatewayapi.Status, parents []gwv1.RouteParentStatus) {
		c, ok := g.src[srcKey(st.Kind.Kind, st.Namespace, st.Name)]
		if !ok {
			return
		}
		refs := parentRefs[srcKey(st.Kind.Kind, st.Namespace, st.Name)]
		for _, p := range parents {
			field := "spec.parentRefs"
			if i := slices.IndexFunc(refs, func(r gwv1.ParentReference) bool { return sameParent(r, p.ParentRef, st.Namespace) }); i >= 0 {
				field = fmt.Sprintf("spec.parentRefs[%d]", i)
			}
			meshParent := deref(p.ParentRef.Kind, "Gateway") == "Service" || deref(p.ParentRef.Kind, "Gateway") == "ServiceEntry"
			report(c, field, p.Conditions, func(cd metav1.Condition) bool {
				return cd.Reason == string(gwv1.RouteReasonBackendNotFound) ||
					meshParent && cd.Reason == string(gwv1.RouteReasonNoMatchingParent)
			})
		}
	}
	// listeners reports a Gateway's or ListenerSet's conditions, and its listeners' but those of
	// a listener with a refused reference (reported with the reference).
	listeners := func(st gatewayapi.Status, conds []metav1.Condition, ls []listenerConditions) {
		c, ok := g.src[srcKey(st.Kind.Kind, st.Namespace, st.Name)]
		if !ok {
			return
		}
		field := "" // a Gateway's own conditions are about all of it
		if st.Kind.Kind == schema.ListenerSet.Kind {
			field = "spec.parentRef" // whether its Gateway takes it
		}
		report(c, field, conds, nil)
		names := g.listenerNames(st.Kind.Kind, st.Namespace, st.Name)
		for _, l := range ls {
			field := "spec.listeners"
			if i := slices.Index(names, l.name); i >= 0 {
				field = fmt.Sprintf("spec.listeners[%d]", i)
			}
			if !refused[srcKey(st.Kind.Kind, st.Namespace, st.Name)+" "+field] {
				report(c, field, l.conditions, nil)
			}
		}
	}
	for _, st := range statuses {
		switch v := st.Value.(type) {
		case *gwv1.HTTPRouteStatus:
			routeParents(st, v.Parents)
		case *gwv1.GRPCRouteStatus:
			routeParents(st, v.Parents)
		case *gwv1.TCPRouteStatus:
			routeParents(st, v.Parents)
		case *gwv1.TLSRouteStatus:
			routeParents(st, v.Parents)
		case *gwv1.GatewayStatus:
			var ls []listenerConditions
			for _, l := range v.Listeners {
				ls = append(ls, listenerConditions{l.Name, l.Conditions})
			}
			listeners(st, v.Conditions, ls)
		case *gwv1.ListenerSetStatus:
			var ls []listenerConditions
			for _, l := range v.Listeners {
				ls = append(ls, listenerConditions{l.Name, l.Conditions})
			}
			listeners(st, v.Conditions, ls)
		case *gwv1.PolicyStatus:
			c, ok := g.src[srcKey(st.Kind.Kind, st.Namespace, st.Name)]
			if !ok {
				continue
			}
			for _, a := range v.Ancestors {
				for _, cd := range a.Conditions {
					field := "spec"
					switch gwv1.PolicyConditionReason(cd.Reason) {
					case gwv1.PolicyReasonTargetNotFound, gwv1.PolicyReasonConflicted:
						field = "spec.targetRefs"
					case gwv1.PolicyConditionReason(gwv1.BackendTLSPolicyReasonInvalidKind), gwv1.PolicyConditionReason(gwv1.BackendTLSPolicyReasonInvalidCACertificateRef),
						gwv1.PolicyConditionReason(gwv1.BackendTLSPolicyReasonNoValidCACertificate):
						field = "spec.validation.caCertificateRefs"
					}
					report(c, field, []metav1.Condition{cd}, nil)
				}
			}
		}
	}
	return msgs
}

type listenerConditions struct {
	name       gwv1.SectionName
	conditions []metav1.Condition
}

func (g *gwAPI) listenerNames(kind, ns, name string) []gwv1.SectionName {
	var out []gwv1.SectionName
	if kind == schema.ListenerSet.Kind {
		for _, ls := range g.in.ListenerSets {
			if ls.Namespace == ns && ls.Name == name {
				for _, l := range ls.Spec.Listeners {
					out = append(out, l.Name)
				}
			}
		}
		return out
	}
	for _, gw := range g.in.Gateways {
		if gw.Namespace == ns && gw.Name == name {
			for _, l := range gw.Spec.Listeners {
				out = append(out, l.Name)
			}
		}
	}
	return out
}

// sameParent reports whether two parentRefs of a route in ns name the same parent and section.
func sameParent(a, b gwv1.ParentReference, ns string) bool {
	return deref(a.Group, gwv1.GroupName) == deref(b.Group, gwv1.GroupName) && deref(a.Kind, "Gateway") == deref(b.Kind, "Gateway") &&
		a.Name == b.Name && deref(a.Namespace, gwv1.Namespace(ns)) == deref(b.Namespace, gwv1.Namespace(ns)) &&
		deref(a.SectionName, "") == deref(b.SectionName, "") && deref(a.Port, 0) == deref(b.Port, 0)
}

// grantIndex answers which ReferenceGrant allows a reference, and remembers the grants used.
type grantIndex struct {
	grants []*gwv1.ReferenceGrant
	used   map[*gwv1.ReferenceGrant]bool
}

func newGrantIndex(grants []*gwv1.ReferenceGrant) *grantIndex {
	return &grantIndex{grants: grants, used: map[*gwv1.ReferenceGrant]bool{}}
}

// allow reports whether a ReferenceGrant of toNs lets a fromKind of the Gateway API in fromNs
// refer to the toGroup/toKind named name, and marks every grant that does as used.
func (x *grantIndex) allow(fromKind, fromNs, toGroup, toKind, toNs, name string) bool {
	ok := false
	for _, g := range x.grants {
		if g.Namespace != toNs {
			continue
		}
		from := slices.ContainsFunc(g.Spec.From, func(f gwv1.ReferenceGrantFrom) bool {
			return string(f.Group) == gwv1.GroupName && string(f.Kind) == fromKind && string(f.Namespace) == fromNs
		})
		to := slices.ContainsFunc(g.Spec.To, func(t gwv1.ReferenceGrantTo) bool {
			return string(t.Group) == toGroup && string(t.Kind) == toKind && (t.Name == nil || string(*t.Name) == name)
		})
		if from && to {
			x.used[g] = true
			ok = true
		}
	}
	return ok
}

// unusedGrants: a ReferenceGrant no reference needs allows what nobody asked for, or was meant
// for a reference that names another namespace, kind or name (Info: Istio has no such check).
func (g *gwAPI) unusedGrants(grants *grantIndex) []Message {
	var msgs []Message
	for _, rg := range grants.grants {
		if grants.used[rg] {
			continue
		}
		var from, to []string
		for _, f := range rg.Spec.From {
			from = append(from, fmt.Sprintf("%s in %s", f.Kind, f.Namespace))
		}
		for _, t := range rg.Spec.To {
			s := string(t.Kind)
			if t.Name != nil {
				s += " " + string(*t.Name)
			}
			to = append(to, s)
		}
		msgs = append(msgs, about(g.src[srcKey(schema.ReferenceGrant.Kind, rg.Namespace, rg.Name)], Info, CodeUnusedReferenceGrant, "spec",
			fmt.Sprintf("No cross-namespace reference uses this ReferenceGrant (from %s to %s): it can be removed, unless a reference meant to use it names another namespace, kind or name.",
				strings.Join(from, ", "), strings.Join(to, ", "))))
	}
	return msgs
}

// negativeCondition is Istio's NegativeConditionStatus text.
func negativeCondition(typ, reason, message string) string {
	return fmt.Sprintf("A condition with a negative status is present: type=%s, reason=%s, message=%s.", typ, reason, message)
}

// registry answers Translate's service lookups from the Set: its registry services and
// ServiceEntries.
type registry struct {
	byHost  map[string]gatewayapi.Service
	entries map[string][]string // ServiceEntry "namespace/name" → hosts
}

func newRegistry(s *Set) *registry {
	r := &registry{byHost: map[string]gatewayapi.Service{}, entries: map[string][]string{}}
	for _, svc := range s.Services {
		out := gatewayapi.Service{Hostname: svc.GetHostname(), Ready: true}
		for _, p := range svc.GetPorts() {
			out.Ports = append(out.Ports, gatewayapi.ServicePort{Name: p.GetName(), Number: p.GetNumber(), Protocol: p.GetProtocol()})
		}
		r.byHost[svc.GetHostname()] = out
	}
	for _, se := range of[*networking.ServiceEntry](s, schema.ServiceEntry) {
		for _, h := range se.spec.GetHosts() {
			out := gatewayapi.Service{Hostname: h, Addresses: se.spec.GetAddresses(), Ready: true}
			for _, p := range se.spec.GetPorts() {
				out.Ports = append(out.Ports, gatewayapi.ServicePort{Name: p.GetName(), Number: p.GetNumber(), Protocol: strings.ToUpper(p.GetProtocol())})
			}
			if _, dup := r.byHost[h]; !dup {
				r.byHost[h] = out
			}
		}
		r.entries[se.Namespace+"/"+se.Name] = se.spec.GetHosts()
	}
	return r
}

func (r *registry) Service(hostname, _ string) (gatewayapi.Service, bool) {
	svc, ok := r.byHost[hostname]
	return svc, ok
}

func (r *registry) ServiceEntryHosts(namespace, name string) ([]string, bool) {
	h, ok := r.entries[namespace+"/"+name]
	return h, ok
}

func deref[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}
