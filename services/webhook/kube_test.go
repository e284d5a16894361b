package webhook

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sschema "k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"sailplane.dev/shared/config"
	"sailplane.dev/shared/testlog"
	"sailplane.dev/shared/testwait"
	"sailplane.dev/tools/testenv"
)

// shippedConfigurations are the configurations of deploy/base/webhooks.yaml, as shipped but for
// the API server calling url+path instead of the Service (it cannot resolve Services).
func shippedConfigurations(t *testing.T, url string) (*admissionregistrationv1.MutatingWebhookConfiguration, *admissionregistrationv1.ValidatingWebhookConfiguration) {
	t.Helper()
	data, err := os.ReadFile("../../deploy/base/webhooks.yaml")
	if err != nil {
		t.Fatal(err)
	}
	docs := config.SplitDocuments(data)
	if len(docs) != 2 {
		t.Fatalf("webhooks.yaml has %d documents, want 2", len(docs))
	}
	var mwc admissionregistrationv1.MutatingWebhookConfiguration
	var vwc admissionregistrationv1.ValidatingWebhookConfiguration
	if err := yaml.UnmarshalStrict(docs[0], &mwc); err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(docs[1], &vwc); err != nil {
		t.Fatal(err)
	}
	atURL := func(cc *admissionregistrationv1.WebhookClientConfig) {
		u := url + *cc.Service.Path
		cc.URL, cc.Service = &u, nil
	}
	for i := range mwc.Webhooks {
		atURL(&mwc.Webhooks[i].ClientConfig)
	}
	for i := range vwc.Webhooks {
		atURL(&vwc.Webhooks[i].ClientConfig)
	}
	return &mwc, &vwc
}

// forRevision turns the default revision's configurations into rev's, as the file's comment
// says: names and labels suffixed, the rev.* webhooks and the control plane's, selecting rev.
func forRevision(rev string, mwc *admissionregistrationv1.MutatingWebhookConfiguration, vwc *admissionregistrationv1.ValidatingWebhookConfiguration) {
	retarget := func(sels ...*metav1.LabelSelector) {
		for _, s := range sels {
			if s == nil {
				continue
			}
			for i, e := range s.MatchExpressions {
				if e.Key == RevisionLabel && slices.Contains(e.Values, DefaultRevision) {
					s.MatchExpressions[i].Values = []string{rev}
				}
			}
		}
	}
	mwc.Name, mwc.Labels[RevisionLabel] = ConfigName(mwc.Name, rev), rev
	mwc.Webhooks = slices.DeleteFunc(mwc.Webhooks, func(w admissionregistrationv1.MutatingWebhook) bool { return !strings.HasPrefix(w.Name, "rev.") })
	for _, w := range mwc.Webhooks {
		retarget(w.NamespaceSelector, w.ObjectSelector)
	}
	vwc.Name, vwc.Labels[RevisionLabel] = ConfigName(vwc.Name, rev), rev
	vwc.Webhooks = slices.DeleteFunc(vwc.Webhooks, func(w admissionregistrationv1.ValidatingWebhook) bool {
		return !strings.HasPrefix(w.Name, "rev.") && !strings.HasPrefix(w.Name, FailOpenPrefix)
	})
	for i := range vwc.Webhooks {
		w := &vwc.Webhooks[i]
		if strings.HasPrefix(w.Name, FailOpenPrefix) {
			w.ObjectSelector = &metav1.LabelSelector{MatchLabels: map[string]string{RevisionLabel: rev}}
		}
		retarget(w.NamespaceSelector, w.ObjectSelector)
	}
}

var virtualServices = k8sschema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "virtualservices"}

// object decodes one Kubernetes object from YAML.
func object(t *testing.T, y string) *unstructured.Unstructured {
	t.Helper()
	var obj map[string]any
	if err := yaml.Unmarshal([]byte(y), &obj); err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: obj}
}

// vs is a VirtualService named name whose first route has weight.
func vs(t *testing.T, name string, weight int) *unstructured.Unstructured {
	return object(t, fmt.Sprintf(`
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: %s}
spec:
  hosts: [reviews]
  http:
    - route:
        - {destination: {host: reviews, subset: v1}, weight: %d}
        - {destination: {host: reviews, subset: v2}, weight: %d}
`, name, weight, 100-weight))
}

// waitFor polls cond until it returns nil, failing t after a minute (generous: a loaded machine).
func waitFor(t *testing.T, what string, cond func() error) {
	t.Helper()
	testwait.For(t, time.Minute, what, cond)
}

