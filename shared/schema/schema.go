// Package schema is the registry of every resource kind that travels on the bus: Istio's config
// kinds, MeshConfig, and Sailplane's own registry types. It maps between the names each party
// uses for a kind: Kubernetes group/version/kind, the bus type URL, and the Go message.
package schema

import (
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	security "istio.io/api/security/v1beta1"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	securityv1 "sailplane.dev/proto/security/v1"
)

// Kind describes one resource kind.
type Kind struct {
	Group   string // "networking.istio.io"; empty for Sailplane's own and core kinds
	Version string // the version served on the bus: "v1"
	Kind    string // "VirtualService"
	Plural  string // "virtualservices"
	// TypeURL names the kind on the bus: "networking.istio.io/v1/VirtualService".
	TypeURL string
	// New returns an empty spec message for this kind.
	New func() proto.Message
	// ClusterScoped kinds are named "name" on the bus; the others "namespace/name".
	ClusterScoped bool
	// OlderVersions are the other API versions a document of this kind may carry, as the
	// Kubernetes API server serves them ("v1beta1"); Istio <= 1.23 also used them in bus type URLs.
	OlderVersions []string
}

// Versions lists every API version the kind is read in, the bus version first.
func (k Kind) Versions() []string {
	return append([]string{k.Version}, k.OlderVersions...)
}

// APIVersion is the "group/version" a YAML document of this kind carries.
func (k Kind) APIVersion() string {
	if k.Group == "" {
		return k.Version
	}
	return k.Group + "/" + k.Version
}

func istio(group, kind, plural string, newFn func() proto.Message) Kind {
	older := []string{"v1alpha3", "v1beta1"}
	if group == "security.istio.io" {
		older = []string{"v1beta1"}
	}
	return Kind{
		Group: group, Version: "v1", Kind: kind, Plural: plural,
		TypeURL: group + "/v1/" + kind, New: newFn, OlderVersions: older,
	}
}

// Istio config kinds.
var (
	VirtualService = istio("networking.istio.io", "VirtualService", "virtualservices",
		func() proto.Message { return &networking.VirtualService{} })
	DestinationRule = istio("networking.istio.io", "DestinationRule", "destinationrules",
		func() proto.Message { return &networking.DestinationRule{} })
	Gateway = istio("networking.istio.io", "Gateway", "gateways",
		func() proto.Message { return &networking.Gateway{} })
	ServiceEntry = istio("networking.istio.io", "ServiceEntry", "serviceentries",
		func() proto.Message { return &networking.ServiceEntry{} })
	WorkloadEntry = istio("networking.istio.io", "WorkloadEntry", "workloadentries",
		func() proto.Message { return &networking.WorkloadEntry{} })
	WorkloadGroup = istio("networking.istio.io", "WorkloadGroup", "workloadgroups",
		func() proto.Message { return &networking.WorkloadGroup{} })
	Sidecar = istio("networking.istio.io", "Sidecar", "sidecars",
		func() proto.Message { return &networking.Sidecar{} })
	AuthorizationPolicy = istio("security.istio.io", "AuthorizationPolicy", "authorizationpolicies",
		func() proto.Message { return &security.AuthorizationPolicy{} })
	PeerAuthentication = istio("security.istio.io", "PeerAuthentication", "peerauthentications",
		func() proto.Message { return &security.PeerAuthentication{} })
	RequestAuthentication = istio("security.istio.io", "RequestAuthentication", "requestauthentications",
		func() proto.Message { return &security.RequestAuthentication{} })
)

// The Kubernetes Gateway API kinds (sigs.k8s.io/gateway-api v1.6, every one served as v1). Their
// specs are Go structs, not protobuf: on the bus a spec travels as a google.protobuf.Struct of
// its JSON, as istiod's MCP carries them, and consumers decode it into the Go type.
var (
	GatewayClass = gatewayAPI("GatewayClass", "gatewayclasses", true, "v1beta1")
	// KubernetesGateway is the Gateway API's Gateway, not Istio's (Gateway).
	KubernetesGateway = gatewayAPI("Gateway", "gateways", false, "v1beta1")
	HTTPRoute         = gatewayAPI("HTTPRoute", "httproutes", false, "v1beta1")
	GRPCRoute         = gatewayAPI("GRPCRoute", "grpcroutes", false)
	TCPRoute          = gatewayAPI("TCPRoute", "tcproutes", false, "v1alpha2")
	TLSRoute          = gatewayAPI("TLSRoute", "tlsroutes", false, "v1alpha2", "v1alpha3")
	ReferenceGrant    = gatewayAPI("ReferenceGrant", "referencegrants", false, "v1beta1")
	BackendTLSPolicy  = gatewayAPI("BackendTLSPolicy", "backendtlspolicies", false, "v1alpha3")
	ListenerSet       = gatewayAPI("ListenerSet", "listenersets", false)
)

// GatewayAPIGroup is the Kubernetes Gateway API's group.
const GatewayAPIGroup = "gateway.networking.k8s.io"

func gatewayAPI(kind, plural string, clusterScoped bool, older ...string) Kind {
	return Kind{
		Group: GatewayAPIGroup, Version: "v1", Kind: kind, Plural: plural,
		TypeURL: GatewayAPIGroup + "/v1/" + kind, New: func() proto.Message { return &structpb.Struct{} },
		ClusterScoped: clusterScoped, OlderVersions: older,
	}
}

