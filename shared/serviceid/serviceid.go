// Package serviceid gives a Sailplane service (config-ingest, endpoint-watcher, xds-server) its
// own identity, a certificate from the ca kept renewed, and protects its buses with it: mutual
// TLS, peers authorized by SPIFFE ID. The flags are the same in every service binary; hyper links
// the services in-process and needs none of them.
package serviceid

import (
	"fmt"
	"log/slog"

	"github.com/spf13/pflag"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/cli"
	"sailplane.dev/shared/spiffe"
	"sailplane.dev/shared/workloadcert"
)

// BusFlags say how a service's buses are protected.
type BusFlags struct {
	// Peers are the SPIFFE IDs allowed at the other end of the buses; empty: Sailplane's own
	// service accounts in Namespace (bus.SailplanePeers).
	Peers []string
	// Plaintext serves and dials the buses without TLS, on any address.
	Plaintext   bool
	TrustDomain string
	Namespace   string
}

// AddFlags registers the bus flags (--trust-domain and --namespace are shared with the
// service's own, see cli.SharedStringVar).
func (f *BusFlags) AddFlags(fs *pflag.FlagSet) {
	fs.StringSliceVar(&f.Peers, "bus-peers", nil, "SPIFFE IDs allowed at the other end of this service's buses over mTLS (subscribers of its bus, producers it subscribes to); default: Sailplane's service accounts (config-ingest, endpoint-watcher, xds-server, ca, webhook) in --namespace")
	fs.BoolVar(&f.Plaintext, "bus-plaintext", false, "serve and dial the buses in plaintext, also on addresses other than loopback (without an identity, a plaintext bus listens on loopback only)")
	cli.SharedStringVar(fs, &f.TrustDomain, "trust-domain", "cluster.local", "trust domain of the mesh: spiffe://<trust-domain>/ns/<ns>/sa/<sa>")
	cli.NamespaceVar(fs, &f.Namespace)
}

// Security is the buses' protection with identity (nil: none, so plaintext).
func (f *BusFlags) Security(identity workloadcert.Source) (bus.Security, error) {
	if f.Plaintext || identity == nil {
		return bus.Security{AllowPlaintext: f.Plaintext}, nil
	}
	peers := bus.SailplanePeers(f.TrustDomain, f.Namespace)
	if len(f.Peers) > 0 {
		peers = nil
		for _, p := range f.Peers {
			id, err := spiffe.Parse(p)
			if err != nil {
				return bus.Security{}, fmt.Errorf("--bus-peers: %w", err)
			}
			peers = append(peers, id)
		}
	}
	return bus.Security{Identity: identity, Peers: peers}, nil
}

// Flags are a service's identity (a certificate from the ca) and its bus protection.
type Flags struct {
	Bus BusFlags
	CA  workloadcert.Config
}

// AddFlags registers the identity and bus flags.
func (f *Flags) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.CA.CAAddress, "ca-address", "", "the ca's TLS address (its --ca-listen): the service gets its certificate there, renews it at 80 % of its life, and serves and dials its buses over mTLS with it; empty: no identity, plaintext buses")
	fs.StringVar(&f.CA.RootCertFile, "ca-root-cert", "", "root certificate verifying the ca (Kubernetes: the istio-ca-root-cert ConfigMap's root-cert.pem; without: root-cert.pem in the ca's --service-cert-dir folder)")
	fs.StringVar(&f.CA.TokenFile, "ca-token-file", "", "service-account token (audience istio-ca) authenticating the first request to the ca (Kubernetes: a projected token); re-read at each request")
	fs.StringVar(&f.CA.ProvisionedCertDir, "provisioned-cert-dir", "", "folder with cert-chain.pem and key.pem authenticating the first request to the ca without a token (the ca's --service-cert-dir/<service account>)")
	fs.DurationVar(&f.CA.CertTTL, "cert-ttl", 0, "lifetime of the service's certificate asked for (default 24h; the ca may shorten it)")
	f.Bus.AddFlags(fs)
	cli.SharedStringVar(fs, &f.CA.ClusterID, "cluster-id", cli.EnvOr("CLUSTER_ID", "Kubernetes"), "this cluster's name, sent to the ca")
}

// Identity is the service's certificate client (nil without --ca-address: no identity) and its
// buses' protection. The client must run (it is a component) for the certificate to arrive;
// until then the buses' handshakes fail and their peers retry.
func (f *Flags) Identity(log *slog.Logger) (*workloadcert.Client, bus.Security, error) {
	if f.CA.CAAddress == "" {
		sec, err := f.Bus.Security(nil)
		return nil, sec, err
	}
	cfg := f.CA
	cfg.TrustDomain = f.Bus.TrustDomain
	client, err := workloadcert.New(cfg, log.With("component", "certificate"))
	if err != nil {
		return nil, bus.Security{}, fmt.Errorf("--ca-address: %w", err)
	}
	sec, err := f.Bus.Security(client)
	return client, sec, err
}
