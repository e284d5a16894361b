package gatewaystatus

import (
	"slices"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"sailplane.dev/shared/gatewayapi"
)

// MeshController is the controllerName istiod writes on the entries of mesh (GAMMA) parents and
// ancestors, Services rather than Gateways; istiod counts it as its own (outControllers).
const MeshController = gwv1.GatewayController("istio.io/mesh-controller")

// Ours reports whether a route parent or policy ancestor entry with this controllerName is
// this controller's to write: Istio's gateway and mesh controller names and Sailplane's alias,
// as a GatewayClass may name either.
func Ours(c gwv1.GatewayController) bool {
	return c == gatewayapi.ControllerName || c == gatewayapi.SailplaneControllerName || c == MeshController
}

// MergeConditions returns want with each condition's lastTransitionTime taken from cur's
// condition of the same type when its status, reason and message did not change (the spec's
// meaning of a transition), else now. cur is not modified.
func MergeConditions(cur, want []metav1.Condition, now metav1.Time) []metav1.Condition {
	if want == nil {
		return nil
	}
	out := make([]metav1.Condition, len(want))
	for i, w := range want {
		w.LastTransitionTime = now
		if c, ok := findCondition(cur, w.Type); ok && c.Status == w.Status && c.Reason == w.Reason && c.Message == w.Message {
			w.LastTransitionTime = c.LastTransitionTime
		}
		out[i] = w
	}
	return out
}

func findCondition(conds []metav1.Condition, typ string) (metav1.Condition, bool) {
	for _, c := range conds {
		if c.Type == typ {
			return c, true
		}
	}
	return metav1.Condition{}, false
}

// MergeGatewayClass is the GatewayClass status to write: want, transition times kept.
func MergeGatewayClass(cur, want gwv1.GatewayClassStatus, now metav1.Time) gwv1.GatewayClassStatus {
	want.Conditions = MergeConditions(cur.Conditions, want.Conditions, now)
	return want
}

// MergeGateway is the Gateway status to write: want, with the transition times of the
// Gateway's and each listener's (by name) conditions kept, and cur's addresses when want has
// none: as istiod, an address is not reported before the Gateway's Service is usable, but once
// reported it is never removed (a LoadBalancer address pending again, pods gone for a while),
// so what clients resolve keeps working.
func MergeGateway(cur, want gwv1.GatewayStatus, now metav1.Time) gwv1.GatewayStatus {
	if len(want.Addresses) == 0 {
		want.Addresses = cur.Addresses
	}
	want.Conditions = MergeConditions(cur.Conditions, want.Conditions, now)
	listeners := make([]gwv1.ListenerStatus, len(want.Listeners))
	for i, l := range want.Listeners {
		var prev []metav1.Condition
		if j := slices.IndexFunc(cur.Listeners, func(c gwv1.ListenerStatus) bool { return c.Name == l.Name }); j >= 0 {
			prev = cur.Listeners[j].Conditions
		}
		l.Conditions = MergeConditions(prev, l.Conditions, now)
		l.SupportedKinds = defaultKinds(l.SupportedKinds)
		listeners[i] = l
	}
	if want.Listeners == nil {
		listeners = nil
	}
	want.Listeners = listeners
	addrs := slices.Clone(want.Addresses)
	for i := range addrs {
		if addrs[i].Type == nil {
			addrs[i].Type = ptr(gwv1.IPAddressType)
		}
	}
	want.Addresses = addrs
	return want
}

// MergeListenerSet is MergeGateway for a ListenerSet.
func MergeListenerSet(cur, want gwv1.ListenerSetStatus, now metav1.Time) gwv1.ListenerSetStatus {
	want.Conditions = MergeConditions(cur.Conditions, want.Conditions, now)
	listeners := make([]gwv1.ListenerEntryStatus, len(want.Listeners))
	for i, l := range want.Listeners {
		var prev []metav1.Condition
		if j := slices.IndexFunc(cur.Listeners, func(c gwv1.ListenerEntryStatus) bool { return c.Name == l.Name }); j >= 0 {
			prev = cur.Listeners[j].Conditions
		}
		l.Conditions = MergeConditions(prev, l.Conditions, now)
		l.SupportedKinds = defaultKinds(l.SupportedKinds)
		listeners[i] = l
	}
	if want.Listeners == nil {
		listeners = nil
	}
	want.Listeners = listeners
	return want
}

