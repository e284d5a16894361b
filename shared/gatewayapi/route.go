package gatewayapi

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	networking "istio.io/api/networking/v1alpha3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"sailplane.dev/shared/schema"
)

// Route parent reasons beyond the spec's constants, as istiod writes them.
const (
	reasonInvalidDestination = "InvalidDestination"
	reasonInvalidFilter      = "InvalidFilter"
	reasonInvalidConfig      = "InvalidConfiguration"
)

// route is what binding and status need of any route kind.
type route struct {
	kind      schema.Kind
	obj       object
	parents   []gwv1.ParentReference
	hostnames []gwv1.Hostname
	// convert translates the rules with gateway (enforceGrants) or mesh semantics; a nil result
	// with an error is a hard error: nothing is served for the route.
	convert func(mesh bool) (*converted, *configError)
}

type converted struct {
	http []*networking.HTTPRoute
	tcp  []*networking.TCPRoute
	tls  []*networking.TLSRoute
}

func (c *converted) empty() bool { return c == nil || len(c.http)+len(c.tcp)+len(c.tls) == 0 }

// binding is one parent a parentRef resolved to: a listener, or the mesh (a Service).
type binding struct {
	ref gwv1.ParentReference
	l   *listener // nil for mesh
	// meshHosts are the hostnames a mesh parent routes (the Service's, or the ServiceEntry's).
	meshHosts []string
	banned    []string
	denied    *configError
}

func (t *translator) routes() {
	for _, r := range sortObjects(t.in.HTTPRoutes) {
		t.route(httpRoute(t, r), func(parents []gwv1.RouteParentStatus) any {
			return &gwv1.HTTPRouteStatus{RouteStatus: gwv1.RouteStatus{Parents: parents}}
		})
	}
	for _, r := range sortObjects(t.in.GRPCRoutes) {
		t.route(grpcRoute(t, r), func(parents []gwv1.RouteParentStatus) any {
			return &gwv1.GRPCRouteStatus{RouteStatus: gwv1.RouteStatus{Parents: parents}}
		})
	}
	for _, r := range sortObjects(t.in.TCPRoutes) {
		t.route(tcpRoute(t, r), func(parents []gwv1.RouteParentStatus) any {
			return &gwv1.TCPRouteStatus{RouteStatus: gwv1.RouteStatus{Parents: parents}}
		})
	}
	for _, r := range sortObjects(t.in.TLSRoutes) {
		t.route(tlsRoute(t, r), func(parents []gwv1.RouteParentStatus) any {
			return &gwv1.TLSRouteStatus{RouteStatus: gwv1.RouteStatus{Parents: parents}}
		})
	}
	for _, ls := range t.listeners {
		for _, l := range ls {
			l.status.AttachedRoutes = l.attached
		}
	}
}

func (t *translator) route(r route, status func([]gwv1.RouteParentStatus) any) {
	ns := r.obj.GetNamespace()
	bs := t.bind(r)
	if len(bs) == 0 {
		return // no parent of ours: another controller's route
	}
	var meshRes, gwRes *converted
	var meshErr, gwErr *configError
	for _, b := range bs {
		if b.l == nil && meshRes == nil && meshErr == nil {
			meshRes, meshErr = r.convert(true)
		}
		if b.l != nil && gwRes == nil && gwErr == nil {
			gwRes, gwErr = r.convert(false)
		}
	}
	ok := slices.DeleteFunc(slices.Clone(bs), func(b binding) bool { return b.denied != nil })
	slices.SortStableFunc(ok, func(a, b binding) int { return strings.Compare(a.internalName(), b.internalName()) })
	counted := map[*listener]bool{}
	for _, b := range ok {
		if b.l != nil && !counted[b.l] {
			counted[b.l] = true
			b.l.attached++
		}
		part := vsPart{ns: ns, name: r.obj.GetName(), created: r.obj.GetCreationTimestamp().Time}
		if b.l == nil {
			if meshRes.empty() {
				continue
			}
			routeKey := ns
			res := meshRes
			if b.ref.Port != nil {
				routeKey += "/" + strconv.Itoa(int(*b.ref.Port))
				res = withPort(res, uint32(*b.ref.Port))
			}
			for _, h := range b.meshHosts {
				p := part
				p.http, p.tcp, p.tls = res.http, res.tcp, meshTLS(res.tls, h)
				t.addVirtualService(routeKey+"/"+h, h, meshGateway, p)
			}
			continue
		}
		if gwRes.empty() {
			continue
		}
		for _, h := range hostStrings(r.hostnames) {
			if !b.allowedByIsolation(h) {
				continue
			}
			p := part
			p.http, p.tcp, p.tls = gwRes.http, gwRes.tcp, listenerTLS(gwRes.tls, b.l.hostname)
			if r.kind.Kind == schema.TLSRoute.Kind && len(p.tls) == 0 {
				continue
			}
			t.addVirtualService(b.l.istioGateway+"/"+h, h, b.l.istioGateway, p)
		}
	}
	parents := t.routeStatus(r, bs, meshErr, gwErr)
	t.routeStat = append(t.routeStat, Status{Kind: r.kind, Namespace: ns, Name: r.obj.GetName(),
		Generation: r.obj.GetGeneration(), Value: status(parents)})
}

