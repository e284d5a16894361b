package configingest

import (
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"

	"sailplane.dev/services/config-ingest/internal/upstream"
	"sailplane.dev/shared/cli"
)

// DefaultMeshFile is --mesh-config's default, relative to the working directory.
const DefaultMeshFile = "etc/sailplane/mesh.yaml"

// AddFlags registers the flags setting c, shared by the config-ingest and hyper binaries.
// --namespace defaults to $POD_NAMESPACE and --pod-name to $POD_NAME, as the manifests set them.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.MeshFile, "mesh-config", DefaultMeshFile,
		"mesh config file (Istio meshConfig format); with Kubernetes, only when set, instead of the istio ConfigMap")
	fs.StringSliceVar(&c.ConfigDirs, "config-dir", nil, "config folders to read, overriding the mesh config's fs:// configSources")
	fs.StringVar(&c.StateDir, "state-dir", DefaultStateDir,
		"folder keeping the last valid config across restarts: every file's resources, or the Kubernetes resources now invalid; empty: none. "+
			"The default is under the mesh file's root, beside its etc/sailplane (<root>/var/lib/sailplane for <root>/etc/sailplane/mesh.yaml), or under the working folder without a mesh file")
	cli.SharedStringVar(fs, &c.Revision, "revision", "default",
		"control plane revision (istio.io/rev): config labelled for another revision is not read, the Gateway API status and gateways of objects labelled (or in a namespace labelled) for another revision or its tags are left to it; the mesh ConfigMap is istio-<revision> for a revision other than default")
	fs.BoolVar(&c.GatewayDeployment, "gateway-deployment", true,
		"with Kubernetes, deploy the Envoy gateway (ServiceAccount, Deployment, Service, optional HPA/PDB) of each Gateway of class istio (controller istio.io/gateway-controller or sailplane.dev/gateway-controller) without addresses, as istiod does")
	fs.BoolVar(&c.GatewaySecrets, "gateway-secrets", true,
		"with Kubernetes, read Secrets and ConfigMaps (list/watch, every namespace) to check the certificates that Gateway listeners and BackendTLSPolicies reference, as istiod does: "+
			"a missing or malformed one makes the listener or policy invalid in the status; only whether each is valid is kept, never its data. false: references are taken as valid")
	fs.DurationVar(&c.UpstreamSyncTimeout, "upstream-sync-timeout", upstream.DefaultSyncTimeout,
		"how long the first config served waits for each xds:// config source that neither answered nor has a saved state: after it, the config is served without that source, whose resources follow when it answers")
	cli.NamespaceVar(fs, &c.Namespace)
	cli.PodNameVar(fs, &c.PodName, "this replica's name: its identity in the status Lease and, in xds-server, in proxy status (default: $POD_NAME, else the host name)")
}

// SourceFlags choose where config comes from: --config-source and --kubeconfig.
type SourceFlags struct {
	Mode       string
	Kubeconfig string
}

// AddFlags registers --config-source and --kubeconfig.
func (f *SourceFlags) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.Mode, "config-source", SourceAuto,
		"where config (and in hyper, workloads) come from: auto (Kubernetes if a cluster is found, else files), kubernetes or files")
	cli.KubeconfigVar(fs, &f.Kubeconfig)
}

// Resolve is ResolveSource of the flags.
func (f SourceFlags) Resolve() (*rest.Config, string, error) {
	return ResolveSource(f.Mode, f.Kubeconfig)
}

// UseSource settles what depends on where config comes from, once fs is parsed: Kubernetes
// mode when kube (from Resolve) is not nil, the mesh config then coming from the istio ConfigMap
// unless --mesh-config was given; and, unless --state-dir was given, the state folder of the
// mesh file (StateDirFor), so that another mesh file run from the same working folder does not
// find this one's state.
func (c *Config) UseSource(kube *rest.Config, fs *pflag.FlagSet) {
	if kube != nil {
		c.Kube = kube
		if !fs.Changed("mesh-config") {
			c.MeshFile = ""
		}
	}
	if !fs.Changed("state-dir") {
		c.StateDir = StateDirFor(c.MeshFile)
	}
}