// MergeRoute is the route status to write when this controller wants the parents in want
// (its own entries only) on a route of namespace ns: other controllers' entries stay as they
// are, in place; each of ours is replaced by want's entry for the same parent (transition
// times kept) or removed when want has none (the route no longer references that parent, or
// it is no longer ours); want's new parents are appended.
func MergeRoute(cur gwv1.RouteStatus, want []gwv1.RouteParentStatus, ns string, now metav1.Time) gwv1.RouteStatus {
	return gwv1.RouteStatus{Parents: mergeEntries(cur.Parents, want, ns, now, func(p *gwv1.RouteParentStatus) entry {
		return entry{p.ControllerName, &p.ParentRef, &p.Conditions}
	})}
}

// MergePolicy is MergeRoute for a policy's ancestors.
func MergePolicy(cur gwv1.PolicyStatus, want []gwv1.PolicyAncestorStatus, ns string, now metav1.Time) gwv1.PolicyStatus {
	return gwv1.PolicyStatus{Ancestors: mergeEntries(cur.Ancestors, want, ns, now, func(a *gwv1.PolicyAncestorStatus) entry {
		return entry{a.ControllerName, &a.AncestorRef, &a.Conditions}
	})}
}

// entry is what merging reads and writes of a route parent's or a policy ancestor's status.
type entry struct {
	controller gwv1.GatewayController
	ref        *gwv1.ParentReference
	conditions *[]metav1.Condition
}

// mergeEntries is MergeRoute's rule for any list of per-parent statuses.
func mergeEntries[E any](cur, want []E, ns string, now metav1.Time, of func(*E) entry) []E {
	out := []E{} // the CRDs require the list, even empty
	used := make([]bool, len(want))
	for ci := range cur {
		c := of(&cur[ci])
		if !Ours(c.controller) {
			out = append(out, cur[ci])
			continue
		}
		i := slices.IndexFunc(want, func(w E) bool {
			we := of(&w)
			return we.controller == c.controller && SameParent(*we.ref, *c.ref, ns)
		})
		if i < 0 || used[i] {
			continue
		}
		used[i] = true
		w := want[i]
		we := of(&w)
		*we.conditions = MergeConditions(*c.conditions, *we.conditions, now)
		out = append(out, w)
	}
	for i, w := range want {
		if used[i] {
			continue
		}
		we := of(&w)
		*we.conditions = MergeConditions(nil, *we.conditions, now)
		out = append(out, w)
	}
	for i := range out {
		if e := of(&out[i]); Ours(e.controller) {
			*e.ref = defaultRef(*e.ref)
		}
	}
	return out
}

// The API server fills in the status schema's defaults; the status to write has them already,
// so that what it stores compares equal to what was written (else every check would write it
// again, uselessly).

func defaultRef(r gwv1.ParentReference) gwv1.ParentReference {
	if r.Group == nil {
		r.Group = ptr(gwv1.Group(gwv1.GroupName))
	}
	if r.Kind == nil {
		r.Kind = ptr(gwv1.Kind("Gateway"))
	}
	return r
}

func defaultKinds(kinds []gwv1.RouteGroupKind) []gwv1.RouteGroupKind {
	out := slices.Clone(kinds)
	for i := range out {
		if out[i].Group == nil {
			out[i].Group = ptr(gwv1.Group(gwv1.GroupName))
		}
	}
	return out
}

func ptr[T any](v T) *T { return &v }

// SameParent compares parent references of an object in namespace ns with the API's defaults
// applied (group gateway.networking.k8s.io, kind Gateway, the object's namespace), so that a
// reference written with and without its defaults is the same parent.
func SameParent(a, b gwv1.ParentReference, ns string) bool {
	return parentKey(a, ns) == parentKey(b, ns)
}

type parentRefKey struct {
	group, kind, ns, name, section string
	port                           int32
}

func parentKey(r gwv1.ParentReference, ns string) parentRefKey {
	k := parentRefKey{group: gwv1.GroupName, kind: "Gateway", ns: ns, name: string(r.Name)}
	if r.Group != nil {
		k.group = string(*r.Group)
	}
	if r.Kind != nil {
		k.kind = string(*r.Kind)
	}
	if r.Namespace != nil && *r.Namespace != "" {
		k.ns = string(*r.Namespace)
	}
	if r.SectionName != nil {
		k.section = string(*r.SectionName)
	}
	if r.Port != nil {
		k.port = int32(*r.Port)
	}
	return k
}

// Equal compares two statuses semantically: times by instant, nil and empty lists alike.
func Equal(a, b any) bool {
	return equality.Semantic.DeepEqual(a, b)
}
