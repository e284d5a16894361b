package inject

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"sailplane.dev/shared/mesh"
)

// withConfig is the built-in config with its first lines (policy and selectors) replaced.
func withConfig(t *testing.T, head string) *templateSet {
	t.Helper()
	_, templates, ok := strings.Cut(string(DefaultConfig), "\ntemplates:\n")
	if !ok {
		t.Fatal("the built-in config has no templates key")
	}
	set, err := parseTemplates(rawTemplates{origin: "test", config: []byte(head + "\naliases: {sidecar: [agent, envoy], grpc-agent: [agent, grpc-app]}\ntemplates:\n" + templates)}, mesh.Default())
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// TestDecision: istiod's order of precedence, for each policy and selector.
func TestDecision(t *testing.T) {
	selectors := `
neverInjectSelector: [{matchLabels: {batch: "true"}}]
alwaysInjectSelector: [{matchExpressions: [{key: mesh, operator: In, values: ["yes"]}]}]`
	enabled := withConfig(t, "policy: enabled"+selectors)
	disabled := withConfig(t, "policy: disabled"+selectors)
	for _, tc := range []struct {
		name        string
		labels      map[string]string
		annotations map[string]string
		hostNetwork bool
		namespace   string
		enabled     bool // want with policy enabled
		disabled    bool // want with policy disabled
	}{
		{name: "nothing said: the policy", enabled: true, disabled: false},
		{name: "opt-in label", labels: map[string]string{labelInject: "true"}, enabled: true, disabled: true},
		{name: "opt-in annotation", annotations: map[string]string{labelInject: "true"}, enabled: true, disabled: true},
		{name: "opt-out label", labels: map[string]string{labelInject: "false"}},
		{name: "opt-out annotation", annotations: map[string]string{labelInject: "false"}},
		{name: "label over annotation", labels: map[string]string{labelInject: "false"}, annotations: map[string]string{labelInject: "true"}},
		{name: "never selector", labels: map[string]string{"batch": "true"}},
		{name: "never before always", labels: map[string]string{"batch": "true", "mesh": "yes"}},
		{name: "always selector", labels: map[string]string{"mesh": "yes"}, enabled: true, disabled: true},
		{name: "opt-in beats never selector", labels: map[string]string{"batch": "true", labelInject: "true"}, enabled: true, disabled: true},
		{name: "host network beats opt-in", labels: map[string]string{labelInject: "true"}, hostNetwork: true},
		{name: "kube-system beats opt-in", labels: map[string]string{labelInject: "true"}, namespace: "kube-system"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := tc.namespace
			if ns == "" {
				ns = "demo"
			}
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns, Labels: tc.labels, Annotations: tc.annotations},
				Spec:       corev1.PodSpec{HostNetwork: tc.hostNetwork},
			}
			if got, why, _ := enabled.decision(pod); got != tc.enabled {
				t.Errorf("policy enabled: inject %v (%s), want %v", got, why, tc.enabled)
			}
			if got, why, _ := disabled.decision(pod); got != tc.disabled {
				t.Errorf("policy disabled: inject %v (%s), want %v", got, why, tc.disabled)
			}
		})
	}
}

