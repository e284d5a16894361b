package agent

import (
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"sailplane.dev/shared/grpcbootstrap"
)

// The static clusters of Istio's Envoy bootstrap: ADS through the agent's xDS proxy and SDS
// from the agent; istiod's xDS names sds-grpc in every SDS config it sends.
const (
	xdsCluster = "xds-grpc"
	sdsCluster = "sds-grpc"
)

// envoyBootstrap is the bootstrap Envoy starts with beside this agent: its node as istiod knows
// it, the admin endpoint on admin (host:port), everything else from ADS through XDSProxySocket,
// and SDS from SDSSocket.
func envoyBootstrap(w grpcbootstrap.Workload, nodeType, cluster, admin, xdsSocket, sdsSocket string) (*bootstrapv3.Bootstrap, error) {
	adminHost, adminPort, err := net.SplitHostPort(admin)
	if err != nil {
		return nil, fmt.Errorf("envoy admin address: %w", err)
	}
	port, err := strconv.ParseUint(adminPort, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("envoy admin address %q: port: %w", admin, err)
	}
	md, err := structpb.NewStruct(grpcbootstrap.NodeMetadata(w))
	if err != nil {
		return nil, fmt.Errorf("node metadata: %w", err)
	}
	h2, err := anypb.New(&httpv3.HttpProtocolOptions{UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{
		ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{
			Http2ProtocolOptions: &corev3.Http2ProtocolOptions{},
		}},
	}})
	if err != nil {
		return nil, err
	}
	unixCluster := func(name, path string) *clusterv3.Cluster {
		return &clusterv3.Cluster{
			Name:                 name,
			ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
			ConnectTimeout:       durationpb.New(time.Second),
			LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{
				LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
					Address: &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: path}}},
				}}}},
			}}},
			TypedExtensionProtocolOptions: map[string]*anypb.Any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": h2},
		}
	}
	ads := &corev3.ConfigSource{
		ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
		ResourceApiVersion:    corev3.ApiVersion_V3,
		InitialFetchTimeout:   durationpb.New(0),
	}
	b := &bootstrapv3.Bootstrap{
		Node: &corev3.Node{Id: grpcbootstrap.NodeID(nodeType, w.IP, w.Pod, w.Namespace, w.DNSDomain), Cluster: cluster, Metadata: md},
		Admin: &bootstrapv3.Admin{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: adminHost, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(port)},
		}}}},
		DynamicResources: &bootstrapv3.Bootstrap_DynamicResources{
			LdsConfig: ads, CdsConfig: ads,
			AdsConfig: &corev3.ApiConfigSource{
				ApiType: corev3.ApiConfigSource_GRPC, TransportApiVersion: corev3.ApiVersion_V3, SetNodeOnFirstMessageOnly: true,
				GrpcServices: []*corev3.GrpcService{{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: xdsCluster}}}},
			},
		},
		StaticResources: &bootstrapv3.Bootstrap_StaticResources{Clusters: []*clusterv3.Cluster{
			unixCluster(xdsCluster, xdsSocket), unixCluster(sdsCluster, sdsSocket),
		}},
	}
	if err := b.ValidateAll(); err != nil {
		return nil, fmt.Errorf("envoy bootstrap: %w", err)
	}
	return b, nil
}

func (a *Agent) writeEnvoyBootstrap(c *Credential) error {
	w := a.workload(c)
	// Envoy resolves relative paths from its own working folder.
	xds, err := filepath.Abs(a.cfg.XDSProxySocket)
	if err != nil {
		return err
	}
	sds, err := filepath.Abs(a.cfg.SDSSocket)
	if err != nil {
		return err
	}
	b, err := envoyBootstrap(w, a.nodeType(), c.ID.ServiceAccount+"."+w.Namespace, a.cfg.EnvoyAdmin, xds, sds)
	if err != nil {
		return err
	}
	// Envoy's listeners depend on DNS capture too (auto-allocated addresses), as in istiod.
	dnsMD := map[string]any{}
	a.dnsMetadata(dnsMD)
	for k, v := range dnsMD {
		b.Node.Metadata.Fields[k] = structpb.NewStringValue(v.(string))
	}
	data, err := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(b)
	if err != nil {
		return fmt.Errorf("envoy bootstrap: %w", err)
	}
	if err := grpcbootstrap.WriteAtomic(a.cfg.EnvoyBootstrap, data, 0o644); err != nil {
		return fmt.Errorf("write the Envoy bootstrap: %w", err)
	}
	return nil
}
