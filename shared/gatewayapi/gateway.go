package gatewayapi

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"sailplane.dev/shared/schema"
)

// listener is a Gateway listener routes may bind to (istiod's parentInfo).
type listener struct {
	// istioGateway is the generated Istio Gateway as routes name it, "<ns>/<name>".
	istioGateway string
	section      gwv1.SectionName
	port         gwv1.PortNumber
	protocol     gwv1.ProtocolType
	// hostname is the listener's, "" for any.
	hostname string
	// hosts are the Istio server hosts: "<namespace>/<hostname>" per allowed namespace.
	hosts []string
	kinds []gwv1.RouteGroupKind
	// attached counts the routes bound to it.
	attached int32
	// unserved: the listener is not programmed (bad TLS, unsupported protocol). As in istiod,
	// routes still bind to it and count in attachedRoutes, but it gets no Istio Gateway and
	// its routes no VirtualService.
	unserved bool
}

var (
	httpRouteKind = gwv1.RouteGroupKind{Group: ptr(gwv1.Group(gwv1.GroupName)), Kind: "HTTPRoute"}
	grpcRouteKind = gwv1.RouteGroupKind{Group: ptr(gwv1.Group(gwv1.GroupName)), Kind: "GRPCRoute"}
	tcpRouteKind  = gwv1.RouteGroupKind{Group: ptr(gwv1.Group(gwv1.GroupName)), Kind: "TCPRoute"}
	tlsRouteKind  = gwv1.RouteGroupKind{Group: ptr(gwv1.Group(gwv1.GroupName)), Kind: "TLSRoute"}
)

func ptr[T any](v T) *T { return &v }

func (t *translator) gateways() {
	sets := sortObjects(t.in.ListenerSets)
	for _, gw := range sortObjects(t.in.Gateways) {
		if !t.ours[string(gw.Spec.GatewayClassName)] {
			continue // another controller's, or no class: not ours to report on
		}
		var attached, eligible []*gwv1.ListenerSet
		for _, ls := range sets {
			p := ls.Spec.ParentRef
			if deref(p.Group, gwv1.GroupName) == gwv1.GroupName && deref(p.Kind, "Gateway") == "Gateway" && string(p.Name) == gw.Name &&
				string(deref(p.Namespace, gwv1.Namespace(ls.Namespace))) == gw.Namespace {
				attached = append(attached, ls)
				if t.listenerSetAllowed(gw, ls.Namespace) {
					eligible = append(eligible, ls)
				}
			}
		}
		t.gateway(gw, attached, eligible)
	}
}

// listenerSetAllowed is the Gateway's allowedListeners for a ListenerSet of namespace ns (none
// by default).
func (t *translator) listenerSetAllowed(gw *gwv1.Gateway, ns string) bool {
	al := gw.Spec.AllowedListeners
	if al == nil || al.Namespaces == nil {
		return false
	}
	switch deref(al.Namespaces.From, gwv1.NamespacesFromSelector) {
	case gwv1.NamespacesFromAll:
		return true
	case gwv1.NamespacesFromSame:
		return ns == gw.Namespace
	case gwv1.NamespacesFromSelector:
		if al.Namespaces.Selector == nil {
			return false
		}
		sel, err := metav1.LabelSelectorAsSelector(al.Namespaces.Selector)
		nl, known := t.namespaces[ns]
		if err != nil || !known {
			return false
		}
		lb := map[string]string{"kubernetes.io/metadata.name": ns}
		for k, v := range nl {
			lb[k] = v
		}
		return sel.Matches(labels.Set(lb))
	}
	return false
}

// managed reports whether Sailplane deploys the Gateway (no addresses, or one IP), as istiod.
func managed(gw *gwv1.Gateway) bool {
	a := gw.Spec.Addresses
	return len(a) == 0 || (len(a) == 1 && (a[0].Type == nil || *a[0].Type == gwv1.IPAddressType))
}

// serviceHosts are the hostnames of the Services the Gateway's pods are behind: the automated
// deployment's "<name>-<class>", or those its Hostname addresses name.
func (t *translator) serviceHosts(gw *gwv1.Gateway) ([]string, *configError) {
	if managed(gw) {
		return []string{fmt.Sprintf("%s-%s.%s.svc.%s", gw.Name, gw.Spec.GatewayClassName, gw.Namespace, t.domain)}, nil
	}
	var hosts, skipped []string
	for _, a := range gw.Spec.Addresses {
		if a.Type != nil && *a.Type != gwv1.HostnameAddressType {
			skipped = append(skipped, a.Value)
			continue
		}
		h := a.Value
		if !strings.Contains(h, ".") {
			h = fmt.Sprintf("%s.%s.svc.%s", h, gw.Namespace, t.domain)
		}
		hosts = append(hosts, h)
	}
	if len(skipped) > 0 {
		return hosts, errorf(string(gwv1.GatewayReasonUnsupportedAddress), "only Hostname is supported, ignoring %v", skipped)
	}
	return hosts, nil
}

