package gatewaystatus

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"sailplane.dev/shared/gatewayapi"
)

var (
	t0  = metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	now = metav1.NewTime(time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC))
)

func cond(typ, status, reason, msg string, gen int64, ltt metav1.Time) metav1.Condition {
	return metav1.Condition{Type: typ, Status: metav1.ConditionStatus(status), Reason: reason, Message: msg, ObservedGeneration: gen, LastTransitionTime: ltt}
}

func TestMergeConditions(t *testing.T) {
	for _, c := range []struct {
		name      string
		cur, want []metav1.Condition
		out       []metav1.Condition
	}{
		{"new condition gets now",
			nil, []metav1.Condition{cond("Accepted", "True", "Accepted", "", 1, metav1.Time{})},
			[]metav1.Condition{cond("Accepted", "True", "Accepted", "", 1, now)}},
		{"unchanged keeps its time, even with a new generation",
			[]metav1.Condition{cond("Accepted", "True", "Accepted", "", 1, t0)},
			[]metav1.Condition{cond("Accepted", "True", "Accepted", "", 2, metav1.Time{})},
			[]metav1.Condition{cond("Accepted", "True", "Accepted", "", 2, t0)}},
		{"status change is a transition",
			[]metav1.Condition{cond("Accepted", "True", "Accepted", "", 1, t0)},
			[]metav1.Condition{cond("Accepted", "False", "Accepted", "", 1, metav1.Time{})},
			[]metav1.Condition{cond("Accepted", "False", "Accepted", "", 1, now)}},
		{"reason change is a transition",
			[]metav1.Condition{cond("ResolvedRefs", "False", "BackendNotFound", "x", 1, t0)},
			[]metav1.Condition{cond("ResolvedRefs", "False", "RefNotPermitted", "x", 1, metav1.Time{})},
			[]metav1.Condition{cond("ResolvedRefs", "False", "RefNotPermitted", "x", 1, now)}},
		{"message change is a transition",
			[]metav1.Condition{cond("ResolvedRefs", "False", "BackendNotFound", "a", 1, t0)},
			[]metav1.Condition{cond("ResolvedRefs", "False", "BackendNotFound", "b", 1, metav1.Time{})},
			[]metav1.Condition{cond("ResolvedRefs", "False", "BackendNotFound", "b", 1, now)}},
		{"conditions no longer wanted go",
			[]metav1.Condition{cond("Accepted", "True", "Accepted", "", 1, t0), cond("Old", "True", "Old", "", 1, t0)},
			[]metav1.Condition{cond("Accepted", "True", "Accepted", "", 1, metav1.Time{})},
			[]metav1.Condition{cond("Accepted", "True", "Accepted", "", 1, t0)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := MergeConditions(c.cur, c.want, now)
			if !Equal(got, c.out) {
				t.Errorf("got %+v\nwant %+v", got, c.out)
			}
		})
	}
}

// ref is a parent reference as the API server stores it, defaults filled in.
func ref(name string, section string) gwv1.ParentReference {
	r := defaultRef(gwv1.ParentReference{Name: gwv1.ObjectName(name)})
	if section != "" {
		s := gwv1.SectionName(section)
		r.SectionName = &s
	}
	return r
}

func parent(r gwv1.ParentReference, controller gwv1.GatewayController, conds ...metav1.Condition) gwv1.RouteParentStatus {
	return gwv1.RouteParentStatus{ParentRef: r, ControllerName: controller, Conditions: conds}
}

