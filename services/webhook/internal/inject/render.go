package inject

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"sigs.k8s.io/yaml"

	"sailplane.dev/shared/capture"
	"sailplane.dev/shared/mesh"
)

// Istio's names for what a pod says about its injection.
const (
	labelInject         = "sidecar.istio.io/inject" // label or annotation: "true" / "false"
	annoStatus          = "sidecar.istio.io/status"
	annoTemplates       = "inject.istio.io/templates"
	annoProxyConfig     = "proxy.istio.io/config"
	annoProxyImage      = "sidecar.istio.io/proxyImage"
	annoProxyCPU        = "sidecar.istio.io/proxyCPU"
	annoProxyMemory     = "sidecar.istio.io/proxyMemory"
	annoProxyCPULimit   = "sidecar.istio.io/proxyCPULimit"
	annoProxyMemLimit   = "sidecar.istio.io/proxyMemoryLimit"
	annoProxyLogLevel   = "sidecar.istio.io/logLevel"
	annoAgentLogLevel   = "sidecar.istio.io/agentLogLevel"
	istioDefaultAddress = "istiod.istio-system.svc:15012"
)

// ignoredNamespaces never get a sidecar, whatever the webhook configuration sends (istiod's list).
var ignoredNamespaces = []string{"kube-system", "kube-public", "kube-node-lease", "local-path-storage"}

// decision says whether pod gets a sidecar, istiod's rules: never with host networking or in
// Kubernetes' own namespaces; else the pod's sidecar.istio.io/inject label (or annotation)
// "true"/"false"; else the config's neverInjectSelector, then alwaysInjectSelector; else the
// policy. The namespace was chosen by the webhook configuration's selectors. warnings are for
// the admission response.
func (s *templateSet) decision(pod *corev1.Pod) (inject bool, why string, warnings []string) {
	if pod.Spec.HostNetwork {
		return false, "the pod uses the host's network", nil
	}
	if slices.Contains(ignoredNamespaces, pod.Namespace) {
		return false, "namespace " + pod.Namespace + " is never injected", nil
	}
	choice, where := pod.Annotations[labelInject], "annotation"
	if v, ok := pod.Labels[labelInject]; ok {
		choice, where = v, "label" // the label wins, as in Istio
	}
	switch choice {
	case "true":
		return true, "the pod's " + where + " " + labelInject + " is true", nil
	case "false":
		return false, "the pod's " + where + " " + labelInject + " is false", nil
	case "":
	default:
		warnings = append(warnings, fmt.Sprintf("%s %s: %q is neither \"true\" nor \"false\"; the injection policy applies", where, labelInject, choice))
	}
	set := labels.Set(pod.Labels)
	for _, sel := range s.never {
		if !sel.Empty() && sel.Matches(set) {
			return false, "the pod matches neverInjectSelector " + sel.String(), warnings
		}
	}
	for _, sel := range s.always {
		if !sel.Empty() && sel.Matches(set) {
			return true, "the pod matches alwaysInjectSelector " + sel.String(), warnings
		}
	}
	if s.enabled {
		return true, "policy enabled", warnings
	}
	return false, "policy disabled", warnings
}

// injectionStatus is the sidecar.istio.io/status annotation, in Istio's format: what the
// injection added, so a re-injection removes it first.
type injectionStatus struct {
	InitContainers   []string `json:"initContainers"`
	Containers       []string `json:"containers"`
	Volumes          []string `json:"volumes"`
	ImagePullSecrets []string `json:"imagePullSecrets"`
	Revision         string   `json:"revision"`
}

// add lists what spec adds to base's spec, in order, once.
func (st *injectionStatus) add(base *corev1.Pod, spec *corev1.PodSpec) {
	for _, c := range spec.InitContainers {
		if !hasContainer(base.Spec.InitContainers, c.Name) && !slices.Contains(st.InitContainers, c.Name) {
			st.InitContainers = append(st.InitContainers, c.Name)
		}
	}
	for _, c := range spec.Containers {
		if !hasContainer(base.Spec.Containers, c.Name) && !slices.Contains(st.Containers, c.Name) {
			st.Containers = append(st.Containers, c.Name)
		}
	}
	for _, v := range spec.Volumes {
		if !slices.ContainsFunc(base.Spec.Volumes, func(b corev1.Volume) bool { return b.Name == v.Name }) && !slices.Contains(st.Volumes, v.Name) {
			st.Volumes = append(st.Volumes, v.Name)
		}
	}
	for _, p := range spec.ImagePullSecrets {
		if !slices.Contains(base.Spec.ImagePullSecrets, p) && !slices.Contains(st.ImagePullSecrets, p.Name) {
			st.ImagePullSecrets = append(st.ImagePullSecrets, p.Name)
		}
	}
}

