package webhook

import (
	"github.com/spf13/pflag"

	"sailplane.dev/shared/cli"
)

// AddFlags registers the webhook's flags, for the webhook and hyper binaries (--namespace and
// --revision are shared with the other services hyper links).
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Listen, "webhook-listen", DefaultListen, "HTTPS address serving the admission webhooks: /inject, /validate, and /ready for probes")
	fs.BoolVar(&c.PatchCABundle, "webhook-ca-bundle-patch", true,
		"keep the caBundle of this revision's webhook configurations ("+InjectorConfigName+", "+ValidatorConfigName+", -<revision> appended for another revision) current, and turn the validator to failurePolicy Fail once the API server reaches it; false for GitOps, where both are set in the manifests")
	fs.StringVar(&c.InjectionDir, "injection-dir", DefaultInjectionDir, "folder of the injection templates (files config and values, reloaded on change) without Kubernetes; with it they come from the istio-sidecar-injector ConfigMap in --namespace (-<revision> appended for a revision)")
	RevisionVar(fs, &c.Revision)
	cli.NamespaceVar(fs, &c.Namespace)
}

// RevisionVar registers --revision, the control plane revision (see cli.SharedStringVar).
func RevisionVar(fs *pflag.FlagSet, p *string) {
	cli.SharedStringVar(fs, p, "revision", DefaultRevision,
		"control plane revision (istio.io/rev): the webhook configurations and the injection templates of this revision are this control plane's")
}
