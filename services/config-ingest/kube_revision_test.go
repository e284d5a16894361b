package configingest_test

import (
	"context"
	"testing"

	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	configingest "sailplane.dev/services/config-ingest"
	"sailplane.dev/shared/revision"
	"sailplane.dev/shared/schema"
)

// setTag points tag at rev, as `sailplanectl tag set` does (revision.TagWebhook of an injector
// of rev's); it is removed at the end of the test.
func (e *kenv) setTag(tag, rev string) {
	e.t.Helper()
	none := admissionregistrationv1.SideEffectClassNone
	ignore := admissionregistrationv1.Ignore
	url := "https://127.0.0.1:1/inject"
	injector := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "injector-" + rev, Labels: map[string]string{revision.Label: rev}},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name: "rev.namespace.sidecar-injector.sailplane.dev", ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url},
			NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: revision.Label, Operator: metav1.LabelSelectorOpIn, Values: []string{rev}}}},
			SideEffects: &none, FailurePolicy: &ignore, AdmissionReviewVersions: []string{"v1"},
		}},
	}
	wh, err := revision.TagWebhook(tag, injector)
	if err != nil {
		e.t.Fatal(err)
	}
	whs := e.kube.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if old, err := whs.Get(e.ctx(), wh.Name, metav1.GetOptions{}); err == nil {
		wh.ResourceVersion = old.ResourceVersion
		_, err = whs.Update(e.ctx(), wh, metav1.UpdateOptions{})
		if err != nil {
			e.t.Fatal(err)
		}
		return
	}
	if _, err := whs.Create(e.ctx(), wh, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = whs.Delete(context.Background(), wh.Name, metav1.DeleteOptions{}) })
}

func (e *kenv) createLabelledVS(ns, name string, labels map[string]string) {
	e.t.Helper()
	if _, err := e.istio.NetworkingV1().VirtualServices(ns).Create(e.ctx(), &networkingv1.VirtualService{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: *vsSpec(name, 0),
	}, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// Two revisions side by side read the config that is theirs, as istiod's config client: the
// unlabelled config is both's, config labelled istio.io/rev for a revision (or a tag naming it)
// only that revision's; moving the tag moves its config, and moving it back rolls back.
func TestKubeRevisionConfig(t *testing.T) {
	e := newKenv(t, sharedKube(t))
	tag := "prod-" + e.id
	e.setTag(tag, "default")
	ns := e.ns("rev", nil)
	e.createLabelledVS(ns, "plain", nil)
	e.createLabelledVS(ns, "def", map[string]string{revision.Label: "default"})
	e.createLabelledVS(ns, "can", map[string]string{revision.Label: "canary"})
	e.createLabelledVS(ns, "tagged", map[string]string{revision.Label: tag})
	def := e.start("pod-default", nil)
	canary := e.start("pod-canary", func(c *configingest.Config) { c.Revision = "canary" })
	has := func(in *kingest, name string) bool { return in.rec.get(schema.VirtualService, ns+"/"+name) != nil }
	for _, c := range []struct {
		in       *kingest
		rev      string
		name     string
		expected bool
	}{
		{def, "default", "plain", true}, {def, "default", "def", true}, {def, "default", "can", false}, {def, "default", "tagged", true},
		{canary, "canary", "plain", true}, {canary, "canary", "def", false}, {canary, "canary", "can", true}, {canary, "canary", "tagged", false},
	} {
		if got := has(c.in, c.name); got != c.expected {
			t.Errorf("revision %s publishes %s: %v, want %v", c.rev, c.name, got, c.expected)
		}
	}
	// The canary upgrade: the tag moves to the canary, its config with it.
	e.setTag(tag, "canary")
	waitFor(t, "the tagged config moves to the canary", func() bool { return has(canary, "tagged") && !has(def, "tagged") })
	// Roll back.
	e.setTag(tag, "default")
	waitFor(t, "the tagged config back on the default revision", func() bool { return has(def, "tagged") && !has(canary, "tagged") })
	if !has(def, "plain") || !has(canary, "plain") {
		t.Error("unlabelled config left a revision")
	}
}

// The Gateway API status of a namespace labelled with a tag is written by the revision the tag
// names (istiod's TagWatcher.IsMine): moving the tag hands its Gateways over to the canary.
func TestKubeRevisionTagStatus(t *testing.T) {
	e := newKenv(t, sharedKube(t))
	tag := "prod-" + e.id
	e.setTag(tag, "default")
	f := newGWFixture(t, e, "gwt")
	n, err := e.kube.CoreV1().Namespaces().Get(e.ctx(), f.ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Labels[revision.Label] = tag
	if _, err := e.kube.CoreV1().Namespaces().Update(e.ctx(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	def := e.start("pod-default", steady)
	canary := e.start("pod-canary", func(c *configingest.Config) { steady(c); c.Revision = "canary" })
	gatewayWrites := func(in *kingest) float64 {
		return in.metrics.Value("sailplane_gateway_status_writes_total", "kind", "Gateway", "result", "written")
	}
	attached := func() int32 {
		g, err := f.gw.GatewayV1().Gateways(f.ns).Get(e.ctx(), "gw", metav1.GetOptions{})
		if err != nil || len(g.Status.Listeners) == 0 {
			return -1
		}
		return g.Status.Listeners[0].AttachedRoutes
	}
	f.route(t, "first", nil)
	waitFor(t, "the default revision (the tag's) writes the route and Gateway", func() bool {
		return f.accepted("first") && attached() == 1 && gatewayWrites(def) > 0
	})
	if gatewayWrites(canary) != 0 {
		t.Error("the canary wrote the status of a Gateway whose namespace's tag names the default revision")
	}
	e.setTag(tag, "canary")
	f.route(t, "second", nil)
	waitFor(t, "the canary writes the tagged namespace's status", func() bool {
		return f.accepted("second") && attached() == 2 && gatewayWrites(canary) > 0
	})
}

// A revision other than the default reads its mesh config from istio-<revision>, as istiod:
// the canary can be tried with its own mesh settings.
func TestKubeRevisionMeshConfigMap(t *testing.T) {
	e := newKenv(t, sharedKube(t))
	e.setMesh("trustDomain: default.example\n")
	if _, err := e.kube.CoreV1().ConfigMaps(e.cp).Create(e.ctx(), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "istio-canary"}, Data: map[string]string{"mesh": "trustDomain: canary.example\n"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	trust := func(in *kingest) string {
		m, _ := in.rec.body(schema.MeshConfig, "mesh").(*meshv1alpha1.MeshConfig)
		return m.GetTrustDomain()
	}
	def := e.start("pod-default", nil)
	canary := e.start("pod-canary", func(c *configingest.Config) { c.Revision = "canary" })
	if got := trust(def); got != "default.example" {
		t.Errorf("the default revision's trust domain %q, want default.example (ConfigMap istio)", got)
	}
	if got := trust(canary); got != "canary.example" {
		t.Errorf("the canary's trust domain %q, want canary.example (ConfigMap istio-canary)", got)
	}
}
