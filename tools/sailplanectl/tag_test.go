package main

import (
	"context"
	"os"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"sailplane.dev/shared/revision"
	"sailplane.dev/tools/testenv"
)

// installInjectors creates the default revision's injector configuration as deploy/base ships
// it, and a canary revision's (its rev.* webhooks, selecting istio.io/rev=canary, calling the
// canary's webhook Service).
func installInjectors(t *testing.T, kc kubernetes.Interface) {
	t.Helper()
	raw, err := os.ReadFile("../../deploy/base/webhooks.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var def admissionregistrationv1.MutatingWebhookConfiguration
	if err := yaml.Unmarshal([]byte(strings.Split(string(raw), "\n---\n")[0]), &def); err != nil {
		t.Fatal(err)
	}
	if def.Kind != "MutatingWebhookConfiguration" || def.Labels[revision.Label] != "default" {
		t.Fatalf("deploy/base/webhooks.yaml: first document is %s %s, want the default revision's injector", def.Kind, def.Name)
	}
	canary := def.DeepCopy()
	canary.Name, canary.Labels[revision.Label] = "sailplane-sidecar-injector-canary", "canary"
	canary.Webhooks = nil
	for _, w := range def.Webhooks {
		if !strings.HasPrefix(w.Name, "rev.") {
			continue
		}
		w = *w.DeepCopy()
		w.ClientConfig.Service.Name = "sailplane-webhook-canary"
		for _, sel := range []*metav1.LabelSelector{w.NamespaceSelector, w.ObjectSelector} {
			for i, e := range sel.MatchExpressions {
				if e.Key == revision.Label && e.Operator == metav1.LabelSelectorOpIn {
					sel.MatchExpressions[i].Values = []string{"canary"}
				}
			}
		}
		canary.Webhooks = append(canary.Webhooks, w)
	}
	for _, w := range []*admissionregistrationv1.MutatingWebhookConfiguration{&def, canary} {
		if _, err := kc.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(context.Background(), w, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// tag set/list/remove on a real API server, in istioctl's layout: the tag's webhooks are the
// revision's rev.* ones, calling its service, selecting istio.io/rev=<tag>; moving needs
// --overwrite; removing one still used by namespaces needs --force.
func TestTag(t *testing.T) {
	k := testenv.KubeForTest(t)
	kc, err := kubernetes.NewForConfig(k.RestConfig())
	if err != nil {
		t.Fatal(err)
	}
	installInjectors(t, kc)
	kcfg := "--kubeconfig=" + k.KubeconfigPath()
	webhook := func() *admissionregistrationv1.MutatingWebhookConfiguration {
		w, err := kc.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(context.Background(), "istio-revision-tag-prod", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	if out, err := run(t, "tag", "set", "prod", "--revision", "default", kcfg); err != nil {
		t.Fatalf("tag set: %v\n%s", err, out)
	}
	w := webhook()
	if w.Labels[revision.TagLabel] != "prod" || w.Labels[revision.Label] != "default" || len(w.Webhooks) != 2 {
		t.Fatalf("tag webhook: labels %v, %d webhooks; want istio.io/tag=prod, istio.io/rev=default, the 2 rev.* webhooks", w.Labels, len(w.Webhooks))
	}
	for _, wh := range w.Webhooks {
		if wh.ClientConfig.Service.Name != "sailplane-webhook" {
			t.Errorf("%s calls %s, want the default revision's sailplane-webhook", wh.Name, wh.ClientConfig.Service.Name)
		}
	}
	if got := w.Webhooks[0].NamespaceSelector.MatchExpressions[0]; got.Key != revision.Label || strings.Join(got.Values, ",") != "prod" {
		t.Errorf("namespace webhook selects %v, want istio.io/rev In [prod]", got)
	}
	if got := w.Webhooks[1].ObjectSelector.MatchExpressions[1]; got.Key != revision.Label || strings.Join(got.Values, ",") != "prod" {
		t.Errorf("object webhook selects %v, want istio.io/rev In [prod]", got)
	}

	// Moving the tag needs --overwrite; a tag cannot be named as a revision, nor name a missing one.
	for _, args := range [][]string{
		{"tag", "set", "prod", "--revision", "canary"},
		{"tag", "set", "canary", "--revision", "default"},
		{"tag", "set", "other", "--revision", "missing"},
	} {
		if out, err := run(t, append(args, kcfg)...); err == nil {
			t.Errorf("%v succeeded: %s", args, out)
		}
	}
	if out, err := run(t, "tag", "set", "prod", "--revision", "canary", "--overwrite", kcfg); err != nil {
		t.Fatalf("tag set --overwrite: %v\n%s", err, out)
	}
	if w := webhook(); w.Labels[revision.Label] != "canary" || w.Webhooks[0].ClientConfig.Service.Name != "sailplane-webhook-canary" {
		t.Errorf("moved tag: labels %v, calls %s; want the canary's", w.Labels, w.Webhooks[0].ClientConfig.Service.Name)
	}

	if _, err := kc.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: "app", Labels: map[string]string{revision.Label: "prod"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "tag", "list", kcfg)
	if err != nil || !strings.Contains(out, "prod") || !strings.Contains(out, "canary") || !strings.Contains(out, "app") {
		t.Errorf("tag list: %v\n%s\nwant prod → canary, used by app", err, out)
	}
	if out, err := run(t, "tag", "remove", "prod", kcfg); err == nil || !strings.Contains(err.Error(), "app") {
		t.Errorf("tag remove of a tag in use: %v %s; want refused, naming namespace app", err, out)
	}
	if out, err := run(t, "tag", "remove", "prod", "--force", kcfg); err != nil {
		t.Fatalf("tag remove --force: %v\n%s", err, out)
	}
	if _, err := kc.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(context.Background(), "istio-revision-tag-prod", metav1.GetOptions{}); err == nil {
		t.Error("the tag's webhook configuration is still there")
	}
}

// The default tag, as istioctl's: it names the canary for unlabelled namespaces, those labelled
// istio-injection=enabled or istio.io/rev=default and pods labelled sidecar.istio.io/inject=true,
// and the default revision's injector is deactivated meanwhile; removing the tag restores it.
func TestDefaultTag(t *testing.T) {
	k := testenv.KubeForTest(t)
	kc, err := kubernetes.NewForConfig(k.RestConfig())
	if err != nil {
		t.Fatal(err)
	}
	installInjectors(t, kc)
	kcfg := "--kubeconfig=" + k.KubeconfigPath()
	get := func(name string) *admissionregistrationv1.MutatingWebhookConfiguration {
		w, err := kc.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	before := get("sailplane-sidecar-injector")
	if out, err := run(t, "tag", "set", "default", "--revision", "canary", kcfg); err != nil {
		t.Fatalf("tag set default: %v\n%s", err, out)
	}

	tag := get("istio-revision-tag-default")
	if tag.Labels[revision.TagLabel] != "default" || tag.Labels[revision.Label] != "canary" {
		t.Errorf("default tag labels %v, want istio.io/tag=default, istio.io/rev=canary", tag.Labels)
	}
	selects := map[string]string{}
	for _, wh := range tag.Webhooks {
		if wh.ClientConfig.Service.Name != "sailplane-webhook-canary" {
			t.Errorf("%s calls %s, want the canary's webhook", wh.Name, wh.ClientConfig.Service.Name)
		}
		ns, _ := metav1.LabelSelectorAsSelector(wh.NamespaceSelector)
		obj, _ := metav1.LabelSelectorAsSelector(wh.ObjectSelector)
		selects[wh.Name] = ns.String() + " / " + obj.String()
	}
	want := map[string]string{
		"rev.namespace.sidecar-injector.sailplane.dev": "!istio-injection,istio.io/rev in (default),kubernetes.io/metadata.name notin (istio-system,kube-system) / sidecar.istio.io/inject notin (false)",
		"namespace.sidecar-injector.sailplane.dev":     "istio-injection in (enabled),kubernetes.io/metadata.name notin (istio-system,kube-system) / sidecar.istio.io/inject notin (false)",
		"rev.object.sidecar-injector.sailplane.dev":    "!istio-injection,!istio.io/rev,kubernetes.io/metadata.name notin (istio-system,kube-system) / istio.io/rev in (default),sidecar.istio.io/inject notin (false)",
		"object.sidecar-injector.sailplane.dev":        "!istio-injection,!istio.io/rev,kubernetes.io/metadata.name notin (istio-system,kube-system) / !istio.io/rev,sidecar.istio.io/inject in (true)",
	}
	for name, w := range want {
		if selects[name] != w {
			t.Errorf("default tag webhook %s selects %q, want %q", name, selects[name], w)
		}
	}
	if len(selects) != len(want) {
		t.Errorf("default tag webhooks %v, want the 4 of %v", selects, want)
	}

	for _, wh := range get("sailplane-sidecar-injector").Webhooks {
		// The API server defaults an absent objectSelector to {}: every object.
		if wh.NamespaceSelector.MatchLabels[revision.DeactivatedLabel] != "never-match" || len(wh.NamespaceSelector.MatchLabels) != 1 || len(wh.NamespaceSelector.MatchExpressions) != 0 {
			t.Errorf("default revision's %s still selects %v / %v, want deactivated", wh.Name, wh.NamespaceSelector, wh.ObjectSelector)
		}
	}

	if out, err := run(t, "tag", "remove", "default", kcfg); err != nil {
		t.Fatalf("tag remove default: %v\n%s", err, out)
	}
	after := get("sailplane-sidecar-injector")
	if _, ok := after.Annotations[revision.SelectorsAnnotation]; ok {
		t.Error("reactivated injector keeps the saved-selectors annotation")
	}
	for i, wh := range after.Webhooks {
		b := before.Webhooks[i]
		bns, _ := metav1.LabelSelectorAsSelector(b.NamespaceSelector)
		ans, _ := metav1.LabelSelectorAsSelector(wh.NamespaceSelector)
		bobj, _ := metav1.LabelSelectorAsSelector(b.ObjectSelector)
		aobj, _ := metav1.LabelSelectorAsSelector(wh.ObjectSelector)
		if bns.String() != ans.String() || bobj.String() != aobj.String() {
			t.Errorf("reactivated %s selects %s / %s, want its own %s / %s", wh.Name, ans, aobj, bns, bobj)
		}
	}
}
