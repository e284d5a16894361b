package envoygen

import (
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"sailplane.dev/services/xds-server/internal/model"
	"strings"
)

type anyMsg = anypb.Any

// sdsCluster is the agent's SDS server as the bootstrap names it.
const sdsCluster = "sds-grpc"

// mustAny packs m. Packing fails only on invalid UTF-8 copied from config; rather than panic,
// the filter then gets its default config, and the invalid resource is dropped where
// resources are serialized for the wire.
func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		return &anypb.Any{TypeUrl: "type.googleapis.com/" + string(m.ProtoReflect().Descriptor().FullName())}
	}
	return a
}

func adsConfigSource() *corev3.ConfigSource {
	return &corev3.ConfigSource{
		ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
		InitialFetchTimeout:   durationpb.New(0),
		ResourceApiVersion:    corev3.ApiVersion_V3,
	}
}

// sdsSecret names a secret the proxy fetches from its agent over SDS. The workload's own
// ("default") and the mesh root ("ROOTCA"), in every mTLS context, are built once and shared:
// generated resources are never modified.
func sdsSecret(name string) *tlsv3.SdsSecretConfig {
	switch name {
	case "default":
		return sdsDefault
	case "ROOTCA":
		return sdsRootCA
	}
	return newSDSSecret(name, nil)
}

// The agent always has the workload's certificate and the mesh root, so Envoy waits for them
// as long as it takes (0s: no timeout), as istiod does. A file named by a DestinationRule or
// Gateway (file-cert:, file-root:) may never exist: like istiod, Envoy's default initial fetch
// timeout (15s) applies, after which the listener or cluster starts without it and its TLS
// handshakes fail (never plaintext) instead of holding Envoy's start-up forever.
var sdsDefault, sdsRootCA = newSDSSecret("default", durationpb.New(0)), newSDSSecret("ROOTCA", durationpb.New(0))

func newSDSSecret(name string, initialFetchTimeout *durationpb.Duration) *tlsv3.SdsSecretConfig {
	return &tlsv3.SdsSecretConfig{Name: name, SdsConfig: &corev3.ConfigSource{
		InitialFetchTimeout: initialFetchTimeout,
		ResourceApiVersion:  corev3.ApiVersion_V3,
		ConfigSourceSpecifier: &corev3.ConfigSource_ApiConfigSource{ApiConfigSource: &corev3.ApiConfigSource{
			ApiType:                   corev3.ApiConfigSource_GRPC,
			TransportApiVersion:       corev3.ApiVersion_V3,
			SetNodeOnFirstMessageOnly: true,
			GrpcServices: []*corev3.GrpcService{{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{
				EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: sdsCluster}}}},
		}},
	}}
}

// credentialSDS names a credentialName secret ("kubernetes://<name>", its "-cacert" CA, a
// "configmap://" CA), which istiod serves over ADS itself (its agent serves only the workload's
// own certificates) after checking that the proxy may read it. Like istiod, no initial fetch
// timeout of 0: a secret that never comes must not hold the whole listener or cluster back
// (without it the TLS handshakes fail, they never fall back to plaintext). The xds-server
// serves "kubernetes://" secrets when it has a cluster (WithCredentials).
func credentialSDS(name string) *tlsv3.SdsSecretConfig {
	return &tlsv3.SdsSecretConfig{Name: name, SdsConfig: &corev3.ConfigSource{
		ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
		ResourceApiVersion:    corev3.ApiVersion_V3,
	}}
}

// credentialNotServed reports the credentialName secrets (SDS names) the proxy's TLS needs that
// nothing serves: "kubernetes://" ones without a cluster to read them from (WithCredentials),
// and other kinds (configmap://, ...) always. Those served are reported, when they cannot be,
// by the secret server, which knows the Secret and who asks.
func (b *builder) credentialNotServed(names ...string) {
	for _, n := range names {
		kube := strings.HasPrefix(n, "kubernetes://") || strings.HasPrefix(n, "kubernetes-gateway://")
		if b.credentials && kube {
			continue
		}
		why := "Sailplane serves only kubernetes:// secrets, from a Kubernetes cluster"
		if kube {
			why = "the xds-server has no Kubernetes cluster to read Secrets from"
		}
		b.report(model.MetricCredentialNotServed, n, "credentialName secret "+n+" is not served: "+why+", so TLS handshakes needing it fail")
	}
}

// specOf is the spec of an optional config, nil when there is none.
func specOf[T proto.Message](c *model.Config[T]) T {
	if c == nil {
		var zero T
		return zero
	}
	return c.Spec
}
