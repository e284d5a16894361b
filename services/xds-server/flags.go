package xdsserver

import (
	"time"

	"github.com/spf13/pflag"

	"sailplane.dev/shared/cli"
)

// AddFlags registers the server's tuning flags, shared by the xds-server and hyper binaries.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Listen, "xds-listen", "127.0.0.1:15010", "address serving ADS (plaintext)")
	fs.DurationVar(&c.Debounce, "debounce", 100*time.Millisecond, "quiet period before config changes are pushed")
	fs.DurationVar(&c.DebounceMax, "debounce-max", time.Second, "longest a push waits for changes to settle")
	fs.DurationVar(&c.EndpointDebounce, "endpoint-debounce", 10*time.Millisecond, "quiet period before endpoint-only changes are pushed")
	fs.IntVar(&c.PushConcurrency, "push-concurrency", 16, "proxies pushed at once")
	fs.DurationVar(&c.MaxConnectionAge, "max-connection-age", 30*time.Minute,
		"close client connections after this age (±10%) so they spread over replicas; 0 = never")
	fs.DurationVar(&c.NackBackoff, "xds-nack-backoff", time.Second,
		"hold back a type from a proxy that rejected it twice in a row this long, doubling with each further rejection")
	fs.DurationVar(&c.MaxNackBackoff, "xds-max-nack-backoff", 30*time.Second, "longest --xds-nack-backoff hold")
	c.Overload.AddFlags(fs)
	cli.NamespaceVar(fs, &c.Namespace)
	cli.PodNameVar(fs, &c.PodName, "this replica's name: its identity in the status Lease and, in xds-server, in proxy status (default: $POD_NAME, else the host name)")
	cli.SharedStringVar(fs, &c.ClusterID, "cluster-id", cli.EnvOr("CLUSTER_ID", "Kubernetes"), "this cluster's name; TLS xDS clients authenticating with a token while claiming another (clusterid metadata) are refused")
	fs.BoolVar(&c.DebugPlaintext, "debug-plaintext", false,
		"serve proxy status and config dumps (Istio's debug types) on a plaintext --xds-listen that is not loopback, to anyone who reaches it; off: only a loopback plaintext listener serves them, and TLS clients need a certificate or token of a service account of --namespace")
}
