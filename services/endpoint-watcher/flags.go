package endpointwatcher

import (
	"github.com/spf13/pflag"

	"sailplane.dev/shared/cli"
)

// AddFlags registers the flags setting c, shared by the endpoint-watcher and hyper binaries:
// --cluster-id, --cluster-domain, --namespace (default $POD_NAMESPACE), --consul and
// --consul-datacenter. --consul sets c.Consul; without it there is no Consul discovery. The
// Consul ACL token comes from CONSUL_HTTP_TOKEN only, never a flag: flags show in ps.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.ClusterID, "cluster-id", DefaultClusterID, "cluster ID stamped on discovered endpoints")
	fs.StringVar(&c.ClusterDomain, "cluster-domain", DefaultClusterDomain, "Kubernetes cluster domain of Service hostnames")
	cli.NamespaceVar(fs, &c.Namespace)
	consul := &ConsulConfig{}
	fs.Var(&consulAddress{cfg: c, consul: consul}, "consul",
		"Consul HTTP address to discover services from (empty: no Consul); token from CONSUL_HTTP_TOKEN")
	fs.StringVar(&consul.Datacenter, "consul-datacenter", "", "Consul datacenter (default: the agent's)")
}

// consulAddress is --consul: a non-empty address turns Consul discovery on.
type consulAddress struct {
	cfg    *Config
	consul *ConsulConfig
}

func (a *consulAddress) String() string { return a.consul.Address }
func (a *consulAddress) Type() string   { return "string" }

func (a *consulAddress) Set(s string) error {
	a.consul.Address = s
	a.cfg.Consul = nil
	if s != "" {
		a.cfg.Consul = a.consul
	}
	return nil
}