// ManualGatewayHosts are the hostnames of the Services a manually deployed Gateway (addresses
// naming Services) runs behind, nil for an automated one: its Istio Gateways select those
// Services' pods, so a registry deriving Service.Selector from endpoints re-translates when they
// change.
func ManualGatewayHosts(gw *gwv1.Gateway, domain string) []string {
	if managed(gw) {
		return nil
	}
	t := &translator{domain: cmp.Or(domain, "cluster.local")}
	hosts, _ := t.serviceHosts(gw)
	return hosts
}

// selector picks the gateway's pods: the automated deployment's label, or the pods of the
// Service a manual Gateway names (its selector, where the registry knows it).
func (t *translator) selector(gw *gwv1.Gateway, hosts []string) map[string]string {
	if !managed(gw) && t.in.Services != nil {
		for _, h := range hosts {
			if svc, ok := t.in.Services.Service(h, gw.Namespace); ok && len(svc.Selector) > 0 {
				return svc.Selector
			}
		}
	}
	return map[string]string{GatewayNameLabel: gw.Name}
}

// owner is a Gateway or a ListenerSet, whose listeners become Istio Gateways in its namespace.
type owner struct {
	kind string // "Gateway" or "ListenerSet", as ReferenceGrants name it
	obj  object
	// gateway is the Gateway itself, or the ListenerSet's parent: its class, addresses and
	// frontend TLS apply.
	gateway *gwv1.Gateway
}

// builtListener is one listener's outcome.
type builtListener struct {
	name       gwv1.SectionName
	kinds      []gwv1.RouteGroupKind
	conditions []metav1.Condition
	bound      *listener // nil when routes cannot bind to it
}

// buildListeners makes the Istio Gateway of each listener (one server each, so routes can bind
// to one listener), with its status; valid counts the programmed ones, ports those istiod names
// in the Programmed message.
func (t *translator) buildListeners(o owner, ls []gwv1.Listener, conflicts map[gwv1.SectionName]gwv1.ListenerConditionReason,
	sel map[string]string) (out []builtListener, valid int, ports []uint32) {
	gen := o.obj.GetGeneration()
	for i := range ls {
		l := &ls[i]
		kinds, kindsOK := supportedKinds(l)
		conds := map[string]metav1.Condition{
			string(gwv1.ListenerConditionAccepted):     cond(string(gwv1.ListenerConditionAccepted), true, string(gwv1.ListenerReasonAccepted), "No errors found", gen),
			string(gwv1.ListenerConditionProgrammed):   cond(string(gwv1.ListenerConditionProgrammed), true, string(gwv1.ListenerReasonProgrammed), "No errors found", gen),
			string(gwv1.ListenerConditionConflicted):   cond(string(gwv1.ListenerConditionConflicted), false, string(gwv1.ListenerReasonNoConflicts), "No errors found", gen),
			string(gwv1.ListenerConditionResolvedRefs): cond(string(gwv1.ListenerConditionResolvedRefs), true, string(gwv1.ListenerReasonResolvedRefs), "No errors found", gen),
		}
		set := func(typ string, ok bool, reason, msg string) { conds[typ] = cond(typ, ok, reason, msg, gen) }
		if !kindsOK {
			set(string(gwv1.ListenerConditionResolvedRefs), false, string(gwv1.ListenerReasonInvalidRouteKinds), "Invalid route kinds")
		}
		var server *networking.Server
		unserved := false
		if reason, ok := conflicts[l.Name]; ok {
			msg := "Listener has a conflict with another listener attached to the same Gateway"
			set(string(gwv1.ListenerConditionAccepted), false, string(reason), msg)
			set(string(gwv1.ListenerConditionProgrammed), false, string(reason), msg)
			set(string(gwv1.ListenerConditionConflicted), true, string(reason), msg)
			if kindsOK {
				delete(conds, string(gwv1.ListenerConditionResolvedRefs)) // istiod reports the conflict alone
			}
		} else {
			var ok bool
			server, ok = t.server(o, l, set)
			if ok {
				valid++
			}
			unserved = !ok
			// The Programmed message names every port istiod makes a server for, valid or not.
			if l.TLS != nil || (l.Protocol != gwv1.HTTPSProtocolType && l.Protocol != gwv1.TLSProtocolType) {
				ports = append(ports, uint32(l.Port))
			}
		}
		b := builtListener{name: l.Name, kinds: kinds, conditions: sortedConditions(conds)}
		if server != nil {
			name := o.obj.GetName() + "~" + internalGatewaySuffix + "~" + string(l.Name)
			ns := o.obj.GetNamespace()
			if !unserved {
				t.out.Gateways = append(t.out.Gateways, Config[*networking.Gateway]{Namespace: ns, Name: name,
					CreateTime: o.obj.GetCreationTimestamp().Time,
					Spec:       &networking.Gateway{Servers: []*networking.Server{server}, Selector: sel}})
			}
			b.bound = &listener{istioGateway: ns + "/" + name, section: l.Name, port: l.Port, protocol: l.Protocol,
				hostname: string(deref(l.Hostname, "")), hosts: server.Hosts, kinds: kinds, unserved: unserved}
			k := o.kind + "/" + key(ns, o.obj.GetName())
			t.listeners[k] = append(t.listeners[k], b.bound)
		}
		out = append(out, b)
	}
	return out, valid, ports
}