// TestBadTemplates: a config that cannot work is refused at load, naming where and what.
func TestBadTemplates(t *testing.T) {
	for _, tc := range []struct {
		name, config, values string
		want                 string
	}{
		{name: "not YAML", config: "policy: [", want: "ConfigMap x key config: "},
		{name: "unknown field", config: "polcy: enabled", want: `unknown field "polcy"`},
		{name: "bad policy", config: "policy: sometimes\ntemplates: {a: ''}\ndefaultTemplates: [a]", want: `policy: "sometimes" is neither enabled nor disabled`},
		{name: "missing default template", config: "templates: {a: ''}\ndefaultTemplates: [b]", want: `template "b" not found; have a`},
		{name: "alias to nothing", config: "templates: {a: ''}\ndefaultTemplates: [a]\naliases: {x: [a, c]}", want: `template "c" not found`},
		{name: "template does not parse", config: "templates: {a: '{{ if }}'}\ndefaultTemplates: [a]", want: "templates.a: template: a:1: missing value for if"},
		{name: "template does not run", config: "templates: {a: '{{ .Nope }}'}\ndefaultTemplates: [a]", want: "templates.a does not apply to a sample pod: template a: "},
		{name: "template is not a pod", config: "templates: {a: 'spec: {containerz: []}'}\ndefaultTemplates: [a]", want: `templates.a does not apply to a sample pod: template a does not produce a Pod: error unmarshaling JSON: while decoding JSON: json: unknown field "containerz"`},
		{name: "bad selector", config: "templates: {a: ''}\ndefaultTemplates: [a]\nneverInjectSelector: [{matchExpressions: [{key: x, operator: Sometimes}]}]", want: "neverInjectSelector[0]: "},
		{name: "values not a mapping", values: "[1]", want: "ConfigMap x key values: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw := rawTemplates{origin: "ConfigMap x"}
			if tc.config != "" {
				raw.config = []byte(tc.config)
			}
			if tc.values != "" {
				raw.values = []byte(tc.values)
			}
			_, err := parseTemplates(raw, mesh.Default())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestAdmitOtherRequests: what is not a Pod CREATE passes unchanged; what cannot be read is
// refused with a message, never a crash.
func TestAdmitOtherRequests(t *testing.T) {
	inj := builtIn(t)
	pod := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"demo"},"spec":{"containers":[{"name":"app","image":"app"}]}}`)
	for _, tc := range []struct {
		name    string
		req     *admissionv1.AdmissionRequest
		allowed bool
		code    int32
	}{
		{name: "no request", req: nil, code: http.StatusBadRequest},
		{name: "update", req: &admissionv1.AdmissionRequest{Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Operation: admissionv1.Update, Object: runtime.RawExtension{Raw: pod}}, allowed: true},
		{name: "subresource", req: &admissionv1.AdmissionRequest{Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Operation: admissionv1.Create, SubResource: "binding", Object: runtime.RawExtension{Raw: pod}}, allowed: true},
		{name: "other kind", req: &admissionv1.AdmissionRequest{Kind: metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}, Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: pod}}, allowed: true},
		{name: "malformed", req: &admissionv1.AdmissionRequest{Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: []byte(`{"spec":`)}}, code: http.StatusBadRequest},
		{name: "not a pod", req: &admissionv1.AdmissionRequest{Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: []byte(`{"spec":{"containers":"x"}}`)}}, code: http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := inj.Admit(tc.req)
			if resp.Allowed != tc.allowed || resp.Patch != nil {
				t.Fatalf("allowed %v patch %s, want allowed %v and no patch", resp.Allowed, resp.Patch, tc.allowed)
			}
			if !tc.allowed && (resp.Result == nil || resp.Result.Code != tc.code || resp.Result.Message == "") {
				t.Fatalf("result %+v, want code %d and a message", resp.Result, tc.code)
			}
		})
	}
}

// TestAdmitUsesTheNamespaceOfTheRequest: a pod created with no namespace in its body (as a
// ReplicaSet's are) is injected for the request's namespace, and the UID is echoed.
func TestAdmitUsesTheNamespaceOfTheRequest(t *testing.T) {
	inj := builtIn(t)
	req := podRequest([]byte(`{"metadata":{"generateName":"p-"},"spec":{"containers":[{"name":"app","image":"app"}]}}`))
	req.Namespace, req.UID = "kube-system", "abc"
	if resp := inj.Admit(req); !resp.Allowed || resp.Patch != nil || resp.UID != "abc" {
		t.Fatalf("kube-system pod: allowed %v patch %s uid %q; want allowed, no patch, uid abc", resp.Allowed, resp.Patch, resp.UID)
	}
	req.Namespace = "demo"
	resp := inj.Admit(req)
	var ops []map[string]any
	if err := json.Unmarshal(resp.Patch, &ops); err != nil || len(ops) == 0 {
		t.Fatalf("demo pod: patch %s (%v), want one", resp.Patch, err)
	}
}
