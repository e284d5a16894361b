package ca

import (
	"time"

	"github.com/spf13/pflag"
)

// AddFlags registers the ca's own flags, for the ca and hyper binaries. Kube, Namespace and
// ClusterID are the caller's: they are shared with other services in hyper.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Listen, "ca-listen", "127.0.0.1:15012", "TLS address serving Istio's CreateCertificate API")
	fs.StringVar(&c.TrustDomain, "trust-domain", "cluster.local", "trust domain of the identities signed: spiffe://<trust-domain>/ns/<ns>/sa/<sa>")
	fs.StringVar(&c.CertDir, "ca-cert-dir", "", "keep the self-signed root in this folder (istio-ca-secret's file names) instead of a Secret; the default without Kubernetes is etc/certs")
	fs.StringVar(&c.PluggedCertDir, "cacerts-dir", "", "a plugged-in CA in Istio's cacerts layout (ca-cert.pem, ca-key.pem, cert-chain.pem, root-cert.pem); takes precedence")
	fs.StringSliceVar(&c.ServingDNSNames, "ca-dns-names", nil, "DNS names of the listener's certificate (default istiod.<namespace>.svc and localhost; 127.0.0.1 and ::1 always)")
	fs.StringVar((*string)(&c.KeyAlgorithm), "ca-key-algorithm", "ECDSA_P256", "key of a generated root and of the serving certificate: ECDSA_P256 or RSA_2048")
	fs.DurationVar(&c.RootTTL, "root-ttl", 10*365*24*time.Hour, "lifetime of a generated root")
	fs.DurationVar(&c.DefaultCertTTL, "default-cert-ttl", 24*time.Hour, "lifetime of a workload certificate whose request asks for none")
	fs.DurationVar(&c.MaxCertTTL, "max-cert-ttl", 90*24*time.Hour, "longest workload certificate lifetime; longer requests are shortened to it")
	fs.StringSliceVar(&c.TokenAudiences, "token-audiences", []string{"istio-ca"}, "audiences a service-account token must be valid for")
}
