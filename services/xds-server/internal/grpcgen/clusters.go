package grpcgen

import (
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/xds-server/internal/authn"
	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/services/xds-server/internal/translate"
	"sailplane.dev/shared/grpcbootstrap"
)

// maxRingSize is Envoy's (and gRPC's) upper bound for ring_hash minimum_ring_size.
const maxRingSize = 8 * 1024 * 1024

type subsetCluster struct {
	cluster *clusterv3.Cluster
	subset  *networking.Subset // nil for the whole service
}

func (g *generator) clusters(svc *model.Service, port *discoveryv1.Port,
	dr *model.Config[*networking.DestinationRule]) []subsetCluster {
	host := svc.Spec.GetHostname()
	var out []subsetCluster
	if c := g.cluster(ClusterName(port.GetNumber(), "", host), svc, dr, port.GetNumber(), ""); c != nil {
		out = append(out, subsetCluster{cluster: c})
	}
	if dr == nil {
		return out
	}
	for _, ss := range translate.Subsets(dr.Spec) {
		name := ClusterName(port.GetNumber(), ss.GetName(), host)
		if c := g.cluster(name, svc, dr, port.GetNumber(), ss.GetName()); c != nil {
			out = append(out, subsetCluster{cluster: c, subset: ss})
		}
	}
	return out
}

// cluster builds one cluster, nil when the rule asks for TLS gRPC cannot be given.
func (g *generator) cluster(name string, svc *model.Service, dr *model.Config[*networking.DestinationRule], port uint32,
	subset string) *clusterv3.Cluster {
	c := &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{
			EdsConfig:   adsConfigSource(),
			ServiceName: name,
		},
		LbPolicy: clusterv3.Cluster_ROUND_ROBIN,
	}
	var spec *networking.DestinationRule
	log := g.log
	if dr != nil {
		spec = dr.Spec
		log = log.With("destinationRule", dr.Namespace+"/"+dr.Name, "cluster", name)
	}
	pol := translate.TrafficPolicy(spec, port, subset)
	// gRPC limits only concurrent requests (gRFC A32), as istiod sets it.
	if n := pol.Pool.GetHttp().GetHttp2MaxRequests(); n > 0 {
		c.CircuitBreakers = &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{{
			MaxRequests: wrapperspb.UInt32(uint32(n))}}}
	}
	lb := pol.LB
	switch {
	case pol.TLS == nil:
		if g.autoMTLS(svc) {
			c.TransportSocket = istioMutualTLS(translate.ServiceIdentities(svc, g.snap.Mesh))
		}
	case pol.TLS.GetMode() == networking.ClientTLSSettings_ISTIO_MUTUAL:
		sans := pol.TLS.GetSubjectAltNames()
		if sans == nil {
			sans = translate.ServiceIdentities(svc, g.snap.Mesh)
		}
		c.TransportSocket = istioMutualTLS(sans)
	case pol.TLS.GetMode() == networking.ClientTLSSettings_DISABLE:
	default:
		// gRPC clients take TLS only from certificate providers (no SDS, no files named in
		// xDS); istiod sends SIMPLE and MUTUAL clusters in plaintext. What the rule asks to
		// encrypt must not go out in the clear: no cluster, so its RPCs fail.
		log.Debug("leaving out cluster: its TLS origination cannot be built for gRPC clients", "mode", pol.TLS.GetMode().String())
		return nil
	}
	switch {
	case lb == nil:
	case lb.GetConsistentHash() != nil:
		ch := lb.GetConsistentHash()
		if ch.GetMaglev() != nil {
			log.Debug("maglev is not supported by gRPC, using ring hash")
		}
		c.LbPolicy = clusterv3.Cluster_RING_HASH
		size := ch.GetRingHash().GetMinimumRingSize()
		if size == 0 {
			size = ch.GetMinimumRingSize() //nolint:staticcheck // still honoured by Istio
		}
		if size > 0 {
			c.LbConfig = &clusterv3.Cluster_RingHashLbConfig_{RingHashLbConfig: &clusterv3.Cluster_RingHashLbConfig{
				MinimumRingSize: wrapperspb.UInt64(min(size, maxRingSize)),
			}}
		}
	default:
		switch lb.GetSimple() {
		case networking.LoadBalancerSettings_UNSPECIFIED, networking.LoadBalancerSettings_ROUND_ROBIN:
		case networking.LoadBalancerSettings_LEAST_REQUEST, networking.LoadBalancerSettings_LEAST_CONN:
			c.LbPolicy = clusterv3.Cluster_LEAST_REQUEST
		default:
			// gRPC NACKs any other lb_policy, which would break the whole cluster.
			log.Debug("load balancer not supported by gRPC, using round robin", "simple", lb.GetSimple().String())
		}
	}
	return c
}