// GatewayAPI lists the Gateway API kinds, parents before the routes that bind to them.
var GatewayAPI = []Kind{
	GatewayClass, KubernetesGateway, ListenerSet, HTTPRoute, GRPCRoute, TCPRoute, TLSRoute, ReferenceGrant,
	BackendTLSPolicy,
}

// MeshConfig is the mesh-wide configuration; one resource, named "mesh".
var MeshConfig = Kind{
	Version: "v1alpha1", Kind: "MeshConfig", TypeURL: "core/v1alpha1/MeshConfig",
	New:           func() proto.Message { return &meshv1alpha1.MeshConfig{} },
	ClusterScoped: true,
}

// MeshNetworks is Istio's meshNetworks (the "meshNetworks" key of the istio ConfigMap): which
// network the endpoints of a cluster or address range are in, and each network's gateways.
// One resource, named "mesh-networks", or none.
var MeshNetworks = Kind{
	Version: "v1alpha1", Kind: "MeshNetworks", TypeURL: "core/v1alpha1/MeshNetworks",
	New:           func() proto.Message { return &meshv1alpha1.MeshNetworks{} },
	ClusterScoped: true,
}

// Sailplane's registry kinds, published by endpoint-watcher.
var (
	Service = Kind{
		Group: "sailplane.dev", Version: "v1", Kind: "Service", TypeURL: "sailplane.dev/discovery/v1/Service",
		New: func() proto.Message { return &discoveryv1.Service{} },
	}
	Endpoints = Kind{
		Group: "sailplane.dev", Version: "v1", Kind: "Endpoints", TypeURL: "sailplane.dev/discovery/v1/Endpoints",
		New: func() proto.Message { return &discoveryv1.Endpoints{} },
	}
)

// Namespace is a Kubernetes namespace's name and labels, published by config-ingest for the
// namespaces the discoverySelectors admit: Gateway API listeners select routes' namespaces by
// label (allowedRoutes.namespaces.selector). Named after the namespace.
var Namespace = Kind{
	Group: "sailplane.dev", Version: "v1", Kind: "Namespace", TypeURL: "sailplane.dev/discovery/v1/Namespace",
	New:           func() proto.Message { return &discoveryv1.Namespace{} },
	ClusterScoped: true,
}

// TrustBundle is every root the mesh trusts, published by the ca: one resource per trust
// domain, named after it.
var TrustBundle = Kind{
	Group: "sailplane.dev", Version: "v1", Kind: "TrustBundle", TypeURL: "sailplane.dev/security/v1/TrustBundle",
	New:           func() proto.Message { return &securityv1.TrustBundle{} },
	ClusterScoped: true,
}

// IstioConfig lists the Istio config kinds config-ingest reads and publishes.
var IstioConfig = []Kind{
	VirtualService, DestinationRule, Gateway, ServiceEntry, WorkloadEntry, WorkloadGroup, Sidecar,
	AuthorizationPolicy, PeerAuthentication, RequestAuthentication,
}

// ConfigKinds lists every config kind config-ingest reads (from Kubernetes and from files) and
// publishes: Istio's and the Gateway API's.
var ConfigKinds = append(append([]Kind{}, IstioConfig...), GatewayAPI...)

// All lists every kind known to Sailplane.
var All = append(append([]Kind{}, ConfigKinds...), MeshConfig, MeshNetworks, Namespace, Service, Endpoints, TrustBundle)

// TypeURLs lists the bus type URLs of kinds.
func TypeURLs(kinds []Kind) []string {
	out := make([]string, len(kinds))
	for i, k := range kinds {
		out[i] = k.TypeURL
	}
	return out
}

// ByTypeURL finds a kind by its bus type URL, accepting the legacy versions of Istio kinds
// ("networking.istio.io/v1alpha3/VirtualService").
func ByTypeURL(typeURL string) (Kind, bool) {
	for _, k := range All {
		if k.TypeURL == typeURL {
			return k, true
		}
	}
	parts := strings.Split(typeURL, "/")
	if len(parts) != 3 {
		return Kind{}, false
	}
	for _, k := range IstioConfig {
		if k.Group == parts[0] && k.Kind == parts[2] && slices.Contains(k.OlderVersions, parts[1]) {
			return k, true
		}
	}
	return Kind{}, false
}

// ByAPIVersionKind finds a kind from a YAML document's apiVersion and kind, accepting the
// kind's older versions (Kind.Versions): v1alpha3 and v1beta1 for networking.istio.io, v1beta1
// for security.istio.io, as Istio does.
func ByAPIVersionKind(apiVersion, kind string) (Kind, bool) {
	group, version, ok := strings.Cut(apiVersion, "/")
	if !ok {
		group, version = "", apiVersion
	}
	for _, k := range All {
		if k.Kind != kind || k.Group != group {
			continue
		}
		if slices.Contains(k.Versions(), version) {
			return k, true
		}
	}
	return Kind{}, false
}

// Name is the bus name of a namespaced resource.
func Name(namespace, name string) string {
	if namespace == "" {
		return name
	}
	return namespace + "/" + name
}

// SplitName splits a bus name into namespace and name.
func SplitName(busName string) (namespace, name string) {
	if ns, n, ok := strings.Cut(busName, "/"); ok {
		return ns, n
	}
	return "", busName
}
