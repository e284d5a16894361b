package inject

import (
	"cmp"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"
	jsonpatchapply "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"sailplane.dev/shared/golden"
	"sailplane.dev/shared/testlog"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// goldenResult is what golden.yaml holds for a case: the answer, and the pod the API server
// stores once it applied the patch.
type goldenResult struct {
	Allowed  bool     `json:"allowed"`
	Message  string   `json:"message,omitempty"`
	Warnings []string `json:"warnings,omitempty"`
	// Patch is the JSON patch, its operations sorted by path: the library's order varies from
	// run to run (the order that matters is checked by applying it).
	Patch []map[string]any `json:"patch,omitempty"`
	Pod   json.RawMessage  `json:"pod,omitempty"`
}

// TestGolden admits each testdata/<case>/input.yaml (a Pod) with the built-in templates and
// compares the answer and the patched pod with golden.yaml. For every case it also checks that
// the patch, applied as the API server does, gives the pod the templates produced, and that
// admitting that pod again gives an empty patch (idempotence).
func TestGolden(t *testing.T) {
	inj := builtIn(t)
	for _, dir := range golden.Cases(t, "testdata") {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			input, err := os.ReadFile(filepath.Join(dir, "input.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			podJSON := normalized(t, input)
			resp := inj.Admit(podRequest(podJSON))
			got := goldenResult{Allowed: resp.Allowed, Warnings: resp.Warnings}
			if resp.Result != nil {
				got.Message = resp.Result.Message
			}
			if resp.Patch != nil {
				if resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
					t.Fatalf("patch type %v, want JSONPatch", resp.PatchType)
				}
				if err := json.Unmarshal(resp.Patch, &got.Patch); err != nil {
					t.Fatal(err)
				}
				slices.SortStableFunc(got.Patch, func(a, b map[string]any) int {
					return cmp.Or(cmp.Compare(a["path"].(string), b["path"].(string)), cmp.Compare(a["op"].(string), b["op"].(string)))
				})
				patched := applyPatch(t, podJSON, resp.Patch)
				got.Pod = patched
				checkMatchesInjector(t, inj, podJSON, patched)
				checkIdempotent(t, inj, patched)
			}
			out, err := yaml.Marshal(got)
			if err != nil {
				t.Fatal(err)
			}
			golden.Compare(t, filepath.Join(dir, "golden.yaml"), out)
		})
	}
}

// checkMatchesInjector: the patch applied to the input is exactly the pod the templates made.
func checkMatchesInjector(t *testing.T, inj *Injector, input, patched []byte) {
	t.Helper()
	var pod corev1.Pod
	if err := json.Unmarshal(input, &pod); err != nil {
		t.Fatal(err)
	}
	set, _ := inj.current()
	want, err := set.inject(&pod, "default", inj.cfg.Mesh())
	if err != nil {
		t.Fatal(err)
	}
	var got corev1.Pod
	if err := json.Unmarshal(patched, &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&got, want) {
		w, _ := yaml.Marshal(want)
		t.Errorf("the patched pod differs from the injected one; injected:\n%s", w)
	}
}

func checkIdempotent(t *testing.T, inj *Injector, injected []byte) {
	t.Helper()
	again := inj.Admit(podRequest(injected))
	if !again.Allowed || again.Patch != nil {
		t.Errorf("admitting the injected pod again: allowed %v, patch %s; want allowed with no patch", again.Allowed, again.Patch)
	}
}

// normalized is the pod as the API server sends it: encoded from its Go type.
func normalized(t *testing.T, podYAML []byte) []byte {
	t.Helper()
	var pod corev1.Pod
	if err := yaml.UnmarshalStrict(podYAML, &pod); err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(&pod)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func applyPatch(t *testing.T, doc, patch []byte) []byte {
	t.Helper()
	p, err := jsonpatchapply.DecodePatch(patch)
	if err != nil {
		t.Fatalf("the patch does not decode: %v", err)
	}
	out, err := p.Apply(doc)
	if err != nil {
		t.Fatalf("the patch does not apply: %v\n%s", err, patch)
	}
	return out
}

func podRequest(pod []byte) *admissionv1.AdmissionRequest {
	var meta struct {
		Metadata struct{ Namespace string } `json:"metadata"`
	}
	_ = json.Unmarshal(pod, &meta)
	return &admissionv1.AdmissionRequest{
		UID:       "test",
		Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
		Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
		Namespace: meta.Metadata.Namespace,
		Operation: admissionv1.Create,
		Object:    runtime.RawExtension{Raw: pod},
	}
}

// builtIn returns a running Injector with the built-in templates (a folder that does not exist).
func builtIn(t *testing.T) *Injector {
	t.Helper()
	return runInjector(t, Config{}, Deps{Logger: testlog.New(t, slog.LevelInfo), Dir: filepath.Join(t.TempDir(), "absent")})
}

func runInjector(t *testing.T, cfg Config, deps Deps) *Injector {
	t.Helper()
	inj, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- inj.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case <-inj.Ready():
	case <-time.After(time.Minute):
		t.Fatal("the injector did not load its templates")
	}
	return inj
}