// inject returns pod with the templates applied. Applied to its own output with the same
// templates, it returns that output unchanged.
func (s *templateSet) inject(pod *corev1.Pod, revision string, mc *meshv1alpha1.MeshConfig) (*corev1.Pod, error) {
	data, err := s.templateData(pod, revision, mc)
	if err != nil {
		return nil, err
	}
	names := s.defaults
	if v, ok := pod.Annotations[annoTemplates]; ok {
		names = nil
		for n := range strings.SplitSeq(v, ",") {
			names = append(names, strings.TrimSpace(n))
		}
		if err := s.known(names); err != nil {
			return nil, fmt.Errorf("annotation %s: %w", annoTemplates, err)
		}
	}
	var expanded []string
	for _, n := range names {
		if a, ok := s.aliases[n]; ok {
			expanded = append(expanded, a...)
		} else {
			expanded = append(expanded, n)
		}
	}

	base := (&corev1.Pod{TypeMeta: pod.TypeMeta, ObjectMeta: data.ObjectMeta, Spec: data.Spec}).DeepCopy()
	merged := base
	st := injectionStatus{Revision: revision}
	for _, name := range expanded {
		t, ok := s.templates[name]
		if !ok {
			return nil, fmt.Errorf("alias names template %q, which does not exist", name)
		}
		var out bytes.Buffer
		if err := t.Execute(&out, data); err != nil {
			return nil, fmt.Errorf("template %s: %w", name, err)
		}
		overlay, err := yaml.YAMLToJSON(out.Bytes())
		if err != nil {
			return nil, fmt.Errorf("template %s does not produce YAML: %w", name, err)
		}
		// Strictly, so a misspelt field in a template is an error rather than silently dropped.
		var partial corev1.Pod
		if err := yaml.UnmarshalStrict(overlay, &partial); err != nil {
			return nil, fmt.Errorf("template %s does not produce a Pod: %w", name, err)
		}
		if merged, err = mergeOverlay(merged, overlay); err != nil {
			return nil, fmt.Errorf("template %s: %w", name, err)
		}
		st.add(base, &partial.Spec)
	}

	// Injected init containers run first, so the application's own init containers are in the
	// mesh; injected containers come last, so kubectl exec/logs default to the application.
	merged.Spec.InitContainers = moveFirst(merged.Spec.InitContainers, st.InitContainers)
	merged.Spec.Containers = moveLast(merged.Spec.Containers, st.Containers)

	status, err := json.Marshal(st)
	if err != nil {
		return nil, err
	}
	if merged.Annotations == nil {
		merged.Annotations = map[string]string{}
	}
	for k, v := range s.injectedAnnotations {
		merged.Annotations[k] = v
	}
	merged.Annotations[annoStatus] = string(status)
	return merged, nil
}

