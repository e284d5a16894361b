package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"sailplane.dev/shared/testlog"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// running is a webhook serving on 127.0.0.1 for one test.
type running struct {
	*Server
	cancel context.CancelFunc
	done   chan error
	client *http.Client
}

// start runs a webhook until the test ends (or stop) and waits until it is Ready.
func start(t *testing.T, cfg Config, deps Deps) *running {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if deps.Logger == nil {
		deps.Logger = testlog.New(t, -4)
	}
	s, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Server: s, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- s.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	select {
	case <-s.Ready():
	case err := <-r.done:
		t.Fatalf("Run ended before Ready: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("not Ready after 30s")
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(s.cert.Roots()) {
		t.Fatal("no roots")
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}}
	r.client = &http.Client{Transport: tr, Timeout: 30 * time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	return r
}

// stop ends Run and checks it returned nil; idempotent.
func (r *running) stop(t testing.TB) {
	if r.done == nil {
		return
	}
	r.cancel()
	if err := <-r.done; err != nil {
		t.Errorf("Run: %v", err)
	}
	r.done = nil
}

func (r *running) url(path string) string { return "https://" + r.Addr().String() + path }

// post sends body to path as JSON; the status and body of the answer.
func (r *running) post(t *testing.T, path string, body []byte) (int, []byte) {
	t.Helper()
	resp, err := r.client.Post(r.url(path), "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

// review is an AdmissionReview of op on the object in objYAML (none when empty).
func review(t *testing.T, op admissionv1.Operation, namespace, objYAML string) []byte {
	t.Helper()
	req := &admissionv1.AdmissionRequest{UID: "uid-1", Operation: op, Namespace: namespace}
	if objYAML != "" {
		js, err := yaml.YAMLToJSON([]byte(objYAML))
		if err != nil {
			t.Fatal(err)
		}
		req.Object = runtime.RawExtension{Raw: js}
		var meta struct {
			APIVersion string            `json:"apiVersion"`
			Kind       string            `json:"kind"`
			Metadata   metav1.ObjectMeta `json:"metadata"`
		}
		_ = json.Unmarshal(js, &meta)
		req.Kind.Kind, req.Name = meta.Kind, meta.Metadata.Name
		// As the API server fills it in: the resource is the kind's plural.
		group, version, found := strings.Cut(meta.APIVersion, "/")
		if !found {
			group, version = "", meta.APIVersion
		}
		req.Resource = metav1.GroupVersionResource{Group: group, Version: version, Resource: strings.ToLower(meta.Kind) + "s"}
	}
	out, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Request: req,
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// decision decodes a 200 answer's AdmissionResponse.
func decision(t *testing.T, status int, body []byte) *admissionv1.AdmissionResponse {
	t.Helper()
	if status != http.StatusOK {
		t.Fatalf("status %d (%s), want 200", status, body)
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &out); err != nil || out.Response == nil {
		t.Fatalf("answer %s: %v", body, err)
	}
	return out.Response
}
