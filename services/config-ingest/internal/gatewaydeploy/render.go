package gatewaydeploy

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"
)

// Labels and annotations, Istio's names, so tools written for istiod's gateways find ours.
const (
	// GatewayNameLabel selects a Gateway's pods and names the Gateway on every generated object.
	GatewayNameLabel = "gateway.networking.k8s.io/gateway-name"
	// GatewayClassLabel names the Gateway's class on every generated object.
	GatewayClassLabel = "gateway.networking.k8s.io/gateway-class-name"
	// ManagedLabel marks the objects this controller owns (istiod's gateway.istio.io/managed);
	// an object of the same name without it is the user's and is left alone.
	ManagedLabel = "gateway.istio.io/managed"
	// ManagedValue is istiod's value of ManagedLabel, so that a cluster moving from istiod to
	// Sailplane keeps its gateways without a rename.
	ManagedValue = "istio.io-gateway-controller"

	// ServiceTypeAnnotation on a Gateway picks the Service type (LoadBalancer by default).
	ServiceTypeAnnotation = "networking.istio.io/service-type"
	// NameOverrideAnnotation on a Gateway names the Deployment and Service instead of <gateway>-<class>.
	NameOverrideAnnotation = "gateway.istio.io/name-override"
	// ServiceAccountAnnotation on a Gateway names the ServiceAccount instead of <gateway>-<class>.
	ServiceAccountAnnotation = "gateway.istio.io/service-account"
	// ClassDefaultsLabel on a ConfigMap of the control plane's namespace makes it the
	// customization of every Gateway of the class it names (before the Gateway's parametersRef).
	ClassDefaultsLabel = "gateway.istio.io/defaults-for-class"

	// InjectTemplatesAnnotation and InjectLabel ask Sailplane's webhook for the gateway template.
	InjectTemplatesAnnotation = "inject.istio.io/templates"
	InjectLabel               = "sidecar.istio.io/inject"
	// GatewayTemplate is the webhook's injection template for gateway pods (agent and Envoy
	// running as a router).
	GatewayTemplate = "gateway"
	// ProxyContainer is the container the gateway template fills in.
	ProxyContainer = "istio-proxy"
	// StatusPort is the gateway's readiness port, the first port of its Service as istiod's (load
	// balancers health-check it). It leads to AgentStatusPort: the agent's /healthz/ready, which
	// in the gateway template waits for Envoy's listeners and clusters (istiod's Envoy serves
	// 15021 itself; Sailplane's agent answers on its status port, ProxyConfig's default 15020).
	StatusPort      = 15021
	AgentStatusPort = 15020
)

// ErrInvalidParameters marks a Gateway whose customization cannot be used: parametersRef of an
// unsupported kind or naming a missing ConfigMap, an unknown key, an overlay that does not
// apply or changes what the controller must own, or a bad service-type annotation. The status
// writer reports it as Accepted=False, reason InvalidParameters, as the spec asks.
var ErrInvalidParameters = errors.New("invalid parameters")

// Overlay keys of a customization ConfigMap, one per generated kind, as istiod reads them.
// Each value is a YAML strategic merge patch of that object. HPA and PDB exist only when their
// key is given.
const (
	KeyDeployment     = "deployment"
	KeyService        = "service"
	KeyServiceAccount = "serviceAccount"
	KeyHPA            = "horizontalPodAutoscaler"
	KeyPDB            = "podDisruptionBudget"
)

// object is one kind the controller generates.
type object struct {
	key      string
	gvr      schema.GroupVersionResource
	kind     string
	typed    func() runtime.Object // the patch schema
	optional bool                  // only generated when its overlay is given
}

// kinds, in apply order: the ServiceAccount before the pods that use it.
var kinds = []object{
	{KeyServiceAccount, corev1.SchemeGroupVersion.WithResource("serviceaccounts"), "ServiceAccount", func() runtime.Object { return &corev1.ServiceAccount{} }, false},
	{KeyDeployment, appsv1.SchemeGroupVersion.WithResource("deployments"), "Deployment", func() runtime.Object { return &appsv1.Deployment{} }, false},
	{KeyService, corev1.SchemeGroupVersion.WithResource("services"), "Service", func() runtime.Object { return &corev1.Service{} }, false},
	{KeyHPA, autoscalingv2.SchemeGroupVersion.WithResource("horizontalpodautoscalers"), "HorizontalPodAutoscaler", func() runtime.Object { return &autoscalingv2.HorizontalPodAutoscaler{} }, true},
	{KeyPDB, policyv1.SchemeGroupVersion.WithResource("poddisruptionbudgets"), "PodDisruptionBudget", func() runtime.Object { return &policyv1.PodDisruptionBudget{} }, true},
}