// templateData validates the annotations the templates rely on and computes what they see. An
// error names the annotation and its value.
func (s *templateSet) templateData(pod *corev1.Pod, revision string, mc *meshv1alpha1.MeshConfig) (*TemplateData, error) {
	stripped := stripInjection(pod)
	meta := stripped.ObjectMeta
	values := s.values
	global, _ := values["global"].(map[string]any)
	proxyValues, _ := global["proxy"].(map[string]any)
	agentValues, _ := global["agent"].(map[string]any)

	pc := proto.Clone(mc.GetDefaultConfig()).(*meshv1alpha1.ProxyConfig)
	if pc == nil {
		pc = proto.Clone(mesh.Default().GetDefaultConfig()).(*meshv1alpha1.ProxyConfig)
	}
	// Istio's default names istiod; Sailplane's values name its own service instead, unless the
	// mesh config chose an address.
	if addr, _ := global["discoveryAddress"].(string); addr != "" && (pc.DiscoveryAddress == "" || pc.DiscoveryAddress == istioDefaultAddress) {
		pc.DiscoveryAddress = addr
	}
	if v, ok := meta.Annotations[annoProxyConfig]; ok {
		overlay, err := parseProxyConfig(v)
		if err != nil {
			return nil, fmt.Errorf("annotation %s: %w", annoProxyConfig, err)
		}
		proto.Merge(pc, overlay)
	}

	data := &TemplateData{
		DeploymentMeta: deploymentMeta(&meta),
		ObjectMeta:     meta,
		Spec:           stripped.Spec,
		ProxyConfig:    pc,
		MeshConfig:     mc,
		Values:         values,
		Revision:       revision,
		ProxyImage:     str(proxyValues["image"]),
		CAAddress:      str(global["caAddress"]),
		ProxyLogLevel:  str(proxyValues["logLevel"]),
		AgentLogLevel:  str(agentValues["logLevel"]),
	}
	if data.CAAddress == "" {
		data.CAAddress = pc.DiscoveryAddress
	}
	if v, ok := meta.Annotations[annoProxyImage]; ok {
		if strings.TrimSpace(v) == "" || strings.ContainsAny(v, " \t\n\"") {
			return nil, fmt.Errorf("annotation %s: %q is not an image reference", annoProxyImage, v)
		}
		data.ProxyImage = v
	}
	if v, ok := meta.Annotations[annoProxyLogLevel]; ok {
		if !slices.Contains(envoyLevels, v) {
			return nil, fmt.Errorf("annotation %s: %q is not one of Envoy's levels (%s)", annoProxyLogLevel, v, strings.Join(envoyLevels, ", "))
		}
		data.ProxyLogLevel = v
	}
	if v, ok := meta.Annotations[annoAgentLogLevel]; ok {
		level, err := agentLevel(v)
		if err != nil {
			return nil, fmt.Errorf("annotation %s: %w", annoAgentLogLevel, err)
		}
		data.AgentLogLevel = level
	}
	res, err := proxyResources(meta.Annotations)
	if err != nil {
		return nil, err
	}
	data.ProxyResources = res
	data.ProxyUID, data.ProxyGID = proxyIDs(&stripped.Spec, proxyValues["uid"])
	cc, err := podCapture(meta.Annotations, pc, data.ProxyUID, data.ProxyGID)
	if err != nil {
		return nil, err
	}
	if cc.Mode == capture.TProxy {
		// TPROXY keeps inbound packets' destination; the proxy must then be uid 1337, whose
		// traffic the rules return (Istio's template forces it too).
		data.ProxyUID, data.ProxyGID = capture.ProxyUID, capture.ProxyUID
	}
	pilot, _ := values["pilot"].(map[string]any)
	cni, _ := pilot["cni"].(map[string]any)
	data.CNI, _ = cni["enabled"].(bool)
	if cc.Mode != capture.None {
		data.CaptureArgs = cc.Args()
	}
	ceilSeconds := func(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }
	data.DrainSeconds = ceilSeconds(pc.GetDrainDuration().AsDuration())
	data.TerminationDrainSeconds = ceilSeconds(pc.GetTerminationDrainDuration().AsDuration())
	grace := int64(corev1.DefaultTerminationGracePeriodSeconds)
	if g := stripped.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = *g
	}
	data.TerminationDrainSeconds = max(0, min(data.TerminationDrainSeconds, grace))
	return data, nil
}

// podCapture is what the pod's capture installs (shared/capture's ForPod, as the CNI plugin
// computes it): the proxy's uid/gid and status port never captured, DNS captured when the
// proxy's metadata says so.
func podCapture(annotations map[string]string, pc *meshv1alpha1.ProxyConfig, uid, gid int64) (capture.Config, error) {
	p := capture.Proxy{UID: uint32(uid), GID: uint32(gid), StatusPort: uint16(pc.GetStatusPort())}
	if v, ok := pc.GetProxyMetadata()["ISTIO_META_DNS_CAPTURE"]; ok {
		dns, err := strconv.ParseBool(v)
		if err != nil {
			return capture.Config{}, fmt.Errorf("proxyMetadata ISTIO_META_DNS_CAPTURE (mesh defaultConfig or annotation %s): %q is not a boolean", annoProxyConfig, v)
		}
		p.DNS = dns
	}
	return capture.ForPod(annotations, p)
}