func (b builtListener) attached() int32 {
	if b.bound == nil {
		return 0
	}
	return b.bound.attached
}

func (t *translator) gateway(gw *gwv1.Gateway, attached, eligible []*gwv1.ListenerSet) {
	gen := gw.Generation
	st := &gwv1.GatewayStatus{}
	t.out.Status = append(t.out.Status, Status{Kind: schema.KubernetesGateway, Namespace: gw.Namespace, Name: gw.Name,
		Generation: gen, Value: st})

	hosts, gwErr := t.serviceHosts(gw)
	sel := t.selector(gw, hosts)
	conflicts := listenerConflicts(gw, eligible)
	// Addresses that name no Service leave nothing to program (istiod's short circuit).
	hardFail := gwErr != nil && len(hosts) == 0
	var built []builtListener
	var valid int
	var ports []uint32
	if !hardFail {
		built, valid, ports = t.buildListeners(owner{kind: "Gateway", obj: gw, gateway: gw}, gw.Spec.Listeners,
			conflicts[key(gw.Namespace, gw.Name)], sel)
	}
	t.finalize = append(t.finalize, func() {
		for _, b := range built {
			st.Listeners = append(st.Listeners, gwv1.ListenerStatus{Name: b.name, SupportedKinds: b.kinds,
				AttachedRoutes: b.attached(), Conditions: b.conditions})
		}
	})

	conds := map[string]metav1.Condition{
		string(gwv1.GatewayConditionAccepted):     cond(string(gwv1.GatewayConditionAccepted), true, string(gwv1.GatewayReasonAccepted), "Resource accepted", gen),
		string(gwv1.GatewayConditionResolvedRefs): cond(string(gwv1.GatewayConditionResolvedRefs), true, string(gwv1.GatewayReasonResolvedRefs), "All references resolved", gen),
	}
	switch n := len(gw.Spec.Listeners); {
	case gwErr != nil:
		conds[string(gwv1.GatewayConditionAccepted)] = cond(string(gwv1.GatewayConditionAccepted), false, gwErr.Reason, gwErr.Message, gen)
	case n > 0 && valid == 0:
		conds[string(gwv1.GatewayConditionAccepted)] = cond(string(gwv1.GatewayConditionAccepted), false,
			string(gwv1.GatewayReasonListenersNotValid), "None of the Gateway's listeners are valid", gen)
	case valid < n:
		conds[string(gwv1.GatewayConditionAccepted)] = cond(string(gwv1.GatewayConditionAccepted), true,
			string(gwv1.GatewayReasonListenersNotValid), "One or more of the Gateway's listeners are invalid", gen)
	}

	// The ListenerSets the Gateway does not allow say so; the others add their listeners.
	var setPorts []uint32
	sets := int32(0)
	for _, ls := range attached {
		if !slices.Contains(eligible, ls) {
			t.listenerSetNotAllowed(ls)
			continue
		}
		p, ok := t.listenerSet(ls, gw, hosts, gwErr, hardFail, sel, conflicts[key(ls.Namespace, ls.Name)])
		setPorts = append(setPorts, p...)
		if ok {
			sets++
		}
	}
	if sets > 0 {
		st.AttachedListenerSets = ptr(sets)
	}
	prog, addrs := t.programmed(gw, hosts, append(ports, setPorts...))
	conds[string(gwv1.GatewayConditionProgrammed)] = prog
	st.Addresses = addrs
	st.Conditions = sortedConditions(conds)
}

func (t *translator) listenerSetStatus(ls *gwv1.ListenerSet) *gwv1.ListenerSetStatus {
	st := &gwv1.ListenerSetStatus{}
	t.out.Status = append(t.out.Status, Status{Kind: schema.ListenerSet, Namespace: ls.Namespace, Name: ls.Name,
		Generation: ls.Generation, Value: st})
	return st
}

func (t *translator) listenerSetNotAllowed(ls *gwv1.ListenerSet) {
	st := t.listenerSetStatus(ls)
	msg := "The parent Gateway does not allow this reference; check the 'spec.allowedRoutes'"
	st.Conditions = []metav1.Condition{
		cond(string(gwv1.ListenerSetConditionAccepted), false, string(gwv1.ListenerSetReasonNotAllowed), msg, ls.Generation),
		cond(string(gwv1.ListenerSetConditionProgrammed), false, string(gwv1.ListenerSetReasonNotAllowed), msg, ls.Generation),
	}
}