// Input is what the generated objects derive from.
type Input struct {
	Gateway *gwv1.Gateway
	// ListenerSets are the ListenerSets attached to the Gateway that its allowedListeners
	// accept, oldest first: their listeners' ports are the Service's too.
	ListenerSets []*gwv1.ListenerSet
	// Overlays are the customization ConfigMaps' data, applied in order: the class defaults,
	// then the Gateway's parametersRef.
	Overlays []Overlay
}

// Overlay is one customization ConfigMap's data, with its name for errors.
type Overlay struct {
	Source string // namespace/name of the ConfigMap
	Data   map[string]string
}

// Manual reports whether a Gateway uses an existing Service (spec.addresses naming a hostname,
// or more than one address): then nothing is deployed. A single IP address is still deployed,
// with that IP asked of the load balancer, as istiod.
func Manual(gw *gwv1.Gateway) bool {
	switch len(gw.Spec.Addresses) {
	case 0:
		return false
	case 1:
		t := gw.Spec.Addresses[0].Type
		return t != nil && *t != gwv1.IPAddressType
	default:
		return true
	}
}

// Names are the generated objects' names.
func Names(gw *gwv1.Gateway) (deployment, serviceAccount string) {
	def := gw.Name + "-" + string(gw.Spec.GatewayClassName)
	deployment, serviceAccount = def, def
	if v := gw.Annotations[NameOverrideAnnotation]; v != "" {
		deployment = v
	}
	if v := gw.Annotations[ServiceAccountAnnotation]; v != "" {
		serviceAccount = v
	}
	return deployment, serviceAccount
}

