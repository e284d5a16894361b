// Package inject adds Sailplane's sidecar to pods, as istiod's injector does: a Pod CREATE that
// the webhook configuration sends here is run through the injection templates (Istio's
// `istio-sidecar-injector` layout, reloaded live from a ConfigMap or a folder) and answered with
// an RFC 6902 JSON patch.
package inject

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"

	"gomodules.xyz/jsonpatch/v2"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"sailplane.dev/shared/capture"
	"sailplane.dev/shared/mesh"
)

// Config says which templates to use and what the injected proxies point at.
type Config struct {
	// Revision is the control plane's revision ("" or "default": the default one). It names the
	// ConfigMap (istio-sidecar-injector, or istio-sidecar-injector-<rev>) and is written in the
	// status annotation.
	Revision string
	// Namespace is the control plane's namespace, which holds the ConfigMap.
	Namespace string
	// Mesh returns the current mesh config, whose defaultConfig is the base of every pod's
	// ProxyConfig; nil means Istio's defaults.
	Mesh func() *meshv1alpha1.MeshConfig
}

// Deps are what the Injector reads its templates from: Kube in Kubernetes mode (the ConfigMap),
// else the folder Dir (files `config` and `values`).
type Deps struct {
	Logger *slog.Logger
	Kube   kubernetes.Interface
	Dir    string
}

// ConfigMapName is the injection ConfigMap of a revision, as istiod names it.
func ConfigMapName(revision string) string {
	if revision == "" || revision == "default" {
		return "istio-sidecar-injector"
	}
	return "istio-sidecar-injector-" + revision
}

// Injector answers Pod admission requests with the sidecar's patch.
type Injector struct {
	cfg    Config
	log    *slog.Logger
	source templateSource

	mu        sync.RWMutex
	templates *templateSet
	lastRaw   *rawTemplates // the version templates came from, so an unchanged one is not reparsed
	loadErr   error         // why the templates are not loaded yet, while templates is nil
	ready     chan struct{}
	readyOnce sync.Once
}

// templateSource delivers the raw `config` and `values` each time they change (nil for a key
// that is absent: the built-in default is used for it).
type templateSource interface {
	Run(ctx context.Context, update func(raw rawTemplates)) error
}

// rawTemplates is one version of the two keys, and where they came from, for messages.
type rawTemplates struct {
	origin string
	config []byte
	values []byte
}

func (r rawTemplates) equal(o rawTemplates) bool {
	sameBytes := func(a, b []byte) bool { return (a == nil) == (b == nil) && bytes.Equal(a, b) }
	return r.origin == o.origin && sameBytes(r.config, o.config) && sameBytes(r.values, o.values)
}

// New returns an Injector reading its templates from deps.Kube when set, else from deps.Dir.
func New(cfg Config, deps Deps) (*Injector, error) {
	if deps.Logger == nil {
		deps.Logger = slog.Default()
	}
	if cfg.Revision == "" {
		cfg.Revision = "default"
	}
	if cfg.Mesh == nil {
		def := mesh.Default()
		cfg.Mesh = func() *meshv1alpha1.MeshConfig { return def }
	}
	i := &Injector{cfg: cfg, log: deps.Logger.With("component", "inject"), ready: make(chan struct{}),
		loadErr: errors.New("the injection templates are not loaded yet")}
	switch {
	case deps.Kube != nil:
		if cfg.Namespace == "" {
			return nil, errors.New("inject: Config.Namespace is required with Kubernetes")
		}
		i.source = &configMapSource{client: deps.Kube, namespace: cfg.Namespace, name: ConfigMapName(cfg.Revision), log: i.log}
	case deps.Dir != "":
		i.source = &folderSource{dir: deps.Dir, log: i.log}
	default:
		return nil, errors.New("inject: either Deps.Kube or Deps.Dir is required")
	}
	return i, nil
}

// Run loads the templates and reloads them on every change until ctx ends. A version that does
// not load (bad YAML, a template that does not parse or render) is logged with its origin and
// the previous one stays in use.
func (i *Injector) Run(ctx context.Context) error {
	return i.source.Run(ctx, i.load)
}

// Ready is closed once templates were loaded once.
func (i *Injector) Ready() <-chan struct{} { return i.ready }

func (i *Injector) load(raw rawTemplates) {
	i.mu.RLock()
	same := i.lastRaw != nil && i.lastRaw.equal(raw)
	i.mu.RUnlock()
	if same {
		return
	}
	set, err := parseTemplates(raw, i.cfg.Mesh())
	if err != nil {
		i.log.Error("injection templates not loaded, keeping the previous ones", "error", err)
		i.mu.Lock()
		if i.templates == nil {
			i.loadErr = err
		}
		i.mu.Unlock()
		return
	}
	i.mu.Lock()
	i.templates, i.lastRaw = set, &raw
	i.mu.Unlock()
	i.log.Info("injection templates loaded", "from", raw.origin)
	i.readyOnce.Do(func() { close(i.ready) })
}

