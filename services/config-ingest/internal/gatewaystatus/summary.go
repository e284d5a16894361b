package gatewaystatus

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"sailplane.dev/shared/monitoring"
)

// Summary sums up a computed status for the status page: one line per condition, scoped by
// listener or parent, and whether every condition says all is well.
func Summary(c Computed) monitoring.GatewayAPIStatus {
	out := monitoring.GatewayAPIStatus{Kind: c.Kind, Namespace: c.Namespace, Name: c.Name, OK: true, Conditions: []string{}}
	add := func(scope string, conds []metav1.Condition) {
		for _, cd := range conds {
			line := fmt.Sprintf("%s%s=%s (%s)", scope, cd.Type, cd.Status, cd.Reason)
			if cd.Message != "" {
				line += ": " + cd.Message
			}
			out.Conditions = append(out.Conditions, line)
			if bad(cd) {
				out.OK = false
			}
		}
	}
	parents := func(ps []gwv1.RouteParentStatus) {
		for _, p := range ps {
			add("parent "+parentName(p.ParentRef, c.Namespace)+": ", p.Conditions)
		}
	}
	switch s := c.Status.(type) {
	case *gwv1.GatewayClassStatus:
		add("", s.Conditions)
	case *gwv1.GatewayStatus:
		add("", s.Conditions)
		for _, l := range s.Listeners {
			add(fmt.Sprintf("listener %s (%d routes): ", l.Name, l.AttachedRoutes), l.Conditions)
		}
	case *gwv1.ListenerSetStatus:
		add("", s.Conditions)
		for _, l := range s.Listeners {
			add(fmt.Sprintf("listener %s (%d routes): ", l.Name, l.AttachedRoutes), l.Conditions)
		}
	case *gwv1.HTTPRouteStatus:
		parents(s.Parents)
	case *gwv1.GRPCRouteStatus:
		parents(s.Parents)
	case *gwv1.TCPRouteStatus:
		parents(s.Parents)
	case *gwv1.TLSRouteStatus:
		parents(s.Parents)
	case *gwv1.PolicyStatus:
		for _, a := range s.Ancestors {
			add("ancestor "+parentName(a.AncestorRef, c.Namespace)+": ", a.Conditions)
		}
	}
	return out
}

// bad is a condition that says something is wrong.
func bad(c metav1.Condition) bool {
	switch c.Type {
	case "Conflicted":
		return c.Status == metav1.ConditionTrue
	case "Accepted", "Programmed", "ResolvedRefs":
		return c.Status != metav1.ConditionTrue
	}
	return false
}

func parentName(r gwv1.ParentReference, ns string) string {
	name := string(r.Name)
	if r.Namespace != nil && *r.Namespace != "" {
		ns = string(*r.Namespace)
	}
	if r.Kind != nil && *r.Kind != "Gateway" {
		name = string(*r.Kind) + " " + ns + "/" + name
	} else {
		name = ns + "/" + name
	}
	if r.SectionName != nil {
		name += "/" + string(*r.SectionName)
	}
	return name
}
