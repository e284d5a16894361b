package inject

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/template"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// The built-in templates: used for a key the ConfigMap or folder does not have, and the source
// of deploy/base/injection/ and examples/etc/sailplane/injection/ (TestShippedDefaults keeps
// them equal).
var (
	//go:embed defaults/config
	DefaultConfig []byte
	//go:embed defaults/values
	DefaultValues []byte
)

// injectionConfig is the `config` key, in Istio's layout.
type injectionConfig struct {
	// Policy is "enabled" (inject unless the pod opts out) or "disabled" (only pods that opt
	// in); empty means enabled.
	Policy string `json:"policy"`
	// DefaultTemplates are applied, in order, to a pod that names none (default: sidecar).
	DefaultTemplates []string `json:"defaultTemplates"`
	// Templates are Go text/templates producing a partial Pod, strategic-merged into the pod.
	Templates map[string]string `json:"templates"`
	// Aliases name a list of templates with one name.
	Aliases map[string][]string `json:"aliases"`
	// NeverInjectSelector and AlwaysInjectSelector decide for pods that neither opt in nor out:
	// the first selector matching the pod's labels wins, never before always.
	NeverInjectSelector  []metav1.LabelSelector `json:"neverInjectSelector"`
	AlwaysInjectSelector []metav1.LabelSelector `json:"alwaysInjectSelector"`
	// InjectedAnnotations are added to every injected pod.
	InjectedAnnotations map[string]string `json:"injectedAnnotations"`
}

// templateSet is one loaded version of the templates.
type templateSet struct {
	origin              string
	enabled             bool
	defaults            []string
	aliases             map[string][]string
	templates           map[string]*template.Template
	never, always       []labels.Selector
	injectedAnnotations map[string]string
	values              map[string]any
}

// parseTemplates loads one version of the two keys, a nil key taking the built-in default, and
// renders every template for a sample pod so that a template that cannot work is refused now,
// not at the next pod.
func parseTemplates(raw rawTemplates, mc *meshv1alpha1.MeshConfig) (*templateSet, error) {
	configData, configOrigin := raw.config, raw.origin+" key config"
	if configData == nil {
		configData, configOrigin = DefaultConfig, "built-in config"
	}
	valuesData, valuesOrigin := raw.values, raw.origin+" key values"
	if valuesData == nil {
		valuesData, valuesOrigin = DefaultValues, "built-in values"
	}
	var cfg injectionConfig
	if err := yaml.UnmarshalStrict(configData, &cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", configOrigin, err)
	}
	set := &templateSet{
		origin:              raw.origin,
		defaults:            cfg.DefaultTemplates,
		aliases:             cfg.Aliases,
		templates:           map[string]*template.Template{},
		injectedAnnotations: cfg.InjectedAnnotations,
	}
	switch cfg.Policy {
	case "", "enabled":
		set.enabled = true
	case "disabled":
	default:
		return nil, fmt.Errorf("%s: policy: %q is neither enabled nor disabled", configOrigin, cfg.Policy)
	}
	if len(set.defaults) == 0 {
		set.defaults = []string{"sidecar"}
	}
	for field, in := range map[string][]metav1.LabelSelector{"neverInjectSelector": cfg.NeverInjectSelector, "alwaysInjectSelector": cfg.AlwaysInjectSelector} {
		for n, s := range in {
			sel, err := metav1.LabelSelectorAsSelector(&s)
			if err != nil {
				return nil, fmt.Errorf("%s: %s[%d]: %w", configOrigin, field, n, err)
			}
			if field == "neverInjectSelector" {
				set.never = append(set.never, sel)
			} else {
				set.always = append(set.always, sel)
			}
		}
	}
	if err := yaml.Unmarshal(valuesData, &set.values); err != nil {
		return nil, fmt.Errorf("%s: %w", valuesOrigin, err)
	}
	if set.values == nil {
		set.values = map[string]any{}
	}
	for _, name := range slices.Sorted(maps.Keys(cfg.Templates)) {
		t, err := template.New(name).Funcs(templateFuncs).Parse(cfg.Templates[name])
		if err != nil {
			return nil, fmt.Errorf("%s: templates.%s: %w", configOrigin, name, err)
		}
		set.templates[name] = t
	}
	for _, names := range append([][]string{set.defaults}, slices.Collect(maps.Values(set.aliases))...) {
		if err := set.known(names); err != nil {
			return nil, fmt.Errorf("%s: %w", configOrigin, err)
		}
	}
	// A dry run of each template, alone as a pod would name it.
	for name := range set.templates {
		sample := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "sample", Namespace: "default", Annotations: map[string]string{annoTemplates: name}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app"}}},
		}
		if _, err := set.inject(sample, "default", mc); err != nil {
			return nil, fmt.Errorf("%s: templates.%s does not apply to a sample pod: %w", configOrigin, name, err)
		}
	}
	return set, nil
}