// Render returns the objects a Gateway needs, ready for server-side apply, in apply order.
// Errors wrap ErrInvalidParameters and name the ConfigMap and key at fault.
func Render(in Input) ([]*unstructured.Unstructured, error) {
	gw := in.Gateway
	depName, saName := Names(gw)
	svcType := corev1.ServiceTypeLoadBalancer
	if v, ok := gw.Annotations[ServiceTypeAnnotation]; ok {
		switch t := corev1.ServiceType(v); t {
		case corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer:
			svcType = t
		default:
			return nil, fmt.Errorf("%w: Gateway %s/%s annotation %s: %q is none of ClusterIP, NodePort, LoadBalancer",
				ErrInvalidParameters, gw.Namespace, gw.Name, ServiceTypeAnnotation, v)
		}
	}
	for _, o := range in.Overlays {
		for _, k := range slices.Sorted(maps.Keys(o.Data)) {
			if !slices.ContainsFunc(kinds, func(x object) bool { return x.key == k }) {
				return nil, fmt.Errorf("%w: ConfigMap %s: key %q is none of deployment, service, serviceAccount, horizontalPodAutoscaler, podDisruptionBudget",
					ErrInvalidParameters, o.Source, k)
			}
		}
	}

	labels := infraLabels(gw)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[GatewayNameLabel] = gw.Name
	labels[GatewayClassLabel] = string(gw.Spec.GatewayClassName)
	labels[ManagedLabel] = ManagedValue
	meta := func(name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{
			Name: name, Namespace: gw.Namespace,
			Labels: maps.Clone(labels), Annotations: infraAnnotations(gw),
			// No controller/blockOwnerDeletion: those would need update on gateways/finalizers,
			// and garbage collection needs neither.
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: gwv1.GroupVersion.String(), Kind: "Gateway", Name: gw.Name, UID: gw.UID,
			}},
		}
	}
	selector := map[string]string{GatewayNameLabel: gw.Name}

	podLabels := map[string]string{
		"service.istio.io/canonical-name":     depName,
		"service.istio.io/canonical-revision": "latest",
	}
	maps.Copy(podLabels, labels)
	podLabels[InjectLabel] = "true"
	podAnnotations := infraAnnotations(gw)
	maps.Copy(podAnnotations, map[string]string{
		InjectTemplatesAnnotation: GatewayTemplate,
		"prometheus.io/path":      "/stats/prometheus",
		"prometheus.io/port":      "15020",
		"prometheus.io/scrape":    "true",
	})

	svc := &corev1.Service{
		ObjectMeta: meta(depName),
		Spec: corev1.ServiceSpec{
			Type:     svcType,
			Selector: selector,
			Ports:    servicePorts(gw, in.ListenerSets),
		},
	}
	if len(gw.Spec.Addresses) == 1 && svcType == corev1.ServiceTypeLoadBalancer {
		svc.Spec.LoadBalancerIP = gw.Spec.Addresses[0].Value
	}
	objs := map[string]runtime.Object{
		KeyServiceAccount: &corev1.ServiceAccount{ObjectMeta: meta(saName)},
		KeyDeployment: &appsv1.Deployment{
			ObjectMeta: meta(depName),
			// No replicas: the Deployment's default, or the HPA's, or the user's own scaling.
			Spec: appsv1.DeploymentSpec{
				Selector: &metav1.LabelSelector{MatchLabels: selector},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: podLabels, Annotations: podAnnotations},
					Spec: corev1.PodSpec{
						ServiceAccountName: saName,
						// Envoy runs as uid 1337 and must bind listener ports under 1024.
						SecurityContext: &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{{Name: "net.ipv4.ip_unprivileged_port_start", Value: "0"}}},
						// A placeholder the webhook's gateway template fills in.
						Containers: []corev1.Container{{Name: ProxyContainer, Image: "auto"}},
					},
				},
			},
		},
		KeyService: svc,
		KeyHPA: &autoscalingv2.HorizontalPodAutoscaler{
			ObjectMeta: meta(depName),
			Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
				ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: depName},
				MaxReplicas:    1,
			},
		},
		KeyPDB: &policyv1.PodDisruptionBudget{
			ObjectMeta: meta(depName),
			Spec:       policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: selector}},
		},
	}

	var out []*unstructured.Unstructured
	for _, k := range kinds {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(objs[k.key])
		if err != nil {
			return nil, err
		}
		u := &unstructured.Unstructured{Object: m}
		u.SetAPIVersion(k.gvr.GroupVersion().String())
		u.SetKind(k.kind)
		unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
		unstructured.RemoveNestedField(u.Object, "spec", "template", "metadata", "creationTimestamp")
		unstructured.RemoveNestedField(u.Object, "status")
		before := identity(u)
		patched := false
		for _, o := range in.Overlays {
			patch, ok := o.Data[k.key]
			if !ok {
				continue
			}
			if u, err = overlay(u, patch, k.typed()); err != nil {
				return nil, fmt.Errorf("%w: ConfigMap %s key %s: %w", ErrInvalidParameters, o.Source, k.key, err)
			}
			if after := identity(u); !reflect.DeepEqual(before, after) {
				return nil, fmt.Errorf("%w: ConfigMap %s key %s: changes %s, which the controller owns", ErrInvalidParameters, o.Source, k.key, changed(before, after))
			}
			if len(u.GetManagedFields()) > 0 {
				return nil, fmt.Errorf("%w: ConfigMap %s key %s: sets metadata.managedFields", ErrInvalidParameters, o.Source, k.key)
			}
			patched = true
		}
		if k.optional && !patched {
			continue
		}
		out = append(out, u)
	}
	return out, nil
}

// identity is the metadata a customization must not change: what makes the object the
// Gateway's (name, namespace, owner) and what this controller finds it by (its labels).
func identity(u *unstructured.Unstructured) map[string]any {
	l := u.GetLabels()
	return map[string]any{
		"metadata.name": u.GetName(), "metadata.generateName": u.GetGenerateName(), "metadata.namespace": u.GetNamespace(),
		"metadata.ownerReferences": u.GetOwnerReferences(), "metadata.finalizers": u.GetFinalizers(),
		"metadata.uid": string(u.GetUID()), "metadata.resourceVersion": u.GetResourceVersion(),
		"metadata.labels." + GatewayNameLabel: l[GatewayNameLabel], "metadata.labels." + ManagedLabel: l[ManagedLabel],
		"apiVersion": u.GetAPIVersion(), "kind": u.GetKind(),
	}
}

func changed(a, b map[string]any) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(a)) {
		if !reflect.DeepEqual(a[k], b[k]) {
			out = append(out, k)
		}
	}
	return strings.Join(out, ", ")
}

// overlay strategic-merges a YAML patch into u, with the merge keys of typed's Go type (so a
// container is merged by name, as kubectl patch does).
func overlay(u *unstructured.Unstructured, patchYAML string, typed runtime.Object) (*unstructured.Unstructured, error) {
	var patch map[string]any
	if err := yaml.Unmarshal([]byte(patchYAML), &patch); err != nil {
		return nil, fmt.Errorf("not a YAML object: %w", err)
	}
	meta, err := strategicpatch.NewPatchMetaFromStruct(typed)
	if err != nil {
		return nil, err
	}
	merged, err := strategicpatch.StrategicMergeMapPatchUsingLookupPatchMeta(u.Object, patch, meta)
	if err != nil {
		return nil, err
	}
	// A round trip through the Go type refuses fields that do not exist (a typo would otherwise
	// reach the API server and be dropped or refused there, far from the ConfigMap).
	b, err := json.Marshal(merged)
	if err != nil {
		return nil, err
	}
	if err := strictDecode(b, typed); err != nil {
		return nil, err
	}
	return &unstructured.Unstructured{Object: merged}, nil
}

