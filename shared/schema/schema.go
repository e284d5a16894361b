// Package schema is the registry of every resource kind that travels on the bus: Istio's config
// kinds, MeshConfig, and Sailplane's own registry types. It maps between the names each party
// uses for a kind: Kubernetes group/version/kind, the bus type URL, and the Go message.
package schema

import (
	"strings"

	"google.golang.org/protobuf/proto"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	security "istio.io/api/security/v1beta1"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
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
}

// APIVersion is the "group/version" a YAML document of this kind carries.
func (k Kind) APIVersion() string {
	if k.Group == "" {
		return k.Version
	}
	return k.Group + "/" + k.Version
}

func istio(group, kind, plural string, newFn func() proto.Message) Kind {
	return Kind{
		Group: group, Version: "v1", Kind: kind, Plural: plural,
		TypeURL: group + "/v1/" + kind, New: newFn,
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

// MeshConfig is the mesh-wide configuration; one resource, named "mesh".
var MeshConfig = Kind{
	Version: "v1alpha1", Kind: "MeshConfig", TypeURL: "core/v1alpha1/MeshConfig",
	New:           func() proto.Message { return &meshv1alpha1.MeshConfig{} },
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

// IstioConfig lists the Istio config kinds config-ingest reads and publishes.
var IstioConfig = []Kind{
	VirtualService, DestinationRule, Gateway, ServiceEntry, WorkloadEntry, WorkloadGroup, Sidecar,
	AuthorizationPolicy, PeerAuthentication, RequestAuthentication,
}

// All lists every kind known to Sailplane.
var All = append(append([]Kind{}, IstioConfig...), MeshConfig, Service, Endpoints)

// Older API versions still accepted on input; Istio <= 1.23 also used them in bus type URLs.
var legacyVersions = map[string]bool{"v1alpha3": true, "v1beta1": true, "v1": true}

// ByTypeURL finds a kind by its bus type URL, accepting the legacy versions of Istio kinds
// ("networking.istio.io/v1alpha3/VirtualService").
func ByTypeURL(typeURL string) (Kind, bool) {
	for _, k := range All {
		if k.TypeURL == typeURL {
			return k, true
		}
	}
	parts := strings.Split(typeURL, "/")
	if len(parts) != 3 || !legacyVersions[parts[1]] {
		return Kind{}, false
	}
	return ByAPIVersionKind(parts[0]+"/"+parts[1], parts[2])
}

// ByAPIVersionKind finds a kind from a YAML document's apiVersion and kind, accepting
// v1, v1beta1 and v1alpha3 for Istio kinds.
func ByAPIVersionKind(apiVersion, kind string) (Kind, bool) {
	group, version, ok := strings.Cut(apiVersion, "/")
	if !ok {
		group, version = "", apiVersion
	}
	for _, k := range All {
		if k.Kind != kind || k.Group != group {
			continue
		}
		if version == k.Version || (k.Group != "" && strings.HasSuffix(k.Group, ".istio.io") && legacyVersions[version]) {
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