// listenerSet builds an allowed ListenerSet's listeners on its parent Gateway's pods (ports
// default to 80 for HTTP, 443 for HTTPS); ok reports whether any is valid.
func (t *translator) listenerSet(ls *gwv1.ListenerSet, gw *gwv1.Gateway, hosts []string, gwErr *configError, hardFail bool,
	sel map[string]string, conflicts map[gwv1.SectionName]gwv1.ListenerConditionReason) (ports []uint32, ok bool) {
	st := t.listenerSetStatus(ls)
	gen := ls.Generation
	var built []builtListener
	valid := 0
	if !hardFail {
		listeners := make([]gwv1.Listener, len(ls.Spec.Listeners))
		for i, e := range ls.Spec.Listeners {
			listeners[i] = gwv1.Listener(e)
			listeners[i].Port = entryPort(e)
		}
		built, valid, ports = t.buildListeners(owner{kind: "ListenerSet", obj: ls, gateway: gw}, listeners, conflicts, sel)
	}
	t.finalize = append(t.finalize, func() {
		for _, b := range built {
			st.Listeners = append(st.Listeners, gwv1.ListenerEntryStatus{Name: b.name, SupportedKinds: b.kinds,
				AttachedRoutes: b.attached(), Conditions: b.conditions})
		}
	})
	accepted := cond(string(gwv1.ListenerSetConditionAccepted), true, string(gwv1.ListenerSetReasonAccepted), "Resource accepted", gen)
	notValid := "None of the ListenerSet's listeners are valid"
	switch {
	case gwErr != nil:
		accepted = cond(string(gwv1.ListenerSetConditionAccepted), false, gwErr.Reason, "Parent not accepted: "+gwErr.Message, gen)
	case valid == 0:
		accepted = cond(string(gwv1.ListenerSetConditionAccepted), false, string(gwv1.ListenerSetReasonListenersNotValid), notValid, gen)
	}
	prog, _ := t.programmed(gw, hosts, ports)
	prog.ObservedGeneration = gen
	if valid == 0 && !hardFail {
		prog = cond(string(gwv1.ListenerSetConditionProgrammed), false, string(gwv1.ListenerSetReasonListenersNotValid), notValid, gen)
	}
	st.Conditions = sortedConditions(map[string]metav1.Condition{accepted.Type: accepted, prog.Type: prog})
	return ports, valid > 0
}

// entryPort is a ListenerSet listener's port: as written, else the protocol's default.
func entryPort(e gwv1.ListenerEntry) gwv1.PortNumber {
	if e.Port != 0 {
		return e.Port
	}
	switch e.Protocol {
	case gwv1.HTTPProtocolType:
		return 80
	case gwv1.HTTPSProtocolType:
		return 443
	}
	return 0
}

// programmed is the Gateway's Programmed condition, and its addresses: istiod's
// ResolveGatewayInstances, from the registry. The service must exist and have endpoints.
func (t *translator) programmed(gw *gwv1.Gateway, hosts []string, ports []uint32) (metav1.Condition, []gwv1.GatewayStatusAddress) {
	typ, gen := string(gwv1.GatewayConditionProgrammed), gw.Generation
	if len(hosts) == 0 {
		return cond(typ, false, string(gwv1.GatewayReasonUnsupportedAddress), "Failed to assign to any requested addresses", gen), nil
	}
	ports = slices.Clone(ports)
	slices.Sort(ports)
	ports = slices.Compact(ports)
	var internal, internalIPs, external, pending, warnings []string
	usable := true
	for _, h := range hosts {
		var svc Service
		ok := false
		if t.in.Services != nil {
			svc, ok = t.in.Services.Service(h, gw.Namespace)
		}
		if !ok {
			warnings = append(warnings, fmt.Sprintf("hostname %q not found", h))
			usable = false
			continue
		}
		for _, p := range ports {
			switch {
			case !svc.Ready:
				// istiod looks for instances first: none at all says so, whatever the port.
				warnings = append(warnings, fmt.Sprintf("no instances found for hostname %q", h))
			case !slices.ContainsFunc(svc.Ports, func(sp ServicePort) bool { return sp.Number == p }):
				warnings = append(warnings, fmt.Sprintf("port %d not found for hostname %q", p, h))
				usable = false
			default:
				internal = append(internal, h+":"+strconv.Itoa(int(p)))
				internalIPs = append(internalIPs, svc.Addresses...)
				external = append(external, svc.ExternalAddresses...)
				if svc.LoadBalancer && len(svc.ExternalAddresses) == 0 && !slices.Contains(pending, h) {
					warnings = append(warnings, fmt.Sprintf("address pending for hostname %q", h))
					pending = append(pending, h)
				}
			}
		}
	}
	internal, internalIPs, external = sortedSet(internal), sortedSet(internalIPs), sortedSet(external)
	slices.Sort(warnings)
	out := statusAddresses(gw, internal, internalIPs, external, pending)
	if len(warnings) > 0 {
		msg := "Failed to assign to any requested addresses: " + strings.Join(warnings, "; ")
		if len(internal) > 0 {
			msg = fmt.Sprintf("Assigned to service(s) %s, but failed to assign to all requested addresses: %s",
				humanJoin(internal), strings.Join(warnings, "; "))
		}
		reason := gwv1.GatewayReasonAddressNotAssigned
		if !usable {
			reason = gwv1.GatewayReasonAddressNotUsable
		}
		return cond(typ, false, string(reason), msg, gen), out
	}
	msg := "Resource programmed"
	if len(internal) > 0 {
		msg = "Resource programmed, assigned to service(s) " + humanJoin(internal)
	}
	return cond(typ, true, string(gwv1.GatewayReasonProgrammed), msg, gen), out
}

