package model

// Istio's push status metrics: what translation found wrong and resolved on its own, under the
// names istiod reports them by in /debug/push_status and as Prometheus gauges.
const (
	// MetricDupDomain: a service's virtual host left out domains another one took (key: the
	// virtual host, "<host>:<port>").
	MetricDupDomain = "pilot_vservice_dup_domain"
	// MetricOutboundTCPConflict: two services want one outbound TCP listener; the first keeps
	// it (key: the listener, "<ip>_<port>").
	MetricOutboundTCPConflict = "pilot_conflict_outbound_listener_tcp_over_current_tcp"
	// MetricInboundConflict: two services of different protocols select one port of the
	// proxy's workload; the first keeps it (key: the proxy).
	MetricInboundConflict = "pilot_conflict_inbound_listener"
	// MetricDestRuleSubsets: DestinationRules of one host and namespace repeat a subset name
	// (key: the host).
	MetricDestRuleSubsets = "pilot_destrule_subsets"
	// MetricDNSClusterNoEndpoints: a DNS cluster (a subset, usually) selects no endpoint (key:
	// the cluster).
	MetricDNSClusterNoEndpoints = "pilot_dns_cluster_without_endpoints"
	// MetricEDSNoInstances: an EDS cluster has no healthy endpoint (key: the cluster).
	MetricEDSNoInstances = "pilot_eds_no_instances"
	// MetricEndpointNotReady: a connected proxy's own endpoint is unhealthy (key: the proxy).
	MetricEndpointNotReady = "pilot_endpoint_not_ready"
	// MetricClusterTLSRefused (Sailplane's own, istiod has none): a cluster whose
	// DestinationRule asks for TLS this proxy cannot be given was left out rather than sent
	// without that TLS (key: the cluster).
	MetricClusterTLSRefused = "sailplane_cluster_tls_refused"
	// MetricCredentialNotServed (Sailplane's own): a gateway's TLS needs a credentialName
	// secret, which Sailplane does not serve over SDS yet; the handshakes needing it fail
	// (key: the SDS resource, "kubernetes://<name>").
	MetricCredentialNotServed = "sailplane_credential_not_served"
)

// Problem is one entry of the push status: istiod's ProxyPushStatus under its metric and key.
type Problem struct {
	Metric string
	Key    string
	// Proxy is the proxy whose configuration showed the problem ("<pod>.<namespace>"); empty
	// for problems of the mesh as a whole.
	Proxy   string
	Message string
}

// Problems receives the problems generation finds in a snapshot (istiod's AddMetric). It is
// called concurrently, from every proxy's generation.
type Problems interface {
	Report(snap *Snapshot, p Problem)
}
