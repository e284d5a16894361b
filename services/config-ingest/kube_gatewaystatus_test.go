package configingest_test

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	configingest "sailplane.dev/services/config-ingest"
	"sailplane.dev/shared/gatewayapi"
)

// gwFixture is a GatewayClass of ours, a Gateway and helpers to make and check routes.
type gwFixture struct {
	e  *kenv
	gw gwclient.Interface
	ns string
}

func newGWFixture(t *testing.T, e *kenv, prefix string) *gwFixture {
	t.Helper()
	gw, err := gwclient.NewForConfig(e.k.RestConfig())
	if err != nil {
		t.Fatal(err)
	}
	f := &gwFixture{e: e, gw: gw, ns: e.ns(prefix, nil)}
	class := prefix + "-" + e.id
	if _, err := gw.GatewayV1().GatewayClasses().Create(e.ctx(), &gwv1.GatewayClass{
		ObjectMeta: metav1.ObjectMeta{Name: class}, Spec: gwv1.GatewayClassSpec{ControllerName: gatewayapi.ControllerName},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = gw.GatewayV1().GatewayClasses().Delete(context.Background(), class, metav1.DeleteOptions{})
	})
	if _, err := gw.GatewayV1().Gateways(f.ns).Create(e.ctx(), &gwv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: "gw"},
		Spec: gwv1.GatewaySpec{GatewayClassName: gwv1.ObjectName(class),
			Listeners: []gwv1.Listener{{Name: "http", Port: 80, Protocol: gwv1.HTTPProtocolType}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *gwFixture) route(t *testing.T, name string, labels map[string]string) {
	t.Helper()
	port := gwv1.PortNumber(80)
	if _, err := f.gw.GatewayV1().HTTPRoutes(f.ns).Create(f.e.ctx(), &gwv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: gwv1.HTTPRouteSpec{
			CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{{Name: "gw"}}},
			Rules: []gwv1.HTTPRouteRule{{BackendRefs: []gwv1.HTTPBackendRef{{BackendRef: gwv1.BackendRef{
				BackendObjectReference: gwv1.BackendObjectReference{Name: "missing", Port: &port}}}}}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (f *gwFixture) accepted(name string) bool {
	r, err := f.gw.GatewayV1().HTTPRoutes(f.ns).Get(f.e.ctx(), name, metav1.GetOptions{})
	if err != nil {
		return false
	}
	for _, p := range r.Status.Parents {
		if p.ControllerName != gatewayapi.ControllerName {
			continue
		}
		for _, c := range p.Conditions {
			if c.Type == "Accepted" && c.Status == metav1.ConditionTrue {
				return true
			}
		}
	}
	return false
}

// steady are Lease timings long enough that a loaded machine does not see the Lease change
// hands by itself (a replica that stops releases it at once).
func steady(c *configingest.Config) {
	c.LeaseDuration, c.RenewDeadline, c.RetryPeriod = 15*time.Second, 10*time.Second, 300*time.Millisecond
}

// A canary revision beside the default one: each writes its own objects' status, the canary
// with its own Lease (sharing the default's, it would never write while the default leads).
func TestKubeGatewayStatusRevisions(t *testing.T) {
	e := newKenv(t, sharedKube(t))
	f := newGWFixture(t, e, "gwr")
	def := e.start("pod-default", steady)
	waitFor(t, "the default revision leads", def.svc.StatusLeader)
	canary := e.start("pod-canary", func(c *configingest.Config) { steady(c); c.Revision = "canary" })
	f.route(t, "default-route", nil)
	f.route(t, "canary-route", map[string]string{"istio.io/rev": "canary"})
	waitFor(t, "the default revision's route written", func() bool { return f.accepted("default-route") })
	waitFor(t, "the canary revision's route written", func() bool { return f.accepted("canary-route") })
	waitFor(t, "the canary counts its write", func() bool {
		return canary.metrics.Value("sailplane_gateway_status_writes_total", "kind", "HTTPRoute", "result", "written") > 0
	})
	if canary.svc.StatusLeader() {
		t.Error("the canary holds the default revision's status Lease")
	}
}

// Two replicas on one API server: the Gateway API status (gatewayapi.Translate's) is written by
// the Lease holder alone, never by the other, and by the other once it takes over.
func TestKubeGatewayStatusLeader(t *testing.T) {
	e := newKenv(t, sharedKube(t))
	f := newGWFixture(t, e, "gws")
	route := func(name string) { f.route(t, name, nil) }
	accepted := f.accepted
	a := e.start("pod-a", steady)
	b := e.start("pod-b", steady)
	ins := map[string]*kingest{"pod-a": a, "pod-b": b}
	route("first")
	waitFor(t, "the route's status written", func() bool { return accepted("first") })
	written := func(in *kingest) float64 {
		return in.metrics.Value("sailplane_gateway_status_writes_total", "result", "written")
	}
	var leader, follower string
	for name, in := range ins {
		if in.svc.StatusLeader() {
			leader = name
		} else {
			follower = name
		}
	}
	if leader == "" || follower == "" {
		t.Fatalf("leader %q, follower %q", leader, follower)
	}
	if n := written(ins[follower]); n != 0 {
		t.Fatalf("the follower wrote %v statuses", n)
	}
	// The API server shows the status a moment before the writer hears back and counts it.
	waitFor(t, "the leader counts its writes", func() bool { return written(ins[leader]) > 0 })

	ins[leader].stop()
	waitFor(t, "the follower takes over", func() bool { return ins[follower].svc.StatusLeader() })
	route("second")
	waitFor(t, "the new leader writes", func() bool { return accepted("second") })
	waitFor(t, "the new leader counts its write", func() bool { return written(ins[follower]) > 0 })
}