// addressTypeAnnotation makes a Gateway report the cluster IPs of its Service (IPAddress), its
// host name (Hostname, the default of class istio) or both (any other value), when the Service
// has no external address: istiod's override.
const addressTypeAnnotation = "networking.istio.io/address-type"

// statusAddresses are a Gateway's status.addresses, as istiod reports them: the external
// addresses of its Services (sorted) if any, else their host names (those whose LoadBalancer
// address is not pending), or with the annotation their cluster IPs first. None before the
// Service is usable.
func statusAddresses(gw *gwv1.Gateway, internal, internalIPs, external, pending []string) []gwv1.GatewayStatusAddress {
	addrs := external
	if len(addrs) == 0 {
		want := gwv1.HostnameAddressType
		if v, ok := gw.Annotations[addressTypeAnnotation]; ok {
			want = gwv1.AddressType(v)
		}
		if want != gwv1.HostnameAddressType {
			addrs = slices.Clone(internalIPs)
		}
		if want != gwv1.IPAddressType {
			for _, hp := range internal {
				h := hp[:strings.LastIndexByte(hp, ':')]
				if !slices.Contains(pending, h) && !slices.Contains(addrs, h) {
					addrs = append(addrs, h)
				}
			}
		}
	}
	var out []gwv1.GatewayStatusAddress
	for _, a := range addrs {
		typ := gwv1.HostnameAddressType
		if _, err := netip.ParseAddr(a); err == nil {
			typ = gwv1.IPAddressType
		}
		out = append(out, gwv1.GatewayStatusAddress{Type: &typ, Value: a})
	}
	return out
}

func sortedSet(ss []string) []string {
	ss = slices.Clone(ss)
	slices.Sort(ss)
	return slices.Compact(ss)
}

func humanJoin(ss []string) string {
	switch len(ss) {
	case 0:
		return ""
	case 1:
		return ss[0]
	case 2:
		return ss[0] + " and " + ss[1]
	}
	return strings.Join(ss[:len(ss)-1], ", ") + ", and " + ss[len(ss)-1]
}

// listenerConflicts finds, among a Gateway's listeners and then its allowed ListenerSets' (oldest
// first), those that clash with an earlier accepted one on the same port, as istiod: HTTP, HTTPS
// and TLS share a port unless their hostnames are equal; TCP shares it with nothing. Keyed by
// owner namespace/name, then listener.
func listenerConflicts(gw *gwv1.Gateway, sets []*gwv1.ListenerSet) map[string]map[gwv1.SectionName]gwv1.ListenerConditionReason {
	type entry struct {
		owner string
		l     gwv1.Listener
	}
	var all []entry
	for _, l := range gw.Spec.Listeners {
		all = append(all, entry{key(gw.Namespace, gw.Name), l})
	}
	for _, ls := range sets {
		for _, e := range ls.Spec.Listeners {
			l := gwv1.Listener(e)
			l.Port = entryPort(e)
			all = append(all, entry{key(ls.Namespace, ls.Name), l})
		}
	}
	httpLike := func(p gwv1.ProtocolType) bool {
		return p == gwv1.HTTPProtocolType || p == gwv1.HTTPSProtocolType || p == gwv1.TLSProtocolType
	}
	l4 := func(p gwv1.ProtocolType) bool { return p == gwv1.TCPProtocolType || p == gwv1.UDPProtocolType }
	host := func(l gwv1.Listener) string { return cmp.Or(string(deref(l.Hostname, "")), "*") }
	distinct := func(a, b gwv1.Listener) bool {
		switch {
		case a.Port != b.Port:
			return true
		case l4(a.Protocol) && (httpLike(b.Protocol) || l4(b.Protocol)), httpLike(a.Protocol) && l4(b.Protocol):
			return false
		case httpLike(a.Protocol) && httpLike(b.Protocol):
			return host(a) != host(b)
		}
		return a.Protocol != b.Protocol
	}
	out := map[string]map[gwv1.SectionName]gwv1.ListenerConditionReason{}
	var accepted []gwv1.Listener
	for _, e := range all {
		i := slices.IndexFunc(accepted, func(p gwv1.Listener) bool { return !distinct(e.l, p) })
		if i < 0 {
			accepted = append(accepted, e.l)
			continue
		}
		reason := gwv1.ListenerReasonHostnameConflict
		if (l4(e.l.Protocol) && l4(accepted[i].Protocol)) || e.l.Protocol != accepted[i].Protocol {
			reason = gwv1.ListenerReasonProtocolConflict
		}
		if out[e.owner] == nil {
			out[e.owner] = map[gwv1.SectionName]gwv1.ListenerConditionReason{}
		}
		out[e.owner][e.l.Name] = reason
	}
	return out
}