func (i *Injector) current() (*templateSet, error) {
	i.mu.RLock()
	defer i.mu.RUnlock()
	return i.templates, i.loadErr
}

// Admit answers one admission request: for a Pod CREATE, the patch adding the sidecar (empty when
// the pod needs none or already has it); anything else is allowed unchanged. A pod the templates
// cannot be applied to (a bad annotation value, a template naming what does not exist) is
// refused with a message naming the cause, as istiod does.
func (i *Injector) Admit(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	if req == nil {
		return refuse("", http.StatusBadRequest, errors.New("the AdmissionReview has no request"))
	}
	if req.Kind.Kind != "Pod" || req.Kind.Group != "" || req.Operation != admissionv1.Create || req.SubResource != "" {
		return &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	}
	var pod corev1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		return refuse(req.UID, http.StatusBadRequest, fmt.Errorf("sidecar injection: the object is not a Pod: %w", err))
	}
	// Managed fields change nothing in the result and can be large: the patch is computed without them.
	pod.ManagedFields = nil
	if pod.Namespace == "" {
		pod.Namespace = req.Namespace
	}
	log := i.log.With("pod", pod.Namespace+"/"+podName(&pod.ObjectMeta))

	set, err := i.current()
	if set == nil {
		log.Error("sidecar injection refused: no templates", "error", err)
		return refuse(req.UID, http.StatusServiceUnavailable, fmt.Errorf("sidecar injection: %w", err))
	}
	inject, why, warnings := set.decision(&pod)
	if !inject {
		log.Debug("sidecar injection skipped", "reason", why)
		return &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true, Warnings: warnings}
	}
	// A capture annotation that does not parse would leave the pod with half its rules: refuse
	// it here, naming the annotation, as istiod does.
	if _, err := capture.FromAnnotations(pod.Annotations, capture.Default()); err != nil {
		log.Warn("sidecar injection refused", "error", err)
		return refuse(req.UID, http.StatusBadRequest, fmt.Errorf("sidecar injection: %w", err))
	}
	original, err := json.Marshal(&pod)
	if err != nil {
		return refuse(req.UID, http.StatusBadRequest, fmt.Errorf("sidecar injection: %w", err))
	}
	injected, err := set.inject(&pod, i.cfg.Revision, i.cfg.Mesh())
	if err != nil {
		log.Warn("sidecar injection refused", "error", err)
		return refuse(req.UID, http.StatusBadRequest, fmt.Errorf("sidecar injection: %w", err))
	}
	patch, err := createPatch(original, injected)
	if err != nil {
		return refuse(req.UID, http.StatusInternalServerError, fmt.Errorf("sidecar injection: %w", err))
	}
	log.Info("sidecar injected", "reason", why, "operations", len(patch))
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true, Warnings: warnings}
	if len(patch) > 0 {
		data, err := json.Marshal(patch)
		if err != nil {
			return refuse(req.UID, http.StatusInternalServerError, fmt.Errorf("sidecar injection: %w", err))
		}
		pt := admissionv1.PatchTypeJSONPatch
		resp.Patch, resp.PatchType = data, &pt
	}
	return resp
}

func createPatch(original []byte, injected *corev1.Pod) ([]jsonpatch.Operation, error) {
	after, err := json.Marshal(injected)
	if err != nil {
		return nil, err
	}
	ops, err := jsonpatch.CreatePatch(original, after)
	if err != nil {
		return nil, fmt.Errorf("creating the patch: %w", err)
	}
	return ops, nil
}

func refuse(uid types.UID, code int32, err error) *admissionv1.AdmissionResponse {
	return &admissionv1.AdmissionResponse{UID: uid, Allowed: false, Result: &metav1.Status{
		Status: metav1.StatusFailure, Code: code, Message: err.Error(), Reason: reasonFor(code),
	}}
}

func reasonFor(code int32) metav1.StatusReason {
	switch code {
	case http.StatusBadRequest:
		return metav1.StatusReasonBadRequest
	case http.StatusServiceUnavailable:
		return metav1.StatusReasonServiceUnavailable
	default:
		return metav1.StatusReasonInternalError
	}
}

func podName(m *metav1.ObjectMeta) string {
	if m.Name != "" {
		return m.Name
	}
	if m.GenerateName != "" {
		return m.GenerateName + "*"
	}
	return "(unnamed)"
}