// autoMTLS decides mesh mTLS for a cluster of svc without TLS settings. istiod's gRPC
// generator never does it; Envoy sidecars choose per endpoint (transport_socket_matches on
// the endpoint's tlsMode label), which gRPC refuses, so the choice is per cluster: only for a
// client holding mesh certificates (else gRPC refuses the cluster, its certificate provider
// missing), never when MeshConfig turns auto mTLS off, the service is outside the mesh or
// its namespace DISABLEs mTLS; always when the namespace is STRICT; else (PERMISSIVE) when
// every endpoint is labelled in the mesh, which is when proxyless servers serve mTLS.
func (g *generator) autoMTLS(svc *model.Service) bool {
	if !g.inMesh || svc.Spec.GetMeshExternal() || !AutoMTLSEnabled(g.snap) {
		return false
	}
	switch authn.NamespaceMode(g.snap, svc.Spec.GetNamespace()) {
	case authn.Disable:
		return false
	case authn.Strict:
		return true
	}
	return model.EndpointsInMesh(svc.Endpoints)
}

// AutoMTLSEnabled is MeshConfig's enableAutoMtls, true when unset.
func AutoMTLSEnabled(snap *model.Snapshot) bool {
	v := snap.Mesh.GetEnableAutoMtls()
	return v == nil || v.GetValue()
}

// istioMutualTLS is mesh mTLS for a gRPC client, as istiod writes it, accepting only sans. A
// client without xDS credentials ignores it.
func istioMutualTLS(sans []string) *corev3.TransportSocket {
	return tlsTransportSocket(&tlsv3.UpstreamTlsContext{CommonTlsContext: meshTLSContext(sans)})
}

// meshTLSContext is istiod's CommonTlsContext for gRPC: certificates and roots from the
// "default" certificate provider (what the agent's gRPC bootstrap declares; certificate names
// "default" and "ROOTCA" as for SDS, which file_watcher ignores), sans to accept. gRPC reads
// neither TLS parameters nor typed SAN matchers, so none are sent; the deprecated provider
// fields are sent too for clients older than gRPC 1.66.
func meshTLSContext(sans []string) *tlsv3.CommonTlsContext {
	var match []*matcherv3.StringMatcher
	for _, s := range sans {
		match = append(match, &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: s}})
	}
	return &tlsv3.CommonTlsContext{
		TlsCertificateProviderInstance: &tlsv3.CertificateProviderPluginInstance{InstanceName: certProvider, CertificateName: "default"},
		TlsCertificateCertificateProviderInstance: &tlsv3.CommonTlsContext_CertificateProviderInstance{
			InstanceName: certProvider, CertificateName: "default"},
		ValidationContextType: &tlsv3.CommonTlsContext_CombinedValidationContext{
			CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
				DefaultValidationContext: &tlsv3.CertificateValidationContext{
					MatchSubjectAltNames: match, //nolint:staticcheck // the only SAN matcher gRPC reads
					CaCertificateProviderInstance: &tlsv3.CertificateProviderPluginInstance{
						InstanceName: certProvider, CertificateName: "ROOTCA"},
				},
				ValidationContextCertificateProviderInstance: &tlsv3.CommonTlsContext_CertificateProviderInstance{
					InstanceName: certProvider, CertificateName: "ROOTCA"},
			}},
	}
}

// certProvider is the certificate provider instance of the gRPC bootstrap the agent writes.
const certProvider = grpcbootstrap.DefaultProvider

// tlsTransportSocket wraps an Upstream or DownstreamTlsContext under the name gRPC requires.
func tlsTransportSocket(ctx proto.Message) *corev3.TransportSocket {
	a, _ := marshalAny(ctx) // TLS contexts always marshal
	return &corev3.TransportSocket{Name: "envoy.transport_sockets.tls",
		ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: a}}
}