// supportedKinds are the route kinds a listener takes, and whether all its allowedRoutes kinds
// are among them.
func supportedKinds(l *gwv1.Listener) ([]gwv1.RouteGroupKind, bool) {
	supported := []gwv1.RouteGroupKind{}
	switch l.Protocol {
	case gwv1.HTTPProtocolType, gwv1.HTTPSProtocolType:
		supported = []gwv1.RouteGroupKind{httpRouteKind, grpcRouteKind}
	case gwv1.TCPProtocolType:
		supported = []gwv1.RouteGroupKind{tcpRouteKind}
	case gwv1.TLSProtocolType:
		supported = []gwv1.RouteGroupKind{tlsRouteKind}
		if l.TLS != nil && deref(l.TLS.Mode, gwv1.TLSModeTerminate) == gwv1.TLSModeTerminate {
			supported = append(supported, tcpRouteKind)
		}
	}
	if l.AllowedRoutes == nil || len(l.AllowedRoutes.Kinds) == 0 {
		return supported, true
	}
	var out []gwv1.RouteGroupKind
	for _, s := range supported {
		if slices.ContainsFunc(l.AllowedRoutes.Kinds, func(k gwv1.RouteGroupKind) bool {
			return k.Kind == s.Kind && deref(k.Group, gwv1.GroupName) == *s.Group
		}) {
			out = append(out, s)
		}
	}
	if out == nil {
		out = []gwv1.RouteGroupKind{}
	}
	return out, len(out) == len(l.AllowedRoutes.Kinds)
}

// server is the Istio server of a listener; ok false when the listener is not programmed. A
// listener whose TLS cannot be set up gets no server at all: it is never served weaker.
func (t *translator) server(o owner, l *gwv1.Listener, set func(typ string, ok bool, reason, msg string)) (*networking.Server, bool) {
	var proto string
	switch l.Protocol {
	case gwv1.HTTPProtocolType, gwv1.HTTPSProtocolType, gwv1.TLSProtocolType, gwv1.TCPProtocolType:
		proto = string(l.Protocol)
	default:
		msg := fmt.Sprintf("protocol %q is unsupported", l.Protocol)
		if up := strings.ToUpper(string(l.Protocol)); up != string(l.Protocol) && slices.Contains([]string{"HTTP", "HTTPS", "TLS", "TCP"}, up) {
			msg = fmt.Sprintf("protocol %q is unsupported. hint: %q (uppercase) may be supported", l.Protocol, up)
		}
		// istiod leaves Programmed as it is: the listener is not accepted. Routes still bind
		// to it (and are counted), as in istiod; it is never served.
		set(string(gwv1.ListenerConditionAccepted), false, string(gwv1.ListenerReasonUnsupportedProtocol), msg)
		return &networking.Server{Hosts: t.serverHosts(o.obj.GetNamespace(), l)}, false
	}
	tls, err := t.tls(o, l)
	if err != nil {
		set(string(gwv1.ListenerConditionResolvedRefs), false, err.Reason, err.Message)
		set(string(gwv1.ListenerConditionProgrammed), false, string(gwv1.ListenerReasonInvalid), "Bad TLS configuration")
		switch gwv1.ListenerConditionReason(err.Reason) {
		case gwv1.ListenerReasonRefNotPermitted, gwv1.ListenerReasonInvalidCACertificateRef, gwv1.ListenerReasonInvalidCACertificateKind:
			set(string(gwv1.ListenerConditionAccepted), false, string(gwv1.ListenerReasonNoValidCACertificate), err.Message)
		}
		// No TLS settings at all: the server only lets routes bind (and be counted), as in
		// istiod; it is never served, so never served weaker.
		return &networking.Server{Hosts: t.serverHosts(o.obj.GetNamespace(), l)}, false
	}
	if tls == nil && (l.Protocol == gwv1.HTTPSProtocolType || l.Protocol == gwv1.TLSProtocolType) {
		if o.kind == "ListenerSet" {
			msg := fmt.Sprintf("protocol is %s but no TLS section is defined", l.Protocol)
			set(string(gwv1.ListenerConditionAccepted), false, string(gwv1.ListenerReasonUnsupportedProtocol), msg)
			set(string(gwv1.ListenerConditionProgrammed), false, string(gwv1.ListenerReasonInvalid), "Bad TLS configuration")
			return nil, false
		}
		return nil, true // a Gateway's placeholder for ListenerSets' TLS listeners, as istiod: no server
	}
	return &networking.Server{
		Port:  &networking.Port{Name: "default", Number: uint32(l.Port), Protocol: proto},
		Hosts: t.serverHosts(o.obj.GetNamespace(), l),
		Tls:   tls,
	}, true
}

