package agent

import (
	"time"

	"github.com/spf13/pflag"

	"sailplane.dev/shared/cli"
	"sailplane.dev/shared/grpcbootstrap"
)

// AddFlags registers the agent's flags with Istio's paths and environment variables as defaults,
// so the agent drops into a pod spec made for istio-agent.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.CAAddress, "ca-address", cli.EnvOr("CA_ADDR", DefaultCAAddress), "the ca's TLS address (Istio's CA_ADDR)")
	fs.StringVar(&c.RootCertFile, "root-cert", "./var/run/secrets/istio/root-cert.pem", "root certificate that verifies the ca (the istio-ca-root-cert ConfigMap); re-read at each request")
	fs.StringVar(&c.TokenFile, "token-file", "/var/run/secrets/tokens/istio-token", "service-account token (audience istio-ca) sent to the ca; re-read at each request")
	fs.StringVar(&c.ProvisionedCertDir, "provisioned-cert-dir", cli.EnvOr("PROV_CERT", ""), "folder with cert-chain.pem and key.pem authenticating the first request without a token (VMs; Istio's PROV_CERT); the --output-dir itself lets a restarted agent use the certificate it last got")
	fs.StringVar(&c.ClusterID, "cluster-id", cli.EnvOr("ISTIO_META_CLUSTER_ID", "Kubernetes"), "cluster the workload runs in, sent to the ca")
	fs.StringVar(&c.TrustDomain, "trust-domain", "cluster.local", "trust domain named in the CSR")
	fs.StringVar((*string)(&c.KeyAlgorithm), "key-algorithm", "ECDSA_P256", "workload key: ECDSA_P256 or RSA_2048")
	fs.DurationVar(&c.CertTTL, "cert-ttl", 24*time.Hour, "certificate lifetime asked for (the ca may shorten it); renewed at 80 %")
	fs.StringVar(&c.SDSSocket, "sds-socket", "./var/run/secrets/workload-spiffe-uds/socket", "Unix socket serving Envoy's SDS (default and ROOTCA); empty: none")
	fs.StringVar(&c.OutputDir, "output-dir", "./var/run/secrets/workload-spiffe-credentials", "folder receiving cert-chain.pem, key.pem and root-cert.pem for proxyless gRPC; empty: none")
	fs.DurationVar(&c.FileRefresh, "file-refresh", 900*time.Second, "how often gRPC re-reads the credential files (the bootstrap's refresh_interval)")
	fs.StringVar(&c.GRPCBootstrap, "grpc-bootstrap", cli.EnvOr("GRPC_XDS_BOOTSTRAP", "./etc/istio/proxy/grpc-bootstrap.json"), "where the gRPC xDS bootstrap is written; empty: none")
	fs.StringVar(&c.XDSAddress, "xds-address", "istiod.istio-system.svc:15010", "xDS server named in the gRPC bootstrap and reached by the xDS proxy (Istio's 15012 with --xds-tls)")
	fs.BoolVar(&c.XDSOverTLS, "xds-tls", false, "the xDS proxy and the bootstrap's xDS channel use mTLS with the workload certificate (else plaintext)")
	fs.StringVar(&c.Pod, "pod", cli.EnvOr("POD_NAME", ""), "pod (or workload) name, in the node ID")
	fs.StringVar(&c.Namespace, "namespace", cli.EnvOr("POD_NAMESPACE", ""), "namespace in the node ID (default: the identity's)")
	fs.StringVar(&c.IP, "ip", cli.EnvOr("INSTANCE_IP", ""), "workload IP, in the node ID")
	fs.StringToStringVar(&c.Labels, "labels", nil, "workload labels, in the node metadata (k=v,...)")
	fs.StringVar(&c.ProxyType, "proxy-type", cli.EnvOr("SAILPLANE_PROXY_TYPE", grpcbootstrap.Sidecar), "node type presented to the xDS server: sidecar, or router for a gateway (pilot-agent's `proxy sidecar` and `proxy router`; env SAILPLANE_PROXY_TYPE)")
	fs.StringVar(&c.XDSProxySocket, "xds-proxy-socket", "./etc/istio/proxy/XDS", "Unix socket forwarding the local proxy's ADS streams to --xds-address; empty: none")
	fs.StringVar(&c.EnvoyBootstrap, "envoy-bootstrap", "./etc/istio/proxy/envoy-rev.json", "where Envoy's bootstrap is written (ADS through --xds-proxy-socket, SDS from --sds-socket); empty: none")
	fs.StringVar(&c.EnvoyAdmin, "envoy-admin-address", "127.0.0.1:15000", "Envoy's admin address, written in its bootstrap; its /stats/prometheus is merged into the agent's")
	fs.BoolVar(&c.DNSCapture, "dns-capture", cli.EnvOr("ISTIO_META_DNS_CAPTURE", "") == "true", "answer the workload's DNS on --dns-address from the xDS server's name table (Istio's ISTIO_META_DNS_CAPTURE)")
	fs.BoolVar(&c.DNSAutoAllocate, "dns-auto-allocate", cli.EnvOr("ISTIO_META_DNS_AUTO_ALLOCATE", "") == "true", "ask for addresses for ServiceEntries without any (Istio's ISTIO_META_DNS_AUTO_ALLOCATE)")
	fs.StringVar(&c.DNSAddr, "dns-address", cli.EnvOr("DNS_PROXY_ADDR", "127.0.0.1:15053"), "UDP and TCP address of the DNS proxy (Istio's DNS_PROXY_ADDR)")
	fs.StringVar(&c.ResolvConf, "resolv-conf", "/etc/resolv.conf", "resolver configuration: the nameservers other names are forwarded to, and the search domains")
	fs.StringVar(&c.DNSUpstreamPort, "dns-upstream-port", "53", "port of resolv.conf's nameservers (for tests; resolv.conf cannot name one)")
	fs.StringVar(&c.ReadinessAddr, "readiness-address", "127.0.0.1:15020", "address serving /healthz/ready, /healthz/agent, POST /drain (from loopback), and Prometheus metrics at /stats/prometheus and /metrics; empty: none")
	fs.BoolVar(&c.EnvoyReadiness, "envoy-readiness", cli.EnvOr("SAILPLANE_ENVOY_READINESS", "") == "true", "/healthz/ready also waits for Envoy (first LDS and CDS accepted, server LIVE, workers started), as pilot-agent's (env SAILPLANE_ENVOY_READINESS)")
}
