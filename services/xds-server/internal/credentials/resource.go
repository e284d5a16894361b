// Package credentials serves the Kubernetes Secrets that Gateway servers and DestinationRules
// name in credentialName to the proxies allowed to read them, as SDS secrets, as istiod's
// SecretGen does: "kubernetes://<name>" (the proxy's namespace), "kubernetes://<ns>/<name>",
// "kubernetes-gateway://<ns>/<name>" (Gateway API listeners), and "<...>-cacert" for the CA alone.
package credentials

import (
	"errors"
	"fmt"
	"strings"
)

// KubernetesPrefix starts the SDS names of Kubernetes Secrets; CASuffix ends those asking only
// for a Secret's CA certificate (a validation context), as Istio names them.
const (
	KubernetesPrefix = "kubernetes://"
	CASuffix         = "-cacert"
	// GatewayPrefix starts the names Gateway API listeners give their certificateRefs, always
	// with a namespace, as istiod's translation writes them ("kubernetes-gateway://<ns>/<name>").
	GatewayPrefix = "kubernetes-gateway://"
)

// ErrNotServed is a resource name of a kind this server does not serve (configmap://,
// kubernetes-gateway://, anything else).
var ErrNotServed = errors.New("not a kubernetes:// secret")

// Ref is a parsed SDS resource name.
type Ref struct {
	// Resource is the name as the proxy asked for it.
	Resource string
	// Namespace and Name are the Secret's; Name keeps a "-cacert" suffix.
	Namespace, Name string
	// CAOnly: the name ends in "-cacert", asking for the CA certificate alone.
	CAOnly bool
}

// Key is the Secret as "namespace/name".
func (r Ref) Key() string { return r.Namespace + "/" + r.Name }

// Parse reads a "kubernetes://" resource name (one without a namespace is of proxyNamespace)
// or a "kubernetes-gateway://<namespace>/<name>" one.
func Parse(resource, proxyNamespace string) (Ref, error) {
	if rest, ok := strings.CutPrefix(resource, GatewayPrefix); ok {
		ns, name, found := strings.Cut(rest, "/")
		if !found || ns == "" || name == "" || strings.Contains(name, "/") {
			return Ref{}, fmt.Errorf("SDS resource %q: want kubernetes-gateway://<namespace>/<name>", resource)
		}
		return Ref{Resource: resource, Namespace: ns, Name: name, CAOnly: strings.HasSuffix(name, CASuffix)}, nil
	}
	rest, ok := strings.CutPrefix(resource, KubernetesPrefix)
	if !ok {
		return Ref{}, fmt.Errorf("SDS resource %q: %w", resource, ErrNotServed)
	}
	ref := Ref{Resource: resource, Namespace: proxyNamespace, Name: rest}
	if ns, name, found := strings.Cut(rest, "/"); found {
		ref.Namespace, ref.Name = ns, name
	}
	if ref.Namespace == "" || ref.Name == "" || strings.Contains(ref.Name, "/") {
		return Ref{}, fmt.Errorf("SDS resource %q: want kubernetes://<name> or kubernetes://<namespace>/<name>", resource)
	}
	ref.CAOnly = strings.HasSuffix(ref.Name, CASuffix)
	return ref, nil
}