// serverHosts are the listener's hostname for each namespace its routes may come from.
func (t *translator) serverHosts(ns string, l *gwv1.Listener) []string {
	h := string(deref(l.Hostname, "*"))
	var nss []string
	from := gwv1.NamespacesFromSame
	if l.AllowedRoutes != nil && l.AllowedRoutes.Namespaces != nil && l.AllowedRoutes.Namespaces.From != nil {
		from = *l.AllowedRoutes.Namespaces.From
	}
	switch from {
	case gwv1.NamespacesFromAll:
		nss = []string{"*"}
	case gwv1.NamespacesFromSelector:
		sel := l.AllowedRoutes.Namespaces.Selector
		if sel == nil {
			nss = []string{"*"}
			break
		}
		s, err := metav1.LabelSelectorAsSelector(sel)
		if err != nil {
			break
		}
		for _, name := range slices.Sorted(mapsKeys(t.namespaces)) {
			lb := map[string]string{"kubernetes.io/metadata.name": name}
			for k, v := range t.namespaces[name] {
				lb[k] = v
			}
			if s.Matches(labels.Set(lb)) {
				nss = append(nss, name)
			}
		}
	default:
		nss = []string{ns}
	}
	if len(nss) == 0 {
		return []string{"~/" + h} // matches no route, but the server (and its status) exists
	}
	out := make([]string, len(nss))
	for i, n := range nss {
		out[i] = n + "/" + h
	}
	return out
}

// tls is the server TLS of a listener, istiod's buildTLS: certificateRefs become
// "kubernetes-gateway://<ns>/<name>" credentials; another namespace's Secret needs a
// ReferenceGrant.
func (t *translator) tls(o owner, l *gwv1.Listener) (*networking.ServerTLSSettings, *configError) {
	ownNs := o.obj.GetNamespace()
	if l.TLS == nil {
		return nil, nil
	}
	out := &networking.ServerTLSSettings{}
	switch deref(l.TLS.Mode, gwv1.TLSModeTerminate) {
	case gwv1.TLSModePassthrough:
		out.Mode = networking.ServerTLSSettings_PASSTHROUGH
		out.CipherSuites = cipherSuites(l.TLS.Options[cipherSuitesOption])
		return out, nil
	case gwv1.TLSModeTerminate:
	default:
		return nil, errorf(string(gwv1.ListenerReasonInvalidCertificateRef), "unknown TLS mode %q", *l.TLS.Mode)
	}
	out.Mode = networking.ServerTLSSettings_SIMPLE
	switch l.TLS.Options[tlsModeOption] {
	case "MUTUAL":
		out.Mode = networking.ServerTLSSettings_MUTUAL
	case "OPTIONAL_MUTUAL":
		out.Mode = networking.ServerTLSSettings_OPTIONAL_MUTUAL
	case "ISTIO_MUTUAL":
		out.Mode = networking.ServerTLSSettings_ISTIO_MUTUAL
		return out, nil
	case "ISTIO_SIMPLE":
		// The workload's own certificate, as istiod's "builtin://".
		out.CredentialName = "builtin://"
		return out, nil
	}
	if len(l.TLS.CertificateRefs) > 2 {
		return nil, errorf(string(gwv1.ListenerReasonInvalidCertificateRef), "TLS mode can only support up to 2 server certificates")
	}
	var creds []string
	var errs []string
	reason := ""
	for _, ref := range l.TLS.CertificateRefs {
		ns := string(deref(ref.Namespace, gwv1.Namespace(ownNs)))
		if deref(ref.Group, "") != "" || deref(ref.Kind, "Secret") != "Secret" {
			reason = string(gwv1.ListenerReasonInvalidCertificateRef)
			errs = append(errs, fmt.Sprintf("invalid certificate reference %s/%s/%s.%s, only secret is allowed",
				deref(ref.Group, ""), deref(ref.Kind, ""), ref.Name, deref(ref.Namespace, "")))
			continue
		}
		if ns != ownNs && !t.allowed(o.kind, ownNs, "", "Secret", ns, string(ref.Name)) {
			reason = string(gwv1.ListenerReasonRefNotPermitted)
			errs = append(errs, fmt.Sprintf("certificateRef %s/%s not accessible to a Gateway in namespace %q (missing a ReferenceGrant?)",
				ref.Name, ns, ownNs))
			continue
		}
		if sec, ok := t.in.Services.(Secrets); ok {
			if err := sec.Certificate("Secret", ns, string(ref.Name), false); err != nil {
				reason = string(gwv1.ListenerReasonInvalidCertificateRef)
				errs = append(errs, fmt.Sprintf("invalid certificate reference /Secret/%s.%s, %v", ref.Name, deref(ref.Namespace, ""), err))
				continue
			}
		}
		creds = append(creds, CredentialPrefix+ns+"/"+string(ref.Name))
	}
	if len(creds) == 0 {
		if len(errs) == 0 {
			return nil, errorf(string(gwv1.ListenerReasonInvalidCertificateRef), "TLS termination needs a certificateRef")
		}
		return nil, &configError{Reason: reason, Message: strings.Join(errs, "; ")}
	}
	if len(creds) == 1 {
		out.CredentialName = creds[0]
	} else {
		out.CredentialNames = creds
	}
	if v := frontendValidation(o.gateway, l.Port); v != nil && len(v.CACertificateRefs) > 0 {
		if err := t.clientValidation(o, l, v, out); err != nil {
			return nil, err
		}
	}
	if cs := cipherSuites(l.TLS.Options[cipherSuitesOption]); len(cs) > 0 {
		out.CipherSuites = cs
	}
	return out, nil
}