// TestKubernetes runs the webhook behind the shipped configurations of a real kube-apiserver:
// each of three revisions patches its own configurations' caBundle, a validator turns to fail
// closed only once the API server reached its revision's webhook (never for the one it cannot), invalid config is refused at creation with the
// validator's message, warnings reach the client, pods are injected where the selectors say
// (once: an injected pod admitted again is unchanged), and with the webhook down the control
// plane's namespace and kube-system still take config while other namespaces are refused.
func TestKubernetes(t *testing.T) {
	k := testenv.KubeForTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	restCfg := k.RestConfig()
	seen := &testenv.WarningRecorder{}
	restCfg.WarningHandler = seen
	kc := kubernetes.NewForConfigOrDie(restCfg)
	dyn := dynamic.NewForConfigOrDie(restCfg)
	for _, ns := range []string{"istio-system", "shop"} {
		if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mutating := kc.AdmissionregistrationV1().MutatingWebhookConfigurations()
	validating := kc.AdmissionregistrationV1().ValidatingWebhookConfigurations()

	// The default revision's webhook, and its configurations as shipped.
	def := start(t, Config{Namespace: "istio-system", Kube: k.RestConfig(), PatchCABundle: true}, Deps{})
	mwc, vwc := shippedConfigurations(t, "https://"+def.Addr().String())
	if _, err := mutating.Create(ctx, mwc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := validating.Create(ctx, vwc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Two more revisions: canary, served like the default one, and dark, whose configurations
	// call an address nobody serves.
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	canary := start(t, Config{Namespace: "istio-system", Revision: "canary", Kube: k.RestConfig(), PatchCABundle: true}, Deps{})
	darkLog, darkMsgs := testlog.NewRecording(t, -4)
	dark := start(t, Config{Namespace: "istio-system", Revision: "dark", Kube: k.RestConfig(), PatchCABundle: true}, Deps{Logger: darkLog})
	for rev, addr := range map[string]string{"canary": canary.Addr().String(), "dark": closed.Addr().String()} {
		rmwc, rvwc := shippedConfigurations(t, "https://"+addr)
		forRevision(rev, rmwc, rvwc)
		if _, err := mutating.Create(ctx, rmwc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := validating.Create(ctx, rvwc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	bundles := func(name string) (all [][]byte, policies map[string]admissionregistrationv1.FailurePolicyType) {
		policies = map[string]admissionregistrationv1.FailurePolicyType{}
		if m, err := mutating.Get(ctx, name, metav1.GetOptions{}); err == nil {
			for _, w := range m.Webhooks {
				all = append(all, w.ClientConfig.CABundle)
			}
		}
		if v, err := validating.Get(ctx, name, metav1.GetOptions{}); err == nil {
			for _, w := range v.Webhooks {
				all, policies[w.Name] = append(all, w.ClientConfig.CABundle), *w.FailurePolicy
			}
		}
		return all, policies
	}
	patchedWith := func(roots []byte, names ...string) func() error {
		return func() error {
			for _, name := range names {
				all, _ := bundles(name)
				for i, b := range all {
					if !bytes.Equal(b, roots) {
						return fmt.Errorf("%s: webhook %d has caBundle %.40q…", name, i, b)
					}
				}
			}
			return nil
		}
	}

	t.Run("CABundleOwnedPerRevision", func(t *testing.T) {
		waitFor(t, "default revision's caBundle", patchedWith(def.cert.Roots(), InjectorConfigName, ValidatorConfigName))
		for rev, r := range map[string]*running{"canary": canary, "dark": dark} {
			waitFor(t, rev+"'s caBundle", patchedWith(r.cert.Roots(), ConfigName(InjectorConfigName, rev), ConfigName(ValidatorConfigName, rev)))
		}
		// Every patcher ran to completion on its own configurations: none took another's.
		if err := patchedWith(def.cert.Roots(), InjectorConfigName, ValidatorConfigName)(); err != nil {
			t.Error(err)
		}
	})

	t.Run("FailClosedOnceReached", func(t *testing.T) {
		for name, want := range map[string]map[string]admissionregistrationv1.FailurePolicyType{
			ValidatorConfigName: {"rev.validation.sailplane.dev": "Fail", "validation.sailplane.dev": "Fail", "control-plane.validation.sailplane.dev": "Ignore"},
			// Another revision's check is refused by its own control-plane webhook.
			ValidatorConfigName + "-canary": {"rev.validation.sailplane.dev": "Fail", "control-plane.validation.sailplane.dev": "Ignore"},
		} {
			waitFor(t, name+" failing closed", func() error {
				if _, policies := bundles(name); fmt.Sprint(policies) != fmt.Sprint(want) {
					return fmt.Errorf("failure policies %v, want %v", policies, want)
				}
				return nil
			})
		}
		// The dark revision's validator is never reached: it stays open, however often it is
		// checked.
		waitFor(t, "dark's reachability checks", func() error {
			if n := darkMsgs.Count("does not reach the validator yet"); n < 3 {
				return fmt.Errorf("%d checks", n)
			}
			return nil
		})
		if _, policies := bundles(ValidatorConfigName + "-dark"); policies["rev.validation.sailplane.dev"] != "Ignore" {
			t.Errorf("dark's failure policies %v: want Ignore, it was never reached", policies)
		}
	})

	vss := dyn.Resource(virtualServices)
	t.Run("InvalidRefused", func(t *testing.T) {
		_, err := vss.Namespace("shop").Create(ctx, vs(t, "bad", -150), metav1.CreateOptions{})
		want := `admission webhook "validation.sailplane.dev" denied the request: VirtualService shop/bad: spec.http[0].route[0].weight: must not be negative, got -150`
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("create: %v, want %q", err, want)
		}
		if _, err := vss.Namespace("shop").Create(ctx, vs(t, "good", 90), metav1.CreateOptions{}); err != nil {
			t.Errorf("a valid VirtualService: %v", err)
		}
	})

	t.Run("WarningHeader", func(t *testing.T) {
		se := object(t, `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: db}
spec:
  hosts: [db.example.com]
  ports: [{number: 5432, name: tcp, protocol: TCP}]
  resolution: NONE`)
		gvr := k8sschema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "serviceentries"}
		if _, err := dyn.Resource(gvr).Namespace("shop").Create(ctx, se, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		got := strings.Join(seen.Take(), "\n")
		if want := "ServiceEntry shop/db: spec.ports[0]: a TCP (or unset) protocol port needs spec.addresses"; !strings.Contains(got, want) {
			t.Errorf("warnings %q, want %q", got, want)
		}
	})

	t.Run("Injection", func(t *testing.T) {
		for ns, labels := range map[string]map[string]string{"injected": {"istio-injection": "enabled"}, "by-revision": {RevisionLabel: "default"}, "plain": nil} {
			if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: labels}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		pod := func(name string, labels map[string]string) *corev1.Pod {
			return &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
				Spec:       corev1.PodSpec{ServiceAccountName: "default", Containers: []corev1.Container{{Name: "app", Image: "example/app"}}},
			}
		}
		// The API server watches the two configurations apart: wait until it calls the injector
		// with the patched caBundle too.
		waitFor(t, "the API server calling the injector", func() error {
			_, err := kc.CoreV1().Pods("injected").Create(ctx, pod("dry-run", nil), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		})
		const statusAnnotation = "sidecar.istio.io/status"
		for _, tc := range []struct {
			ns, name string
			labels   map[string]string
			injected bool
		}{
			{"injected", "app", nil, true},
			{"by-revision", "app", nil, true},
			{"injected", "opted-out", map[string]string{"sidecar.istio.io/inject": "false"}, false},
			{"plain", "app", nil, false},
			{"plain", "asks", map[string]string{"sidecar.istio.io/inject": "true"}, true},
		} {
			got, err := kc.CoreV1().Pods(tc.ns).Create(ctx, pod(tc.name, tc.labels), metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("%s/%s: %v", tc.ns, tc.name, err)
			}
			var sidecars []string
			for _, c := range got.Spec.InitContainers {
				sidecars = append(sidecars, c.Name)
			}
			if _, injected := got.Annotations[statusAnnotation]; injected != tc.injected || tc.injected != slices.Contains(sidecars, "sailplane-agent") {
				t.Errorf("%s/%s: injected %v (init containers %v), want %v", tc.ns, tc.name, injected, sidecars, tc.injected)
			}
		}
		// Creating a pod from an injected pod's spec and metadata gives the same pod: injection
		// is idempotent as the API server applies it (defaults included).
		injected, err := kc.CoreV1().Pods("injected").Get(ctx, "app", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		copied := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "app-again", Labels: injected.Labels, Annotations: injected.Annotations},
			Spec:       *injected.Spec.DeepCopy(),
		}
		again, err := kc.CoreV1().Pods("injected").Create(ctx, copied, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !equality.Semantic.DeepEqual(again.Spec, injected.Spec) || again.Annotations[statusAnnotation] != injected.Annotations[statusAnnotation] {
			first, _ := yaml.Marshal(injected.Spec)
			second, _ := yaml.Marshal(again.Spec)
			t.Errorf("re-injected pod differs: first\n%s\nthen\n%s", first, second)
		}
	})

	t.Run("ControlPlaneNamespacesIndependent", func(t *testing.T) {
		def.stop(t)
		// Elsewhere the validator fails closed now that the webhook is down.
		waitFor(t, "refusal while the webhook is down", func() error {
			_, err := vss.Namespace("shop").Create(ctx, vs(t, "while-down", 90), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			if err == nil || !strings.Contains(err.Error(), `failed calling webhook "validation.sailplane.dev"`) {
				return fmt.Errorf("create in shop: %v, want the webhook's failure", err)
			}
			return nil
		})
		// Pods in a namespace labelled for injection are refused (the injector fails closed)...
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "while-down"},
			Spec:       corev1.PodSpec{ServiceAccountName: "default", Containers: []corev1.Container{{Name: "app", Image: "example/app"}}},
		}
		if _, err := kc.CoreV1().Pods("injected").Create(ctx, pod, metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "failed calling webhook") {
			t.Errorf("pod in an injected namespace with the webhook down: %v, want the webhook's failure", err)
		}
		for _, ns := range []string{"istio-system", "kube-system"} {
			if _, err := vss.Namespace(ns).Create(ctx, vs(t, "while-down", 90), metav1.CreateOptions{}); err != nil {
				t.Errorf("create in %s with the webhook down: %v", ns, err)
			}
			// ...but never in the control plane's namespaces, even labelled for injection.
			patch := []byte(`{"metadata": {"labels": {"istio-injection": "enabled"}}}`)
			if _, err := kc.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := kc.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				t.Errorf("pod in %s, labelled for injection, with the webhook down: %v", ns, err)
			}
		}
	})
}
