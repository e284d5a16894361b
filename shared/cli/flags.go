package cli

import (
	"github.com/spf13/pflag"
)

// DefaultNamespace is the control plane's namespace when POD_NAMESPACE is not set.
const DefaultNamespace = "istio-system"

// NamespaceVar registers --namespace, the control plane's namespace (Kubernetes), defaulting to
// $POD_NAMESPACE (which the manifests set from the Pod's namespace), else DefaultNamespace.
// Several services take it: see SharedStringVar.
func NamespaceVar(fs *pflag.FlagSet, p *string) {
	SharedStringVar(fs, p, "namespace", EnvOr("POD_NAMESPACE", DefaultNamespace),
		"control plane namespace (Kubernetes): the istio ConfigMap, the status Lease and remote-cluster Secrets live there; $POD_NAMESPACE when set")
}

// WatchNamespaceVar registers --watch-namespace: when set, the service watches that one namespace
// instead of the cluster and turns off what needs cluster-scoped reads, each with a log line, so
// that Roles in it suffice (deploy/single-namespace). Meant for every service: see SharedStringVar.
func WatchNamespaceVar(fs *pflag.FlagSet, p *string) {
	SharedStringVar(fs, p, "watch-namespace", "",
		"watch only this namespace, so that Roles there suffice; what needs cluster-scoped reads is off, each logged (endpoint-watcher: node locality, the cluster's default network); empty: the whole cluster")
}

// PodNameVar registers --pod-name, this replica's name, defaulting to $POD_NAME (which the
// manifests set from the Pod's name); usage says what the service uses it for. Several services
// take it: see SharedStringVar.
func PodNameVar(fs *pflag.FlagSet, p *string, usage string) {
	SharedStringVar(fs, p, "pod-name", EnvOr("POD_NAME", ""), usage)
}

// SharedStringVar registers a string flag that more than one service's config takes: when fs
// already has it (hyper links several services), the existing flag sets p too, so that one
// --name sets every service's field.
func SharedStringVar(fs *pflag.FlagSet, p *string, name, value, usage string) {
	f := fs.Lookup(name)
	if f == nil {
		fs.StringVar(p, name, value, usage)
		return
	}
	*p = f.Value.String()
	f.Value = &teeValue{Value: f.Value, p: p}
}

// teeValue is a flag value that also sets another string.
type teeValue struct {
	pflag.Value
	p *string
}

func (t *teeValue) Set(s string) error {
	if err := t.Value.Set(s); err != nil {
		return err
	}
	*t.p = t.Value.String()
	return nil
}

// KubeconfigVar registers --kubeconfig, the primary cluster's kubeconfig file (see SharedStringVar).
func KubeconfigVar(fs *pflag.FlagSet, p *string) {
	SharedStringVar(fs, p, "kubeconfig", "", "kubeconfig file of the cluster (default: in-cluster, $KUBECONFIG, ~/.kube/config)")
}