// cipherSuitesOption is istiod's listener TLS option restricting cipher suites.
const cipherSuitesOption = "gateway.istio.io/tls-cipher-suites"

// validCipherSuites are the names Envoy (BoringSSL) knows, as istiod filters them.
var validCipherSuites = []string{
	"ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384",
	"ECDHE-RSA-AES256-GCM-SHA384", "ECDHE-ECDSA-CHACHA20-POLY1305", "ECDHE-RSA-CHACHA20-POLY1305",
	"ECDHE-ECDSA-AES128-SHA", "ECDHE-RSA-AES128-SHA", "ECDHE-ECDSA-AES256-SHA", "ECDHE-RSA-AES256-SHA",
	"AES128-GCM-SHA256", "AES256-GCM-SHA384", "AES128-SHA", "AES256-SHA", "DES-CBC3-SHA",
}

// cipherSuites reads a comma-separated list, keeping the known names (and BoringSSL's
// operators), once each.
func cipherSuites(opt gwv1.AnnotationValue) []string {
	if opt == "" {
		return nil
	}
	var out []string
	for _, c := range strings.Split(string(opt), ",") {
		c = strings.TrimSpace(c)
		known := c == "" || c == "ALL" || !isAlnum(c[0]) || slices.Contains(validCipherSuites, c)
		if known && !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out
}

func isAlnum(b byte) bool {
	return b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9'
}

// frontendValidation is the Gateway's client certificate validation for a port: the port's
// own, else the default.
func frontendValidation(gw *gwv1.Gateway, port gwv1.PortNumber) *gwv1.FrontendTLSValidation {
	if gw.Spec.TLS == nil || gw.Spec.TLS.Frontend == nil {
		return nil
	}
	f := gw.Spec.TLS.Frontend
	for _, pp := range f.PerPort {
		if pp.Port == port {
			return pp.TLS.Validation
		}
	}
	return f.Default.Validation
}

// clientValidation makes a terminating server verify client certificates against the CA a
// Gateway's frontend validation names (a ConfigMap or a Secret), as istiod: MUTUAL, or
// OPTIONAL_MUTUAL with AllowInsecureFallback; the listener's tls-terminate-mode option wins.
func (t *translator) clientValidation(o owner, l *gwv1.Listener, v *gwv1.FrontendTLSValidation, out *networking.ServerTLSSettings) *configError {
	if len(v.CACertificateRefs) > 1 {
		return errorf(string(gwv1.ListenerReasonInvalidCACertificateRef), "only one caCertificateRef is supported")
	}
	ref := v.CACertificateRefs[0]
	ownNs := o.obj.GetNamespace()
	ns := string(deref(ref.Namespace, gwv1.Namespace(ownNs)))
	var scheme string
	switch {
	case ref.Group == "" && ref.Kind == "ConfigMap":
		scheme = "configmap://"
	case ref.Group == "" && ref.Kind == "Secret":
		scheme = CredentialPrefix
	default:
		return errorf(string(gwv1.ListenerReasonInvalidCACertificateKind),
			"invalid CA certificate reference %s/%s/%s.%s, only secret and configmap are allowed", ref.Group, ref.Kind, ref.Name, deref(ref.Namespace, ""))
	}
	if ns != ownNs && !t.allowed(o.kind, ownNs, "", string(ref.Kind), ns, string(ref.Name)) {
		return errorf(string(gwv1.ListenerReasonRefNotPermitted),
			"caCertificateRef %s/%s not accessible to a Gateway in namespace %q (missing a ReferenceGrant?)", ns, ref.Name, ownNs)
	}
	if sec, ok := t.in.Services.(Secrets); ok {
		if err := sec.Certificate(string(ref.Kind), ns, string(ref.Name), true); err != nil {
			return errorf(string(gwv1.ListenerReasonInvalidCACertificateRef), "invalid CA certificate reference %s/%s/%s.%s, %v",
				ref.Group, ref.Kind, ref.Name, deref(ref.Namespace, ""), err)
		}
	}
	out.Mode = networking.ServerTLSSettings_MUTUAL
	out.InsecureSkipVerify = wrapperspb.Bool(false)
	if v.Mode == gwv1.AllowInsecureFallback {
		out.Mode = networking.ServerTLSSettings_OPTIONAL_MUTUAL
		out.InsecureSkipVerify = wrapperspb.Bool(true)
	}
	out.CaCertCredentialName = scheme + ns + "/" + string(ref.Name) + "-cacert"
	switch l.TLS.Options[tlsModeOption] {
	case "MUTUAL":
		out.Mode, out.InsecureSkipVerify = networking.ServerTLSSettings_MUTUAL, wrapperspb.Bool(false)
	case "OPTIONAL_MUTUAL":
		out.Mode, out.InsecureSkipVerify = networking.ServerTLSSettings_OPTIONAL_MUTUAL, wrapperspb.Bool(false)
	}
	return nil
}