func (b binding) internalName() string {
	if b.l == nil {
		return meshGateway
	}
	return b.l.istioGateway
}

func hostStrings(h []gwv1.Hostname) []string {
	if len(h) == 0 {
		return []string{"*"}
	}
	out := make([]string, len(h))
	for i, x := range h {
		out[i] = string(x)
	}
	return out
}

// bind resolves a route's parentRefs, as istiod: a Gateway reference binds to each of its
// listeners (the ones it does not select are denied), a Service or ServiceEntry reference to the
// mesh. References to objects that are not ours (another class, an unknown kind) are skipped.
func (t *translator) bind(r route) []binding {
	ns := r.obj.GetNamespace()
	var out []binding
	for _, ref := range r.parents {
		group, kind := string(deref(ref.Group, gwv1.GroupName)), string(deref(ref.Kind, "Gateway"))
		refNs := string(deref(ref.Namespace, gwv1.Namespace(ns)))
		switch {
		case group == gwv1.GroupName && kind == "Gateway":
			ls := t.listeners[key(refNs, string(ref.Name))]
			for _, l := range ls {
				b := binding{ref: ref, l: l}
				for _, o := range ls {
					if o != l && o.port == l.port && o.protocol == l.protocol && o.hostname != l.hostname {
						b.banned = append(b.banned, o.hostname)
					}
				}
				b.denied = t.listenerAllows(r, l, ref)
				out = append(out, b)
			}
		case (group == "" || group == "core") && kind == "Service":
			h := fmt.Sprintf("%s.%s.svc.%s", ref.Name, refNs, t.domain)
			b := binding{ref: ref, meshHosts: []string{h}}
			if !t.serviceExists(h, refNs) {
				b.denied = errorf(string(gwv1.RouteReasonNoMatchingParent), "parent service: %q not found", ref.Name)
			}
			out = append(out, b)
		case group == "networking.istio.io" && kind == "ServiceEntry":
			b := binding{ref: ref}
			se, ok := t.in.Services.(ServiceEntries)
			if ok {
				b.meshHosts, ok = se.ServiceEntryHosts(refNs, string(ref.Name))
			}
			if !ok {
				b.denied = errorf(string(gwv1.RouteReasonNoMatchingParent), "parent service entry: %q not found", ref.Name)
			}
			out = append(out, b)
		}
	}
	slices.SortStableFunc(out, func(a, b binding) int {
		return strings.Compare(parentRefString(a.ref, ns), parentRefString(b.ref, ns))
	})
	return out
}

func (t *translator) serviceExists(host, ns string) bool {
	if t.in.Services == nil {
		return false
	}
	_, ok := t.in.Services.Service(host, ns)
	return ok
}

func parentRefString(ref gwv1.ParentReference, ns string) string {
	return fmt.Sprintf("%s/%s/%s/%s/%d.%s", deref(ref.Group, gwv1.GroupName), deref(ref.Kind, "Gateway"), ref.Name,
		deref(ref.SectionName, ""), deref(ref.Port, 0), deref(ref.Namespace, gwv1.Namespace(ns)))
}

// listenerAllows checks a route against one listener of the Gateway it references: port and
// sectionName first, then hostnames (a wildcard match either way) with the namespaces the
// listener allows, then the route's kind.
func (t *translator) listenerAllows(r route, l *listener, ref gwv1.ParentReference) *configError {
	ns := r.obj.GetNamespace()
	if ref.Port != nil && *ref.Port != l.port {
		return errorf(string(gwv1.RouteReasonNoMatchingParent), "port %v not found", *ref.Port)
	}
	if ref.SectionName != nil && *ref.SectionName != l.section {
		return errorf(string(gwv1.RouteReasonNoMatchingParent), "sectionName %q not found", *ref.SectionName)
	}
	matched, hostMatched := false, false
out:
	for _, rh := range hostStrings(r.hostnames) {
		for _, ph := range l.hosts {
			pns, phost, found := strings.Cut(ph, "/")
			if !found {
				pns, phost = "*", ph
			}
			hm := hostsMatch(phost, rh)
			hostMatched = hostMatched || hm
			if hm && (pns == "*" || pns == ns) {
				matched = true
				break out
			}
		}
	}
	if !matched {
		if hostMatched {
			return errorf(string(gwv1.RouteReasonNotAllowedByListeners),
				"hostnames matched parent hostname %q, but namespace %q is not allowed by the parent", l.hostname, ns)
		}
		return errorf(string(gwv1.RouteReasonNoMatchingListenerHostname), "no hostnames matched parent hostname %q", l.hostname)
	}
	if !slices.ContainsFunc(l.kinds, func(k gwv1.RouteGroupKind) bool { return string(k.Kind) == r.kind.Kind }) {
		return errorf(string(gwv1.RouteReasonNotAllowedByListeners), "kind %s/%s/%s is not allowed",
			gwv1.GroupName, "v1", r.kind.Kind)
	}
	return nil
}