func TestMergeRoute(t *testing.T) {
	const other = gwv1.GatewayController("example.com/other")
	ours := gatewayapi.ControllerName
	accepted := func(ltt metav1.Time) metav1.Condition { return cond("Accepted", "True", "Accepted", "", 1, ltt) }
	refused := func(ltt metav1.Time) metav1.Condition {
		return cond("Accepted", "False", "NotAllowedByListeners", "", 1, ltt)
	}
	nsDefault := gwv1.Namespace("default")
	explicit := ref("a", "")
	explicit.Namespace = &nsDefault
	bare := gwv1.ParentReference{Name: "a"}
	for _, c := range []struct {
		name string
		cur  []gwv1.RouteParentStatus
		want []gwv1.RouteParentStatus
		out  []gwv1.RouteParentStatus
	}{
		{"other controllers' parents kept in place, ours replaced",
			[]gwv1.RouteParentStatus{parent(ref("x", ""), other, accepted(t0)), parent(ref("a", ""), ours, accepted(t0))},
			[]gwv1.RouteParentStatus{parent(ref("a", ""), ours, refused(metav1.Time{}))},
			[]gwv1.RouteParentStatus{parent(ref("x", ""), other, accepted(t0)), parent(ref("a", ""), ours, refused(now))}},
		{"ours for a parent no longer referenced removed",
			[]gwv1.RouteParentStatus{parent(ref("a", ""), ours, accepted(t0)), parent(ref("b", ""), ours, accepted(t0)), parent(ref("x", ""), other, accepted(t0))},
			[]gwv1.RouteParentStatus{parent(ref("b", ""), ours, accepted(metav1.Time{}))},
			[]gwv1.RouteParentStatus{parent(ref("b", ""), ours, accepted(t0)), parent(ref("x", ""), other, accepted(t0))}},
		{"none of ours wanted: only others' stay",
			[]gwv1.RouteParentStatus{parent(ref("a", ""), ours, accepted(t0)), parent(ref("x", ""), other, accepted(t0))},
			nil,
			[]gwv1.RouteParentStatus{parent(ref("x", ""), other, accepted(t0))}},
		{"the same parent written with its defaults is the same parent, written with them",
			[]gwv1.RouteParentStatus{parent(explicit, ours, accepted(t0))},
			[]gwv1.RouteParentStatus{parent(bare, ours, accepted(metav1.Time{}))},
			[]gwv1.RouteParentStatus{parent(ref("a", ""), ours, accepted(t0))}},
		{"sections are different parents",
			[]gwv1.RouteParentStatus{parent(ref("a", "http"), ours, accepted(t0))},
			[]gwv1.RouteParentStatus{parent(ref("a", "https"), ours, accepted(metav1.Time{}))},
			[]gwv1.RouteParentStatus{parent(ref("a", "https"), ours, accepted(now))}},
		{"another controller's entry for the same parent is not ours",
			[]gwv1.RouteParentStatus{parent(ref("a", ""), other, refused(t0))},
			[]gwv1.RouteParentStatus{parent(ref("a", ""), ours, accepted(metav1.Time{}))},
			[]gwv1.RouteParentStatus{parent(ref("a", ""), other, refused(t0)), parent(ref("a", ""), ours, accepted(now))}},
		{"the mesh controller's entries (GAMMA parents) are ours too",
			[]gwv1.RouteParentStatus{parent(ref("a", ""), MeshController, accepted(t0)), parent(ref("x", ""), other, accepted(t0))},
			nil,
			[]gwv1.RouteParentStatus{parent(ref("x", ""), other, accepted(t0))}},
		{"Sailplane's alias is ours too",
			[]gwv1.RouteParentStatus{parent(ref("a", ""), gatewayapi.SailplaneControllerName, accepted(t0))},
			nil,
			nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := MergeRoute(gwv1.RouteStatus{Parents: c.cur}, c.want, "default", now)
			if !Equal(got.Parents, c.out) {
				t.Errorf("got %+v\nwant %+v", got.Parents, c.out)
			}
		})
	}
}

func TestMergePolicy(t *testing.T) {
	const other = gwv1.GatewayController("example.com/other")
	cur := gwv1.PolicyStatus{Ancestors: []gwv1.PolicyAncestorStatus{
		{AncestorRef: ref("x", ""), ControllerName: other, Conditions: []metav1.Condition{cond("Accepted", "True", "Accepted", "", 1, t0)}},
		{AncestorRef: ref("gone", ""), ControllerName: gatewayapi.ControllerName, Conditions: []metav1.Condition{cond("Accepted", "True", "Accepted", "", 1, t0)}},
		{AncestorRef: ref("a", ""), ControllerName: gatewayapi.ControllerName, Conditions: []metav1.Condition{cond("Accepted", "True", "Accepted", "", 1, t0)}},
	}}
	want := []gwv1.PolicyAncestorStatus{
		{AncestorRef: ref("a", ""), ControllerName: gatewayapi.ControllerName, Conditions: []metav1.Condition{cond("Accepted", "True", "Accepted", "", 2, metav1.Time{})}},
	}
	got := MergePolicy(cur, want, "default", now)
	out := []gwv1.PolicyAncestorStatus{cur.Ancestors[0],
		{AncestorRef: ref("a", ""), ControllerName: gatewayapi.ControllerName, Conditions: []metav1.Condition{cond("Accepted", "True", "Accepted", "", 2, t0)}}}
	if !Equal(got.Ancestors, out) {
		t.Errorf("got %+v\nwant %+v", got.Ancestors, out)
	}
}

