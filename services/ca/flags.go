package ca

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"

	"sailplane.dev/shared/cli"
)

// DefaultCertDir keeps the self-signed root without Kubernetes, under the root folder UseKube is
// given (the seed's layout: etc/certs beside etc/sailplane).
const DefaultCertDir = "etc/certs"

// AddFlags registers the ca's flags, for the ca and hyper binaries. --namespace and
// --cluster-id are shared with the other services hyper links.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Listen, "ca-listen", "127.0.0.1:15012", "TLS address serving Istio's CreateCertificate API")
	fs.StringVar(&c.TrustDomain, "trust-domain", "cluster.local", "trust domain of the identities signed: spiffe://<trust-domain>/ns/<ns>/sa/<sa>")
	fs.StringVar(&c.CertDir, "ca-cert-dir", "", "keep the self-signed root in this folder (istio-ca-secret's file names) instead of a Secret; the default without Kubernetes is "+DefaultCertDir+
		" (in hyper, beside the mesh file's etc/sailplane: <root>/etc/certs for <root>/etc/sailplane/mesh.yaml)")
	fs.StringVar(&c.PluggedCertDir, "cacerts-dir", "", "a plugged-in CA in Istio's cacerts layout (ca-cert.pem, ca-key.pem, cert-chain.pem, root-cert.pem); takes precedence")
	fs.StringSliceVar(&c.ServingDNSNames, "ca-dns-names", nil, "DNS names of the listener's certificate (default istiod.<namespace>.svc and localhost; the listen host, 127.0.0.1 and ::1 always)")
	fs.StringVar(&c.ServingCertDir, "serving-cert-dir", "", "keep a serving certificate for the --ca-dns-names in this folder (tls.crt, tls.key, ca.crt), renewed at half its life: xds-server's --tls-cert-dir in microservices mode; empty: none")
	fs.StringVar(&c.XDSServerAccount, "xds-server-account", "xds-server", "service account (name in --namespace, or namespace/name) whose certificates also carry the --ca-dns-names, so xds-server serves TLS xDS under istiod's names with its own key; - for none")
	fs.StringVar(&c.WebhookAccount, "webhook-account", "webhook", "service account (name in --namespace, or namespace/name) whose certificates also carry --webhook-dns-names, so the webhook serves the Kubernetes API server with its own key; - for none")
	fs.StringSliceVar(&c.WebhookDNSNames, "webhook-dns-names", nil, "DNS names of the webhook's certificates (default sailplane-webhook.<namespace>.svc and sailplane-webhook.<namespace>.svc.cluster.local, in --webhook-account's namespace)")
	fs.StringVar(&c.ServingCertSecret, "serving-cert-secret", "", "keep the same serving certificate in this kubernetes.io/tls Secret (name in --namespace, or namespace/name), for xds-server to mount; empty: none")
	fs.StringVar(&c.ServiceCertDir, "service-cert-dir", "", "keep a bootstrap certificate for each control plane service (config-ingest, endpoint-watcher, xds-server, webhook) in <folder>/<service account>/ (cert-chain.pem, key.pem, root-cert.pem), renewed at half its life: without Kubernetes, what a service's --provisioned-cert-dir points at; empty: none")
	fs.StringVar((*string)(&c.KeyAlgorithm), "ca-key-algorithm", "ECDSA_P256", "key of a generated root and of the serving certificate: ECDSA_P256 or RSA_2048")
	fs.DurationVar(&c.RootTTL, "root-ttl", 10*365*24*time.Hour, "lifetime of a generated root")
	fs.DurationVar(&c.DefaultCertTTL, "default-cert-ttl", 24*time.Hour, "lifetime of a workload certificate whose request asks for none")
	fs.DurationVar(&c.MaxCertTTL, "max-cert-ttl", 90*24*time.Hour, "longest workload certificate lifetime; longer requests are shortened to it")
	fs.Var(timeValue{&c.RotateRootBefore}, "rotate-root-before", "rotate a self-signed root (istio-ca-secret or --ca-cert-dir) created before this RFC 3339 time, once it has come: the new root joins the bundle, signs after --root-rotation-grace, and the old root leaves the bundle --max-cert-ttl later; a restart resumes the rotation")
	fs.DurationVar(&c.RootRotationGrace, "root-rotation-grace", 0, "how long workloads have to learn a new root before it signs (default --max-cert-ttl)")
	fs.StringSliceVar(&c.TokenAudiences, "token-audiences", []string{"istio-ca"}, "audiences a service-account token must be valid for")
	cli.NamespaceVar(fs, &c.Namespace)
	cli.SharedStringVar(fs, &c.ClusterID, "cluster-id", cli.EnvOr("CLUSTER_ID", "Kubernetes"), "this cluster's name; callers claiming another (clusterid metadata) are refused")
}

// UseKube sets the API server (nil: none). Without one, and without a folder asked for, the
// root is kept in DefaultCertDir under root: hyper passes its mesh file's root (mesh.Root), so
// that each configuration has its own CA; the ca binary, which reads no mesh file, ".".
func (c *Config) UseKube(kube *rest.Config, root string) {
	c.Kube = kube
	if kube == nil && c.CertDir == "" && c.PluggedCertDir == "" {
		c.CertDir = filepath.Join(root, DefaultCertDir)
	}
}

// timeValue is an RFC 3339 time flag.
type timeValue struct{ t *time.Time }

func (v timeValue) String() string {
	if v.t == nil || v.t.IsZero() {
		return ""
	}
	return v.t.Format(time.RFC3339)
}

func (v timeValue) Set(s string) error {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return fmt.Errorf("want an RFC 3339 time such as 2026-01-02T15:04:05Z: %w", err)
	}
	*v.t = t
	return nil
}

func (timeValue) Type() string { return "time" }