var envoyLevels = []string{"trace", "debug", "info", "warning", "warn", "error", "critical", "off"}

// agentLevel reads the agent's log level: a level, or Istio's "scope:level,..." form, whose
// "default" scope is the level (the agent has no other scopes).
func agentLevel(v string) (string, error) {
	level := v
	if strings.Contains(v, ":") {
		level = ""
		for part := range strings.SplitSeq(v, ",") {
			if scope, l, _ := strings.Cut(strings.TrimSpace(part), ":"); scope == "default" {
				level = l
			}
		}
		if level == "" {
			return "", fmt.Errorf("%q sets no level for the default scope", v)
		}
	}
	var l slog.Level
	if level == "warning" {
		level = "warn"
	}
	if err := l.UnmarshalText([]byte(level)); err != nil || strings.ContainsAny(level, "+-") {
		return "", fmt.Errorf("%q is not a level (debug, info, warn, error)", v)
	}
	return strings.ToLower(level), nil
}

// proxyResources reads the resource annotations, each a valid quantity; nil when none is set.
func proxyResources(annos map[string]string) (*corev1.ResourceRequirements, error) {
	var res *corev1.ResourceRequirements
	for _, a := range []struct {
		name     string
		limit    bool
		resource corev1.ResourceName
	}{
		{annoProxyCPU, false, corev1.ResourceCPU},
		{annoProxyMemory, false, corev1.ResourceMemory},
		{annoProxyCPULimit, true, corev1.ResourceCPU},
		{annoProxyMemLimit, true, corev1.ResourceMemory},
	} {
		v, ok := annos[a.name]
		if !ok {
			continue
		}
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return nil, fmt.Errorf("annotation %s: %q is not a quantity: %w", a.name, v, err)
		}
		if res == nil {
			res = &corev1.ResourceRequirements{}
		}
		list := &res.Requests
		if a.limit {
			list = &res.Limits
		}
		if *list == nil {
			*list = corev1.ResourceList{}
		}
		(*list)[a.resource] = q
	}
	return res, nil
}

// proxyIDs is the user and group of the injected containers: the pod's when set and not root,
// else the values' uid, else 1337.
func proxyIDs(spec *corev1.PodSpec, fromValues any) (uid, gid int64) {
	uid = 1337
	if f, ok := fromValues.(float64); ok && f > 0 {
		uid = int64(f)
	}
	gid = uid
	if sc := spec.SecurityContext; sc != nil {
		if sc.RunAsUser != nil && *sc.RunAsUser > 0 {
			uid, gid = *sc.RunAsUser, *sc.RunAsUser
		}
		if sc.RunAsGroup != nil && *sc.RunAsGroup > 0 {
			gid = *sc.RunAsGroup
		}
	}
	return uid, gid
}

// parseProxyConfig reads a ProxyConfig in YAML (proxy.istio.io/config), unknown fields refused.
func parseProxyConfig(v string) (*meshv1alpha1.ProxyConfig, error) {
	js, err := yaml.YAMLToJSON([]byte(v))
	if err != nil {
		return nil, err
	}
	pc := &meshv1alpha1.ProxyConfig{}
	if t := bytes.TrimSpace(js); len(t) == 0 || string(t) == "null" {
		return pc, nil
	}
	if err := protojson.Unmarshal(js, pc); err != nil {
		// protojson varies its messages' spacing on purpose; the position it gives is in the
		// JSON made from the YAML, not the annotation.
		msg := strings.Join(strings.Fields(err.Error()), " ")
		if _, rest, ok := strings.Cut(msg, "): "); ok {
			msg = rest
		}
		return nil, errors.New(msg)
	}
	// What the templates put in ports and flags, checked here rather than by a failing pod.
	if pc.StatusPort < 0 || pc.StatusPort > 65535 {
		return nil, fmt.Errorf("statusPort: %d is not a port", pc.StatusPort)
	}
	if c := pc.GetConcurrency(); c != nil && c.Value < 0 {
		return nil, fmt.Errorf("concurrency: %d is negative", c.Value)
	}
	if a := pc.DiscoveryAddress; a != "" {
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" || strings.ContainsFunc(a, unicode.IsSpace) {
			return nil, fmt.Errorf("discoveryAddress: %q is not host:port", a)
		}
	}
	return pc, nil
}