// hostsMatch is Istio's host.Name.Matches: equal, or either's wildcard covers the other.
func hostsMatch(a, b string) bool {
	if a == b {
		return true
	}
	aw, bw := strings.HasPrefix(a, "*"), strings.HasPrefix(b, "*")
	switch {
	case aw && bw:
		return strings.HasSuffix(a[1:], b[1:]) || strings.HasSuffix(b[1:], a[1:])
	case aw:
		return strings.HasSuffix(b, a[1:])
	case bw:
		return strings.HasSuffix(a, b[1:])
	}
	return false
}

// hostSubsetOf is Istio's host.Name.SubsetOf: every name a matches, b matches.
func hostSubsetOf(a, b string) bool {
	if b == "*" || a == b {
		return true
	}
	if strings.HasPrefix(b, "*") {
		return strings.HasSuffix(a, b[1:])
	}
	return false
}

// allowedByIsolation keeps a route host off a wildcard listener when another listener of the
// Gateway on the same port has a more specific hostname covering it: that listener gets it.
func (b binding) allowedByIsolation(routeHost string) bool {
	ours := b.l.hostname
	if ours != "" && !strings.HasPrefix(ours, "*") {
		return true
	}
	if ours != "" && !hostsMatch(routeHost, ours) {
		return false
	}
	for _, other := range b.banned {
		if len(ours) > len(other) {
			continue
		}
		if hostSubsetOf(routeHost, other) {
			return false
		}
	}
	return true
}

// routeStatus is istiod's createRouteStatus: per parentRef, the most favourable outcome among
// the listeners it resolved to (denials of equal rank joined), Accepted and ResolvedRefs.
func (t *translator) routeStatus(r route, bs []binding, meshErr, gwErr *configError) []gwv1.RouteParentStatus {
	ns, gen := r.obj.GetNamespace(), r.obj.GetGeneration()
	type result struct {
		ref    gwv1.ParentReference
		denied *configError
		err    *configError
		ok     int
	}
	rank := func(e *configError) int {
		if e == nil {
			return 0
		}
		switch e.Reason {
		case string(gwv1.RouteReasonNotAllowedByListeners):
			return 1
		case string(gwv1.RouteReasonNoMatchingListenerHostname):
			return 2
		}
		return 4
	}
	var order []string
	results := map[string]*result{}
	for _, b := range bs {
		k := parentRefString(b.ref, ns)
		err := gwErr
		if b.l == nil {
			err = meshErr
		}
		res, seen := results[k]
		if !seen {
			var d *configError
			if b.denied != nil {
				d = &configError{Reason: b.denied.Reason, Message: b.denied.Message}
			}
			res = &result{ref: b.ref, denied: d, err: err}
			results[k] = res
			order = append(order, k)
		} else if rb, rr := rank(b.denied), rank(res.denied); rb < rr {
			res.denied = b.denied
		} else if rb == rr && b.denied != nil {
			res.denied.Message += "; " + b.denied.Message
		}
		if b.denied == nil {
			res.ok++
		}
	}
	// istiod appends new parents in descending reference order.
	slices.Sort(order)
	slices.Reverse(order)
	out := []gwv1.RouteParentStatus{}
	for _, k := range order {
		res := results[k]
		msg := "Route was valid"
		if res.ok > 1 {
			msg = fmt.Sprintf("Route was valid, bound to %d parents", res.ok)
		}
		accepted := cond(string(gwv1.RouteConditionAccepted), true, string(gwv1.RouteReasonAccepted), msg, gen)
		if res.denied != nil {
			accepted = cond(string(gwv1.RouteConditionAccepted), false, res.denied.Reason, res.denied.Message, gen)
		}
		resolved := cond(string(gwv1.RouteConditionResolvedRefs), true, string(gwv1.RouteReasonResolvedRefs), "All references resolved", gen)
		if res.err != nil {
			resolved = cond(string(gwv1.RouteConditionResolvedRefs), false, res.err.Reason, res.err.Message, gen)
		}
		out = append(out, gwv1.RouteParentStatus{ParentRef: res.ref, ControllerName: ControllerName,
			Conditions: []metav1.Condition{accepted, resolved}})
	}
	return out
}

// withPort restricts mesh rules to the parentRef's port.
func withPort(c *converted, port uint32) *converted {
	out := &converted{}
	for _, r := range c.http {
		r = r.DeepCopy()
		for _, m := range r.Match {
			m.Port = port
		}
		if len(r.Match) == 0 {
			r.Match = []*networking.HTTPMatchRequest{{Port: port}}
		}
		out.http = append(out.http, r)
	}
	for _, r := range c.tcp {
		r = r.DeepCopy()
		for _, m := range r.Match {
			m.Port = port
		}
		if len(r.Match) == 0 {
			r.Match = []*networking.L4MatchAttributes{{Port: port}}
		}
		out.tcp = append(out.tcp, r)
	}
	for _, r := range c.tls {
		r = r.DeepCopy()
		for _, m := range r.Match {
			m.Port = port
		}
		out.tls = append(out.tls, r)
	}
	return out
}
