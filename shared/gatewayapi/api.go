// Package gatewayapi turns the Kubernetes Gateway API into what the rest of Sailplane already
// serves, as istiod's gateway controller does: Istio Gateways, VirtualServices and
// DestinationRules, plus the status every Gateway API object should carry. It is pure: the
// xds-server translates with it, config-ingest writes the status it computes, and both see the
// same binding of routes to parents.
package gatewayapi

import (
	"time"

	networking "istio.io/api/networking/v1alpha3"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"sailplane.dev/shared/schema"
)

// ControllerName is the GatewayClass controller istiod answers to, so Istio users' manifests
// work unchanged; SailplaneControllerName is accepted as an alias.
const (
	ControllerName          = gwv1.GatewayController("istio.io/gateway-controller")
	SailplaneControllerName = gwv1.GatewayController("sailplane.dev/gateway-controller")
	// DefaultClassName is the class istiod creates and serves.
	DefaultClassName = "istio"
)

// Input is every Gateway API object of the mesh, and what translation needs to know of the
// registry. Objects are in any order; Translate orders them as Istio does (creation time, then
// namespace/name).
type Input struct {
	GatewayClasses     []*gwv1.GatewayClass
	Gateways           []*gwv1.Gateway
	ListenerSets       []*gwv1.ListenerSet
	HTTPRoutes         []*gwv1.HTTPRoute
	GRPCRoutes         []*gwv1.GRPCRoute
	TCPRoutes          []*gwv1.TCPRoute
	TLSRoutes          []*gwv1.TLSRoute
	ReferenceGrants    []*gwv1.ReferenceGrant
	BackendTLSPolicies []*gwv1.BackendTLSPolicy

	// Services answers what a backendRef or a Service parentRef (GAMMA) points at.
	Services Services
	// DomainSuffix is the cluster domain ("cluster.local").
	DomainSuffix string
	// NamespaceLabels are the namespaces' labels by name, which listeners' allowedRoutes
	// selectors match. Nil: only the namespaces routes are in, with their
	// kubernetes.io/metadata.name label.
	NamespaceLabels map[string]map[string]string
}

// Services is the registry as translation sees it.
type Services interface {
	// Service returns the service of that hostname visible from namespace (a Kubernetes
	// Service is name.namespace.svc.<domain>; a ServiceEntry host as written), false if none.
	Service(hostname, namespace string) (Service, bool)
}

// Service is what translation reads of a registry service.
type Service struct {
	Hostname string
	Ports    []ServicePort
	// Addresses are its VIPs (a Kubernetes Service's cluster IPs).
	Addresses []string
	// ExternalAddresses are where it is reached from outside the cluster: a LoadBalancer's
	// ingress IPs or host names and a Service's externalIPs (istiod's ClusterExternalAddresses).
	// A Gateway's status.addresses are these when there are any, else its Service's host name.
	ExternalAddresses []string
	// LoadBalancer: a Kubernetes Service of type LoadBalancer. Without ExternalAddresses its
	// address is pending, and a Gateway behind it is not Programmed yet.
	LoadBalancer bool
	// Selector is the pod selector of a Kubernetes Service, where known: the Istio Gateway of
	// a manually deployed Gateway (addresses naming the Service) selects those pods.
	Selector map[string]string
	// Ready: the service has endpoints. A Gateway is Programmed only once its service is.
	Ready bool
}

// ServicePort is one port of a Service.
type ServicePort struct {
	Name     string
	Number   uint32
	Protocol string // Istio's protocol name: HTTP, HTTP2, GRPC, TCP, TLS, ...
}

// Config is one generated Istio resource. Generated resources are named after the object they
// come from, so that what a user reads in a proxy's config leads back to it.
type Config[T any] struct {
	Namespace  string
	Name       string
	CreateTime time.Time
	Spec       T
}

// Output is what Translate derives.
type Output struct {
	Gateways         []Config[*networking.Gateway]
	VirtualServices  []Config[*networking.VirtualService]
	DestinationRules []Config[*networking.DestinationRule]
	// Status has one entry per input object this controller is responsible for (objects of
	// another controller's class get none), in Input's kind order, then namespace/name.
	Status []Status
}

// Status is the status an object should carry. Value is the kind's status type:
// *gwv1.GatewayClassStatus, *gwv1.GatewayStatus, *gwv1.ListenerSetStatus, *gwv1.HTTPRouteStatus,
// *gwv1.GRPCRouteStatus, *gwv1.TCPRouteStatus, *gwv1.TLSRouteStatus or *gwv1.PolicyStatus. For
// routes and policies it holds only the parents/ancestors this controller writes: a writer
// merges them with other controllers' entries. Conditions carry the object's generation as
// observedGeneration; their lastTransitionTime is left zero for the writer to keep or set.
type Status struct {
	Kind       schema.Kind
	Namespace  string
	Name       string
	Generation int64
	Value      any
}