func TestMergeGateway(t *testing.T) {
	cur := gwv1.GatewayStatus{
		Conditions: []metav1.Condition{cond("Accepted", "True", "Accepted", "", 1, t0), cond("Programmed", "False", "Pending", "", 1, t0)},
		Listeners: []gwv1.ListenerStatus{
			{Name: "http", AttachedRoutes: 1, Conditions: []metav1.Condition{cond("Accepted", "True", "Accepted", "", 1, t0)}},
			{Name: "gone", Conditions: []metav1.Condition{cond("Accepted", "True", "Accepted", "", 1, t0)}},
		},
	}
	want := gwv1.GatewayStatus{
		Addresses:  []gwv1.GatewayStatusAddress{{Value: "198.18.0.1"}},
		Conditions: []metav1.Condition{cond("Accepted", "True", "Accepted", "", 2, metav1.Time{}), cond("Programmed", "True", "Programmed", "", 2, metav1.Time{})},
		Listeners: []gwv1.ListenerStatus{
			{Name: "http", AttachedRoutes: 2, Conditions: []metav1.Condition{cond("Accepted", "True", "Accepted", "", 2, metav1.Time{})}},
			{Name: "https", Conditions: []metav1.Condition{cond("Accepted", "True", "Accepted", "", 2, metav1.Time{})}},
		},
	}
	got := MergeGateway(cur, want, now)
	out := gwv1.GatewayStatus{
		Addresses:  []gwv1.GatewayStatusAddress{{Type: ptr(gwv1.IPAddressType), Value: "198.18.0.1"}},
		Conditions: []metav1.Condition{cond("Accepted", "True", "Accepted", "", 2, t0), cond("Programmed", "True", "Programmed", "", 2, now)},
		Listeners: []gwv1.ListenerStatus{
			{Name: "http", AttachedRoutes: 2, Conditions: []metav1.Condition{cond("Accepted", "True", "Accepted", "", 2, t0)}},
			{Name: "https", Conditions: []metav1.Condition{cond("Accepted", "True", "Accepted", "", 2, now)}},
		},
	}
	if !Equal(got, out) {
		t.Errorf("got %+v\nwant %+v", got, out)
	}
	// Merging what is already there changes nothing: no write.
	if again := MergeGateway(got, want, metav1.NewTime(now.Add(time.Hour))); !Equal(again, got) {
		t.Errorf("a second merge changed the status: %+v", again)
	}
	// No address to report (the Service's pods gone): the reported one stays, as in istiod.
	none := *want.DeepCopy()
	none.Addresses = nil
	if kept := MergeGateway(got, none, now); !Equal(kept.Addresses, out.Addresses) {
		t.Errorf("addresses %+v, want the reported ones kept: %+v", kept.Addresses, out.Addresses)
	}
}

func TestEqualIsSemantic(t *testing.T) {
	a := gwv1.RouteStatus{Parents: []gwv1.RouteParentStatus{{ParentRef: ref("a", ""), Conditions: []metav1.Condition{}}}}
	b := gwv1.RouteStatus{Parents: []gwv1.RouteParentStatus{{ParentRef: ref("a", ""), Conditions: nil}}}
	if !Equal(a, b) {
		t.Error("an empty and a nil list differ")
	}
	c := a.DeepCopy()
	c.Parents[0].Conditions = []metav1.Condition{cond("Accepted", "True", "Accepted", "", 1, metav1.NewTime(t0.In(time.FixedZone("x", 3600))))}
	d := a.DeepCopy()
	d.Parents[0].Conditions = []metav1.Condition{cond("Accepted", "True", "Accepted", "", 1, t0)}
	if !Equal(c, d) {
		t.Error("the same instant in two time zones differs")
	}
}
