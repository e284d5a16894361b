package envoygen

import (
	"cmp"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	"sailplane.dev/services/xds-server/internal/authn"
)

// The ALPN values a client sidecar sends over Istio mTLS: "istio-http/*" and "istio-h2" for
// what its outbound listener saw as HTTP, "istio-peer-exchange" and "istio" for the rest.
var (
	mtlsHTTPALPNs     = []string{"istio-http/1.0", "istio-http/1.1", "istio-h2"}
	mtlsTCPALPNs      = []string{"istio-peer-exchange", "istio"}
	allIstioMTLSALPNs = []string{"istio", "istio-peer-exchange", "istio-http/1.0", "istio-http/1.1", "istio-h2"}
)

// serverCipherSuites are istiod's cipher suites for inbound mTLS.
var serverCipherSuites = []string{
	"ECDHE-ECDSA-AES256-GCM-SHA384",
	"ECDHE-RSA-AES256-GCM-SHA384",
	"ECDHE-ECDSA-AES128-GCM-SHA256",
	"ECDHE-RSA-AES128-GCM-SHA256",
	"AES256-GCM-SHA384",
	"AES128-GCM-SHA256",
}

// chainOption is one inbound filter chain of a port: what it matches, whether it runs an HTTP
// manager or a tcp_proxy, and whether it terminates Istio mTLS.
type chainOption struct {
	transport string // "tls" (set by tls_inspector) or "raw_buffer"
	alpn      []string
	http      bool
	mtls      bool
}

// inboundChainOptions are the chains istiod gives a port of protocol proto in mode, in its
// order (filterchain_options.go): declared HTTP and TCP ports get an mTLS chain, a plaintext
// one or both; TCP ports in PERMISSIVE also pass other TLS (no istio ALPN) through as TCP; an
// undeclared protocol (and the passthrough) gets HTTP and TCP chains of each.
func inboundChainOptions(proto protocol, mode authn.Mode) []chainOption {
	plainHTTP := chainOption{transport: "raw_buffer", alpn: plaintextHTTPALPNs, http: true}
	plainTCP := chainOption{transport: "raw_buffer"}
	switch {
	case proto == protoSniffed:
		switch mode {
		case authn.Strict:
			return []chainOption{{transport: "tls", alpn: mtlsHTTPALPNs, http: true, mtls: true}, {transport: "tls", mtls: true}}
		case authn.Disable:
			return []chainOption{plainHTTP, plainTCP}
		}
		return []chainOption{{transport: "tls", alpn: mtlsHTTPALPNs, http: true, mtls: true}, plainHTTP,
			{transport: "tls", alpn: mtlsTCPALPNs, mtls: true}, plainTCP, {transport: "tls"}}
	case proto.isHTTP():
		switch mode {
		case authn.Strict:
			return []chainOption{{transport: "tls", http: true, mtls: true}}
		case authn.Disable:
			return []chainOption{{transport: "raw_buffer", http: true}}
		}
		return []chainOption{{transport: "tls", alpn: allIstioMTLSALPNs, http: true, mtls: true}, {transport: "raw_buffer", http: true}}
	}
	switch mode {
	case authn.Strict:
		return []chainOption{{transport: "tls", mtls: true}}
	case authn.Disable:
		return []chainOption{plainTCP}
	}
	return []chainOption{{transport: "tls", alpn: allIstioMTLSALPNs, mtls: true}, {transport: "tls"}, plainTCP}
}

// inboundMTLS is the transport socket terminating Istio mTLS on an inbound chain, as istiod
// builds it: the workload certificate from the agent's SDS ("default"), clients required to
// present one chaining to the mesh root ("ROOTCA") with a SPIFFE ID of a trusted trust domain;
// ALPN for HTTP (h2, http/1.1), with istio-peer-exchange first on TCP chains. The mesh's
// meshMTLS sets the minimum TLS version and the cipher suites. Built once per proxy.
func (b *builder) inboundMTLS(http bool) *corev3.TransportSocket {
	i := 0
	if http {
		i = 1
	}
	if ts := b.mtlsSockets[i]; ts != nil {
		return ts
	}
	mm := b.snap.Mesh.GetMeshMTLS()
	params := &tlsv3.TlsParameters{CipherSuites: serverCipherSuites,
		TlsMinimumProtocolVersion: tlsv3.TlsParameters_TLSv1_2, TlsMaximumProtocolVersion: tlsv3.TlsParameters_TLSv1_3}
	if mm.GetCipherSuites() != nil {
		params.CipherSuites = mm.GetCipherSuites()
	}
	if mm.GetMinProtocolVersion() == meshv1alpha1.MeshConfig_TLSConfig_TLSV1_3 {
		params.TlsMinimumProtocolVersion = tlsv3.TlsParameters_TLSv1_3
	}
	alpn := []string{"istio-peer-exchange", "h2", "http/1.1"}
	if http {
		alpn = alpn[1:]
	}
	validation := &tlsv3.CertificateValidationContext{}
	for _, td := range b.trustDomains() {
		validation.MatchTypedSubjectAltNames = append(validation.MatchTypedSubjectAltNames, &tlsv3.SubjectAltNameMatcher{
			SanType: tlsv3.SubjectAltNameMatcher_URI,
			Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: "spiffe://" + td + "/"}}})
	}
	ctx := &tlsv3.DownstreamTlsContext{
		CommonTlsContext: &tlsv3.CommonTlsContext{
			TlsParams:                      params,
			TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{sdsSecret("default")},
			ValidationContextType: &tlsv3.CommonTlsContext_CombinedValidationContext{
				CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
					DefaultValidationContext:         validation,
					ValidationContextSdsSecretConfig: sdsSecret("ROOTCA"),
				}},
			AlpnProtocols: alpn,
		},
		RequireClientCertificate: wrapperspb.Bool(true),
	}
	b.mtlsSockets[i] = &corev3.TransportSocket{Name: tlsTransportSocket,
		ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAny(ctx)}}
	return b.mtlsSockets[i]
}

// trustDomains are the trust domains whose SPIFFE IDs inbound mTLS accepts, as istiod's
// TrustDomainsForValidation: the mesh's, its aliases, and those of its extra CA certificates,
// without duplicates or empties.
func (b *builder) trustDomains() []string {
	m := b.snap.Mesh
	all := append([]string{cmp.Or(m.GetTrustDomain(), "cluster.local")}, m.GetTrustDomainAliases()...)
	for _, c := range m.GetCaCertificates() {
		all = append(all, c.GetTrustDomains()...)
	}
	var out []string
	seen := map[string]bool{}
	for _, td := range all {
		if td != "" && !seen[td] {
			seen[td] = true
			out = append(out, td)
		}
	}
	return out
}