// stripInjection returns pod without what a previous injection added, per its status
// annotation, so injecting again gives the same result.
func stripInjection(pod *corev1.Pod) *corev1.Pod {
	raw, ok := pod.Annotations[annoStatus]
	if !ok {
		return pod
	}
	out := pod.DeepCopy()
	delete(out.Annotations, annoStatus)
	var st injectionStatus
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		return out
	}
	out.Spec.InitContainers = slices.DeleteFunc(out.Spec.InitContainers, func(c corev1.Container) bool { return slices.Contains(st.InitContainers, c.Name) })
	out.Spec.Containers = slices.DeleteFunc(out.Spec.Containers, func(c corev1.Container) bool { return slices.Contains(st.Containers, c.Name) })
	out.Spec.Volumes = slices.DeleteFunc(out.Spec.Volumes, func(v corev1.Volume) bool { return slices.Contains(st.Volumes, v.Name) })
	out.Spec.ImagePullSecrets = slices.DeleteFunc(out.Spec.ImagePullSecrets, func(p corev1.LocalObjectReference) bool {
		return slices.Contains(st.ImagePullSecrets, p.Name)
	})
	return out
}

// mergeOverlay applies a template's output to pod as a strategic merge patch, as istiod does:
// containers merge by name, volumes by name, env by name, volume mounts by path.
func mergeOverlay(pod *corev1.Pod, overlay []byte) (*corev1.Pod, error) {
	current, err := json.Marshal(pod)
	if err != nil {
		return nil, err
	}
	merged, err := strategicpatch.StrategicMergePatch(current, overlay, corev1.Pod{})
	if err != nil {
		return nil, fmt.Errorf("strategic merge: %w", err)
	}
	out := &corev1.Pod{}
	if err := json.Unmarshal(merged, out); err != nil {
		return nil, err
	}
	return out, nil
}

// deploymentMeta guesses the workload owning the pod: its controller, less the ReplicaSet's
// pod-template-hash for a Deployment's pod.
func deploymentMeta(m *metav1.ObjectMeta) metav1.ObjectMeta {
	out := metav1.ObjectMeta{Namespace: m.Namespace, Name: m.Name}
	for _, ref := range m.OwnerReferences {
		if ref.Controller == nil || !*ref.Controller {
			continue
		}
		out.Name = ref.Name
		if hash := m.Labels["pod-template-hash"]; ref.Kind == "ReplicaSet" && hash != "" {
			out.Name = strings.TrimSuffix(ref.Name, "-"+hash)
		}
	}
	if out.Name == "" {
		out.Name = strings.TrimSuffix(m.GenerateName, "-")
	}
	return out
}

func hasContainer(cs []corev1.Container, name string) bool {
	return slices.ContainsFunc(cs, func(c corev1.Container) bool { return c.Name == name })
}

// moveFirst puts the named containers first, in the order named; moveLast puts them last.
func moveFirst(cs []corev1.Container, names []string) []corev1.Container {
	picked, rest := split(cs, names)
	return append(picked, rest...)
}

func moveLast(cs []corev1.Container, names []string) []corev1.Container {
	picked, rest := split(cs, names)
	return append(rest, picked...)
}

func split(cs []corev1.Container, names []string) (picked, rest []corev1.Container) {
	for _, n := range names {
		if i := slices.IndexFunc(cs, func(c corev1.Container) bool { return c.Name == n }); i >= 0 {
			picked = append(picked, cs[i])
		}
	}
	for _, c := range cs {
		if !slices.Contains(names, c.Name) {
			rest = append(rest, c)
		}
	}
	return picked, rest
}

func str(v any) string {
	if v == nil {
		return ""
	}
	return fmt.Sprint(v)
}
