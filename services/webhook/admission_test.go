package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
)

const validVS = `
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: shop}
spec:
  hosts: [reviews]
  http:
    - route:
        - {destination: {host: reviews, subset: v1}, weight: 90}
        - {destination: {host: reviews, subset: v2}, weight: 10}
`

// Requests that are not admission reviews get an HTTP error saying why; objects Sailplane
// cannot read get a refusal naming the problem; nothing crashes the server.
func TestBadRequests(t *testing.T) {
	r := start(t, Config{}, Deps{})
	huge := strings.Replace(validVS, "hosts: [reviews]", "hosts: [reviews]\n  exportTo: ['"+strings.Repeat("x", 2<<20)+"']", 1)
	for _, tc := range []struct {
		name        string
		contentType string
		body        []byte
		status      int
		message     string // in the HTTP error or the refusal
	}{
		{name: "wrong media type", contentType: "text/plain", body: []byte("{}"), status: http.StatusUnsupportedMediaType, message: "want application/json"},
		{name: "empty body", body: nil, status: http.StatusBadRequest, message: "malformed admission review: EOF"},
		{name: "malformed JSON", body: []byte(`{"apiVersion": "admission.k8s.io/v1", "kind":`), status: http.StatusBadRequest, message: "malformed admission review"},
		{name: "a JSON array", body: []byte(`[1, 2]`), status: http.StatusBadRequest, message: "malformed admission review"},
		{name: "data after the review", body: append(review(t, admissionv1.Create, "shop", validVS), "{}"...), status: http.StatusBadRequest, message: "data after the JSON object"},
		{name: "not an admission review", body: []byte(`{"apiVersion": "v1", "kind": "Pod"}`), status: http.StatusBadRequest, message: `not an admission review: apiVersion "v1", kind "Pod"`},
		{name: "no request", body: []byte(`{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}`), status: http.StatusBadRequest, message: "the admission review has no request"},
		{name: "body over the limit", body: bytes.Repeat([]byte(" "), MaxRequestBytes+1), status: http.StatusRequestEntityTooLarge, message: "admission review larger than 6291456 bytes"},
		{name: "no object", body: review(t, admissionv1.Create, "shop", ""), status: http.StatusOK, message: "the admission request carries no object"},
		{name: "object over 1.5 MiB", body: review(t, admissionv1.Create, "shop", huge), status: http.StatusOK, message: "VirtualService shop/reviews: the object is 2097"},
		{name: "object not a mapping", body: review(t, admissionv1.Create, "shop", "[1, 2]"), status: http.StatusOK, message: "a document must be a mapping"},
		{name: "unknown kind", body: review(t, admissionv1.Create, "shop", "apiVersion: networking.istio.io/v1alpha3\nkind: EnvoyFilter\nmetadata: {name: f}\nspec: {}"), status: http.StatusOK, message: `EnvoyFilter shop/f: unknown kind networking.istio.io/v1alpha3 "EnvoyFilter"`},
		{name: "not an Istio group", body: review(t, admissionv1.Create, "shop", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}"), status: http.StatusOK, message: `unknown kind v1 "ConfigMap"`},
		{name: "unknown field", body: review(t, admissionv1.Create, "shop", strings.Replace(validVS, "spec:", "spec:\n  hostz: [a]", 1)), status: http.StatusOK, message: `VirtualService shop/reviews: spec.hostz: does not match schema: unknown field "hostz"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ct := tc.contentType
			if ct == "" {
				ct = "application/json"
			}
			resp, err := r.client.Post(r.url("/validate"), ct, bytes.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var out bytes.Buffer
			_, _ = out.ReadFrom(resp.Body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, out.String(), tc.status)
			}
			msg := out.String()
			if tc.status == http.StatusOK {
				d := decision(t, resp.StatusCode, out.Bytes())
				if d.Allowed || d.Result == nil || d.UID != "uid-1" {
					t.Fatalf("response %+v: want a refusal of uid-1", d)
				}
				msg = d.Result.Message
			}
			if !strings.Contains(msg, tc.message) {
				t.Errorf("message %q, want it to contain %q", msg, tc.message)
			}
		})
	}
	t.Run("GET", func(t *testing.T) {
		resp, err := r.client.Get(r.url("/validate"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("GET /validate: %d, want 405", resp.StatusCode)
		}
	})
	// Random damage to valid reviews: an HTTP error or a decision, never a crash or a 5xx.
	pod := "apiVersion: v1\nkind: Pod\nmetadata: {name: app, namespace: shop}\nspec: {serviceAccountName: default, containers: [{name: app, image: example/app}]}"
	for path, obj := range map[string]string{"/validate": validVS, "/inject": pod} {
		t.Run("mutations "+path, func(t *testing.T) { mutations(t, r, path, review(t, admissionv1.Create, "shop", obj)) })
	}
}

// mutations posts 300 random damages of the review good to path, then good itself, which must
// still be allowed.
func mutations(t *testing.T, r *running, path string, good []byte) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 300 {
		b := bytes.Clone(good)
		for n := 1 + rng.IntN(4); n > 0 && len(b) > 0; n-- {
			switch i := rng.IntN(len(b)); rng.IntN(3) {
			case 0:
				b[i] = byte(rng.IntN(256))
			case 1:
				b = b[:i]
			default:
				b = append(b[:i], b[i+1:]...)
			}
		}
		if status, body := r.post(t, path, b); status >= 500 {
			t.Fatalf("%d (%s) for %q", status, body, b)
		}
	}
	if status, body := r.post(t, path, good); !decision(t, status, body).Allowed {
		t.Errorf("the valid review after the mutations: %s", body)
	}
}

// The validator gives config-ingest's verdict and messages, Istio's warnings as admission
// warnings, and judges only CREATE and UPDATE.
func TestValidate(t *testing.T) {
	r := start(t, Config{Revision: "canary"}, Deps{})
	for _, tc := range []struct {
		name    string
		op      admissionv1.Operation
		obj     string
		allowed bool
		message string
		warning string
	}{
		{name: "valid", op: admissionv1.Create, obj: validVS, allowed: true},
		{name: "invalid weight", op: admissionv1.Update, obj: strings.Replace(validVS, "weight: 90", "weight: -190", 1),
			message: "VirtualService shop/reviews: spec.http[0].route[0].weight: must not be negative, got -190"},
		{name: "several errors, one per line", op: admissionv1.Create, obj: strings.Replace(strings.Replace(validVS, "weight: 90", "weight: -190", 1), "weight: 10", "weight: -1", 1),
			message: "spec.http[0].route[0].weight: must not be negative, got -190\nVirtualService shop/reviews: spec.http[0].route[1].weight: must not be negative, got -1"},
		{name: "warning", op: admissionv1.Create, allowed: true, obj: `
apiVersion: networking.istio.io/v1beta1
kind: ServiceEntry
metadata: {name: db}
spec:
  hosts: [db.example.com]
  ports: [{number: 5432, name: tcp, protocol: TCP}]
  resolution: NONE`, warning: "ServiceEntry shop/db: spec.ports[0]: a TCP (or unset) protocol port needs spec.addresses"},
		{name: "a version newer than Sailplane's", op: admissionv1.Create, obj: strings.Replace(validVS, "networking.istio.io/v1", "networking.istio.io/v2", 1), allowed: true},
		{name: "a newer version, invalid", op: admissionv1.Create, obj: strings.Replace(strings.Replace(validVS, "networking.istio.io/v1", "networking.istio.io/v2", 1), "weight: 90", "weight: -190", 1),
			message: "spec.http[0].route[0].weight: must not be negative"},
		{name: "delete is not judged", op: admissionv1.Delete, obj: strings.Replace(validVS, "weight: 90", "weight: -190", 1), allowed: true},
		{name: "readiness check of this revision", op: admissionv1.Create,
			obj:     strings.Replace(validVS, "namespace: shop}", "namespace: shop, annotations: {sailplane.dev/webhook-readiness-check: canary}}", 1),
			message: "the readiness check of revision canary is always refused"},
		{name: "readiness check of another revision", op: admissionv1.Create, allowed: true,
			obj: strings.Replace(validVS, "namespace: shop}", "namespace: shop, annotations: {sailplane.dev/webhook-readiness-check: default}}", 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := r.post(t, "/validate", review(t, tc.op, "shop", tc.obj))
			d := decision(t, status, body)
			if d.Allowed != tc.allowed {
				t.Fatalf("allowed %v (%+v), want %v", d.Allowed, d.Result, tc.allowed)
			}
			if tc.message != "" && (d.Result == nil || !strings.Contains(d.Result.Message, tc.message)) {
				t.Errorf("result %+v, want a message containing %q", d.Result, tc.message)
			}
			if got := strings.Join(d.Warnings, "\n"); tc.warning != "" && !strings.Contains(got, tc.warning) || tc.warning == "" && got != "" {
				t.Errorf("warnings %q, want %q", got, tc.warning)
			}
		})
	}
}

type panicking struct{}

func (panicking) Admit(*admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse { panic("boom") }
func (panicking) Run(context.Context) error                                          { return nil }
func (panicking) Ready() <-chan struct{}                                             { return nil }

// A handler that panics refuses that request; the server carries on.
func TestPanicRefuses(t *testing.T) {
	s, err := New(Config{Listen: "127.0.0.1:0"}, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	s.injector = panicking{}
	pod := "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: app, image: app}]}"
	req, _ := http.NewRequest(http.MethodPost, "/inject", bytes.NewReader(review(t, admissionv1.Create, "shop", pod)))
	req.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	s.routes().ServeHTTP(w, req)
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || w.Code != http.StatusOK {
		t.Fatalf("status %d, body %s: %v", w.Code, w.Body.String(), err)
	}
	if out.Response.Allowed || !strings.Contains(out.Response.Result.Message, "internal error admitting Pod shop/p") {
		t.Errorf("response %+v, want a refusal", out.Response)
	}
}

// /ready answers 200 once the webhook serves.
func TestReady(t *testing.T) {
	r := start(t, Config{}, Deps{})
	resp, err := r.client.Get(r.url("/ready"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/ready: %d, want 200", resp.StatusCode)
	}
}