// known checks that every name is a template or an alias.
func (s *templateSet) known(names []string) error {
	for _, n := range names {
		if _, ok := s.templates[n]; ok {
			continue
		}
		if _, ok := s.aliases[n]; ok {
			continue
		}
		have := slices.Sorted(maps.Keys(s.templates))
		have = slices.Sorted(slices.Values(append(have, slices.Collect(maps.Keys(s.aliases))...)))
		return fmt.Errorf("template %q not found; have %s", n, strings.Join(have, ", "))
	}
	return nil
}

// TemplateData is what a template sees: Istio's fields, plus values Sailplane computes from the
// annotations once validated (so templates need not repeat the rules).
type TemplateData struct {
	// DeploymentMeta names the workload owning the pod (its Deployment when made by one).
	DeploymentMeta metav1.ObjectMeta
	// ObjectMeta and Spec are the pod's, without a previous injection.
	ObjectMeta metav1.ObjectMeta
	Spec       corev1.PodSpec
	// ProxyConfig is the mesh's defaultConfig with the pod's proxy.istio.io/config over it.
	ProxyConfig *meshv1alpha1.ProxyConfig
	MeshConfig  *meshv1alpha1.MeshConfig
	// Values is the `values` key.
	Values   map[string]any
	Revision string
	// ProxyImage is sidecar.istio.io/proxyImage, else values global.proxy.image.
	ProxyImage string
	// CAAddress is values global.caAddress, else the ProxyConfig's discoveryAddress (Istio's rule).
	CAAddress string
	// ProxyLogLevel is Envoy's level: sidecar.istio.io/logLevel, else values global.proxy.logLevel.
	ProxyLogLevel string
	// AgentLogLevel is the agent's --log-level: sidecar.istio.io/agentLogLevel (a level, or
	// Istio's "scope:level,..." whose default scope counts), else values global.agent.logLevel.
	AgentLogLevel string
	// ProxyResources are the sidecar.istio.io/proxyCPU, proxyMemory, proxyCPULimit and
	// proxyMemoryLimit annotations, nil when none is set (Istio's rule: then the values' apply).
	ProxyResources *corev1.ResourceRequirements
	// ProxyUID and ProxyGID are the user the agent and Envoy run as: the pod's runAsUser and
	// runAsGroup when it sets them (so a proxyless application can read the key the agent
	// writes), else values global.proxy.uid (Istio's 1337); 1337 in TPROXY mode, as Istio's.
	ProxyUID, ProxyGID int64
	// CaptureArgs are the flags of `agent capture` (Istio's istio-iptables flags) for this pod:
	// its traffic.sidecar.istio.io/* annotations, the proxy's uid/gid and status port never
	// captured, DNS captured when proxyMetadata sets ISTIO_META_DNS_CAPTURE. Empty when the
	// pod's interceptionMode is NONE: no capture.
	CaptureArgs []string
	// CNI is values pilot.cni.enabled (Istio's): the node's CNI plugin installs the capture, the
	// pod gets no capture init container.
	CNI bool
	// DrainSeconds is the ProxyConfig's drainDuration in whole seconds (rounded up): Envoy's
	// --drain-time-s, as pilot-agent passes it.
	DrainSeconds int64
	// TerminationDrainSeconds is the ProxyConfig's terminationDrainDuration in whole seconds
	// (rounded up), at most the pod's terminationGracePeriodSeconds (the API server refuses a
	// longer preStop sleep): how long Envoy keeps draining once the pod terminates.
	TerminationDrainSeconds int64
}

// templateFuncs are the functions templates may call: Istio's injection helpers that make sense
// without sprig.
var templateFuncs = template.FuncMap{
	// annotation returns the object's annotation name, else def.
	"annotation": func(meta metav1.ObjectMeta, name string, def any) string {
		if v, ok := meta.Annotations[name]; ok {
			return v
		}
		return fmt.Sprint(def)
	},
	"isset": func(m map[string]string, key string) bool { _, ok := m[key]; return ok },
	"toJSON": func(v any) (string, error) {
		b, err := json.Marshal(v)
		return string(b), err
	},
	"protoToJSON": func(m proto.Message) (string, error) {
		b, err := protojson.Marshal(m)
		if err != nil {
			return "", err
		}
		// protojson's spacing is unstable on purpose; compact it so the output is.
		var out bytes.Buffer
		err = json.Compact(&out, b)
		return out.String(), err
	},
	"quote": func(v any) string { return strconv.Quote(fmt.Sprint(v)) },
	// default returns v unless it is empty (sprig's argument order, for pipelines).
	"default": func(def, v any) any {
		if empty(v) {
			return def
		}
		return v
	},
	// valueOrDefault is Istio's: v unless empty.
	"valueOrDefault": func(v, def any) any {
		if empty(v) {
			return def
		}
		return v
	},
	"contains": strings.Contains,
}

func empty(v any) bool {
	switch v := v.(type) {
	case nil:
		return true
	case string:
		return v == ""
	case bool:
		return !v
	case float64:
		return v == 0
	case int, int32, int64:
		return fmt.Sprint(v) == "0"
	case map[string]any:
		return len(v) == 0
	case []any:
		return len(v) == 0
	}
	return false
}
