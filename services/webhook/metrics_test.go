package webhook

import (
	"bytes"
	"net/http"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"

	"sailplane.dev/shared/telemetry/telemetrytest"
)

// TestAdmissionMetrics: injection and validation requests count in istiod's metrics, each
// outcome under its own name or reason.
func TestAdmissionMetrics(t *testing.T) {
	metrics := telemetrytest.New(t)
	r := start(t, Config{}, Deps{MeterProvider: metrics.Provider()})
	validate := func(op admissionv1.Operation, obj string) *admissionv1.AdmissionResponse {
		t.Helper()
		status, out := r.post(t, "/validate", review(t, op, "shop", obj))
		return decision(t, status, out)
	}
	if !validate(admissionv1.Create, validVS).Allowed {
		t.Fatal("valid VirtualService refused")
	}
	validate(admissionv1.Update, strings.Replace(validVS, "weight: 90", "weight: -190", 1))
	validate(admissionv1.Create, "apiVersion: networking.istio.io/v1alpha3\nkind: EnvoyFilter\nmetadata: {name: f}\nspec: {}")
	if status, _ := r.post(t, "/validate", []byte("{")); status != http.StatusBadRequest {
		t.Fatalf("malformed review: %d", status)
	}

	pod := func(annotations string) string {
		return "apiVersion: v1\nkind: Pod\nmetadata: {name: app, namespace: shop" + annotations + "}\nspec: {serviceAccountName: default, containers: [{name: app, image: example/app}]}"
	}
	inject := func(annotations string) *admissionv1.AdmissionResponse {
		t.Helper()
		status, out := r.post(t, "/inject", review(t, admissionv1.Create, "shop", pod(annotations)))
		return decision(t, status, out)
	}
	if d := inject(""); len(d.Patch) == 0 {
		t.Fatalf("pod not injected: %+v", d)
	}
	if d := inject(", annotations: {sidecar.istio.io/inject: 'false'}"); !d.Allowed || len(d.Patch) != 0 {
		t.Fatalf("opted-out pod: %+v", d)
	}
	if d := inject(", annotations: {proxy.istio.io/config: '{[}'}"); d.Allowed {
		t.Fatalf("pod with a broken proxy config allowed: %+v", d)
	}
	resp, err := r.client.Post(r.url("/inject"), "text/plain", bytes.NewReader([]byte("{}")))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	scrape := metrics.Scrape()
	vs := []string{"group", "networking.istio.io", "version", "v1", "resource", "virtualservices"}
	for _, want := range []struct {
		name   string
		labels []string
		value  float64
	}{
		{"galley_validation_passed", vs, 1},
		{"galley_validation_failed", append(vs, "reason", "invalid_resource"), 1},
		{"galley_validation_failed", []string{"reason", "unknown_type"}, 1},
		{"galley_validation_http_error", []string{"status", "400"}, 1},
		{"sidecar_injection_requests_total", nil, 4},
		{"sidecar_injection_success_total", nil, 2},
		{"sidecar_injection_skip_total", nil, 1},
		{"sidecar_injection_failure_total", nil, 2},
		{"sidecar_injection_time_seconds", nil, 4},
	} {
		if got, _ := scrape.Value(want.name, want.labels...); got != want.value {
			t.Errorf("%s%v = %v, want %v", want.name, want.labels, got, want.value)
		}
	}
}