func strictDecode(b []byte, into runtime.Object) error {
	return yaml.UnmarshalStrict(b, into)
}

// infraLabels are spec.infrastructure.labels, without the gateway.networking.k8s.io/ prefix
// the spec reserves; when the Gateway sets none, its own labels, as istiod copies them.
func infraLabels(gw *gwv1.Gateway) map[string]string {
	if gw.Spec.Infrastructure != nil && gw.Spec.Infrastructure.Labels != nil {
		out := map[string]string{}
		for k, v := range gw.Spec.Infrastructure.Labels {
			if !strings.HasPrefix(string(k), "gateway.networking.k8s.io/") {
				out[string(k)] = string(v)
			}
		}
		return out
	}
	return maps.Clone(gw.Labels)
}

// notCopied are the Gateway annotations that are about the Gateway alone.
var notCopied = []string{"kubectl.kubernetes.io/last-applied-configuration", NameOverrideAnnotation, ServiceAccountAnnotation, "gateway.istio.io/controller-version"}

// infraAnnotations are spec.infrastructure.annotations (as infraLabels), else the Gateway's own.
func infraAnnotations(gw *gwv1.Gateway) map[string]string {
	out := map[string]string{}
	if gw.Spec.Infrastructure != nil && gw.Spec.Infrastructure.Annotations != nil {
		for k, v := range gw.Spec.Infrastructure.Annotations {
			if !strings.HasPrefix(string(k), "gateway.networking.k8s.io/") {
				out[string(k)] = string(v)
			}
		}
	} else {
		maps.Copy(out, gw.Annotations)
	}
	for _, k := range notCopied {
		delete(out, k)
	}
	return out
}

// servicePorts are the status port, then one port per distinct listener port, named after
// the first listener on it, as istiod names them.
func servicePorts(gw *gwv1.Gateway, sets []*gwv1.ListenerSet) []corev1.ServicePort {
	tcp := "tcp"
	ports := []corev1.ServicePort{{Name: "status-port", Port: StatusPort, Protocol: corev1.ProtocolTCP, AppProtocol: &tcp, TargetPort: intstr.FromInt32(AgentStatusPort)}}
	seen := map[int32]bool{}
	used := map[string]bool{"status-port": true}
	listeners := slices.Clone(gw.Spec.Listeners)
	for _, ls := range sets {
		for _, l := range ls.Spec.Listeners {
			// A ListenerSet's port defaults by protocol, as the spec says.
			if l.Port == 0 {
				switch l.Protocol {
				case gwv1.HTTPProtocolType:
					l.Port = 80
				case gwv1.HTTPSProtocolType:
					l.Port = 443
				default:
					continue // refused by the API server's validation
				}
			}
			listeners = append(listeners, gwv1.Listener{Name: l.Name, Hostname: l.Hostname, Port: l.Port, Protocol: l.Protocol, TLS: l.TLS, AllowedRoutes: l.AllowedRoutes})
		}
	}
	for i, l := range listeners {
		if seen[int32(l.Port)] {
			continue
		}
		seen[int32(l.Port)] = true
		name := strings.ReplaceAll(string(l.Name), ".", "-")
		if name == "" {
			name = fmt.Sprintf("%s-%d", strings.ToLower(string(l.Protocol)), i)
		}
		name = unique(name, int32(l.Port), used)
		proto := strings.ToLower(string(l.Protocol))
		ports = append(ports, corev1.ServicePort{
			Name: name, Port: int32(l.Port), Protocol: corev1.ProtocolTCP, AppProtocol: &proto,
			TargetPort: intstr.FromInt32(int32(l.Port)),
		})
	}
	return ports
}

// unique makes a port name unique and a valid DNS label length, suffixing the port.
func unique(name string, port int32, used map[string]bool) string {
	name = name[:min(len(name), 63)]
	candidate := name
	for suffix := fmt.Sprintf("-%d", port); used[candidate]; suffix += "x" {
		candidate = name[:min(len(name), 63-len(suffix))] + suffix
	}
	used[candidate] = true
	return candidate
}
