package configingest_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"sailplane.dev/shared/pki"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"

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

// selfSigned returns a PEM certificate and its PEM private key (a self-signed root).
func selfSigned(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	auth, err := pki.NewSelfSigned(pki.ECDSAP256, "example.com", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	layout, err := pki.IstioLayout(auth)
	if err != nil {
		t.Fatal(err)
	}
	return layout[pki.CACertFile], layout[pki.CAKeyFile]
}

// tlsFixture is a Gateway whose HTTPS listeners reference the Secrets "valid" (a certificate and
// its key), "malformed" (the conformance suite's: "Hello world" for both) and "missing" (none),
// and an HTTPRoute on it to a Service whose BackendTLSPolicy names the CA ConfigMap "ca" (none).
type tlsFixture struct {
	*gwFixture
	cert, key []byte
}

func newTLSFixture(t *testing.T, e *kenv, prefix string) *tlsFixture {
	t.Helper()
	f := &tlsFixture{gwFixture: newGWFixture(t, e, prefix)}
	f.cert, f.key = selfSigned(t)
	secret := func(name string, crt, key []byte) {
		if _, err := e.kube.CoreV1().Secrets(f.ns).Create(e.ctx(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name},
			Type: corev1.SecretTypeTLS, Data: map[string][]byte{"tls.crt": crt, "tls.key": key}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	secret("valid", f.cert, f.key)
	secret("malformed", []byte("Hello world\n"), []byte("Hello world\n"))
	var listeners []gwv1.Listener
	for i, name := range []string{"valid", "malformed", "missing"} {
		listeners = append(listeners, gwv1.Listener{Name: gwv1.SectionName(name), Port: gwv1.PortNumber(8443 + i), Protocol: gwv1.HTTPSProtocolType,
			TLS: &gwv1.ListenerTLSConfig{CertificateRefs: []gwv1.SecretObjectReference{{Name: gwv1.ObjectName(name)}}}})
	}
	if _, err := f.gw.GatewayV1().Gateways(f.ns).Create(e.ctx(), &gwv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: "tls"},
		Spec:       gwv1.GatewaySpec{GatewayClassName: gwv1.ObjectName(prefix + "-" + e.id), Listeners: listeners},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.kube.CoreV1().Services(f.ns).Create(e.ctx(), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "backend"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 443}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	port, section := gwv1.PortNumber(443), gwv1.SectionName("valid")
	if _, err := f.gw.GatewayV1().HTTPRoutes(f.ns).Create(e.ctx(), &gwv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Name: "to-backend"},
		Spec: gwv1.HTTPRouteSpec{
			CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{{Name: "tls", SectionName: &section}}},
			Rules: []gwv1.HTTPRouteRule{{BackendRefs: []gwv1.HTTPBackendRef{{BackendRef: gwv1.BackendRef{
				BackendObjectReference: gwv1.BackendObjectReference{Name: "backend", Port: &port}}}}}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.gw.GatewayV1().BackendTLSPolicies(f.ns).Create(e.ctx(), &gwv1.BackendTLSPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "backend"},
		Spec: gwv1.BackendTLSPolicySpec{
			TargetRefs: []gwv1.LocalPolicyTargetReferenceWithSectionName{{LocalPolicyTargetReference: gwv1.LocalPolicyTargetReference{
				Kind: "Service", Name: "backend"}}},
			Validation: gwv1.BackendTLSPolicyValidation{Hostname: "backend.example.com",
				CACertificateRefs: []gwv1.LocalObjectReference{{Kind: "ConfigMap", Name: "ca"}}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return f
}

// listener returns the status and reason of the listener's condition, "" when there is none.
func (f *tlsFixture) listener(name, condition string) (status, reason string) {
	g, err := f.gw.GatewayV1().Gateways(f.ns).Get(f.e.ctx(), "tls", metav1.GetOptions{})
	if err != nil {
		return "", ""
	}
	for _, l := range g.Status.Listeners {
		if string(l.Name) != name {
			continue
		}
		if c := meta.FindStatusCondition(l.Conditions, condition); c != nil {
			return string(c.Status), c.Reason
		}
	}
	return "", ""
}

// policy returns the status and reason of the BackendTLSPolicy's condition for its ancestor.
func (f *tlsFixture) policy(condition string) (status, reason string) {
	p, err := f.gw.GatewayV1().BackendTLSPolicies(f.ns).Get(f.e.ctx(), "backend", metav1.GetOptions{})
	if err != nil || len(p.Status.Ancestors) == 0 {
		return "", ""
	}
	if c := meta.FindStatusCondition(p.Status.Ancestors[0].Conditions, condition); c != nil {
		return string(c.Status), c.Reason
	}
	return "", ""
}

// The listeners' certificateRefs are checked against their Secrets as istiod checks them: a
// missing or malformed one makes the listener ResolvedRefs False InvalidCertificateRef and
// Programmed False, a valid one True; fixing the Secrets later (one updated, one created) flips
// them. The BackendTLSPolicy's CA ConfigMap likewise.
func TestKubeGatewayStatusCertificateRefs(t *testing.T) {
	e := newKenv(t, sharedKube(t))
	f := newTLSFixture(t, e, "gwc")
	e.start("pod", func(c *configingest.Config) { c.GatewaySecrets = true })
	want := func(listener, condition, status, reason string) {
		t.Helper()
		waitFor(t, fmt.Sprintf("listener %s %s %s %s", listener, condition, status, reason), func() bool {
			s, r := f.listener(listener, condition)
			return s == status && r == reason
		})
	}
	want("valid", "ResolvedRefs", "True", "ResolvedRefs")
	want("valid", "Programmed", "True", "Programmed")
	for _, l := range []string{"malformed", "missing"} {
		want(l, "ResolvedRefs", "False", "InvalidCertificateRef")
		want(l, "Programmed", "False", "Invalid")
	}
	waitFor(t, "the BackendTLSPolicy's missing CA refused", func() bool {
		s, r := f.policy("ResolvedRefs")
		a, ar := f.policy("Accepted")
		return s == "False" && r == "InvalidCACertificateRef" && a == "False" && ar == "NoValidCACertificate"
	})
	g, err := f.gw.GatewayV1().Gateways(f.ns).Get(e.ctx(), "tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range g.Status.Listeners {
		c := meta.FindStatusCondition(l.Conditions, "ResolvedRefs")
		switch l.Name {
		case "malformed":
			if !strings.Contains(c.Message, "the certificate is malformed") {
				t.Errorf("listener malformed: message %q", c.Message)
			}
		case "missing":
			if !strings.Contains(c.Message, "secret "+f.ns+"/missing not found") {
				t.Errorf("listener missing: message %q", c.Message)
			}
		}
	}

	fixed, err := e.kube.CoreV1().Secrets(f.ns).Get(e.ctx(), "malformed", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fixed.Data = map[string][]byte{"tls.crt": f.cert, "tls.key": f.key}
	// One at a time: each change alone must recompute the status.
	if _, err := e.kube.CoreV1().Secrets(f.ns).Update(e.ctx(), fixed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("malformed", "ResolvedRefs", "True", "ResolvedRefs")
	want("malformed", "Programmed", "True", "Programmed")
	if _, err := e.kube.CoreV1().Secrets(f.ns).Create(e.ctx(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "missing"},
		Type: corev1.SecretTypeTLS, Data: map[string][]byte{"tls.crt": f.cert, "tls.key": f.key}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("missing", "ResolvedRefs", "True", "ResolvedRefs")
	want("missing", "Programmed", "True", "Programmed")
	if _, err := e.kube.CoreV1().ConfigMaps(f.ns).Create(e.ctx(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "ca"},
		Data: map[string]string{"ca.crt": string(f.cert)}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the BackendTLSPolicy accepted once its CA exists", func() bool {
		s, _ := f.policy("ResolvedRefs")
		a, _ := f.policy("Accepted")
		return s == "True" && a == "True"
	})
}

// With --gateway-secrets=false nothing is read and references are taken as valid.
func TestKubeGatewayStatusCertificateRefsOff(t *testing.T) {
	e := newKenv(t, sharedKube(t))
	f := newTLSFixture(t, e, "gwo")
	e.start("pod", func(c *configingest.Config) { c.GatewaySecrets = false })
	for _, l := range []string{"valid", "malformed", "missing"} {
		waitFor(t, "listener "+l+" ResolvedRefs True", func() bool {
			s, _ := f.listener(l, "ResolvedRefs")
			return s == "True"
		})
	}
}

// The status is computed over the namespaces the discoverySelectors admit, as the bus carries
// them (istiod's Gateway API informers are filtered by the discovery namespaces): a route
// outside them is neither Accepted nor counted in attachedRoutes, until its namespace is
// selected.
func TestKubeGatewayStatusDiscoverySelectors(t *testing.T) {
	e := newKenv(t, sharedKube(t))
	sel := map[string]string{"mesh-" + e.id: "yes"}
	e.setMesh("discoverySelectors:\n- matchLabels: {mesh-" + e.id + ": \"yes\"}\n")
	gw, err := gwclient.NewForConfig(e.k.RestConfig())
	if err != nil {
		t.Fatal(err)
	}
	gwNS, in, out := e.ns("gwd", sel), e.ns("rin", sel), e.ns("rout", nil)
	class := "gwd-" + e.id
	if _, err := gw.GatewayV1().GatewayClasses().Create(e.ctx(), &gwv1.GatewayClass{
		ObjectMeta: metav1.ObjectMeta{Name: class}, Spec: gwv1.GatewayClassSpec{ControllerName: gatewayapi.ControllerName},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = gw.GatewayV1().GatewayClasses().Delete(context.Background(), class, metav1.DeleteOptions{})
	})
	all := gwv1.NamespacesFromAll
	if _, err := gw.GatewayV1().Gateways(gwNS).Create(e.ctx(), &gwv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: "gw"},
		Spec: gwv1.GatewaySpec{GatewayClassName: gwv1.ObjectName(class), Listeners: []gwv1.Listener{{
			Name: "http", Port: 80, Protocol: gwv1.HTTPProtocolType,
			AllowedRoutes: &gwv1.AllowedRoutes{Namespaces: &gwv1.RouteNamespaces{From: &all}},
		}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	gwns := gwv1.Namespace(gwNS)
	for _, ns := range []string{in, out} {
		if _, err := gw.GatewayV1().HTTPRoutes(ns).Create(e.ctx(), &gwv1.HTTPRoute{
			ObjectMeta: metav1.ObjectMeta{Name: "r"},
			Spec:       gwv1.HTTPRouteSpec{CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{{Name: "gw", Namespace: &gwns}}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	accepted := func(ns string) bool {
		f := &gwFixture{e: e, gw: gw, ns: ns}
		return f.accepted("r")
	}
	attached := func() int32 {
		g, err := gw.GatewayV1().Gateways(gwNS).Get(e.ctx(), "gw", metav1.GetOptions{})
		if err != nil || len(g.Status.Listeners) == 0 {
			return -1
		}
		return g.Status.Listeners[0].AttachedRoutes
	}
	e.start("pod-0", nil)
	waitFor(t, "the selected namespace's route Accepted, the only one attached", func() bool { return accepted(in) && attached() == 1 })
	if accepted(out) {
		t.Error("the route outside the discoverySelectors was written Accepted")
	}
	// Selecting its namespace brings the route in.
	n, err := e.kube.CoreV1().Namespaces().Get(e.ctx(), out, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Labels = sel
	if _, err := e.kube.CoreV1().Namespaces().Update(e.ctx(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the newly selected namespace's route Accepted and attached", func() bool { return accepted(out) && attached() == 2 })
}
