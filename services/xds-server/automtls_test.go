package xdsserver

import (
	"slices"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"sailplane.dev/services/xds-server/internal/fakebus"
)

const echoService = `apiVersion: sailplane.dev/v1
kind: Service
spec:
  hostname: echo.demo.svc.cluster.local
  namespace: demo
  ports: [{name: grpc, number: 7070, protocol: GRPC}]
---
`

// echoEndpoints is one endpoint of echo with service account sa and labels ("k: v").
func echoEndpoints(sa, labels string) string {
	return `apiVersion: sailplane.dev/v1
kind: Endpoints
spec:
  hostname: echo.demo.svc.cluster.local
  namespace: demo
  endpoints:
  - {address: 10.0.0.1, serviceAccount: ` + sa + `, labels: {` + labels + `}}
`
}

const inMeshLabel = "security.istio.io/tlsMode: istio"

// TestProxylessAutoMTLS: two proxyless clients of one namespace, one in the mesh, share no
// cached clusters (the cache asserts it); when the destination's endpoint joins the mesh, an
// endpoints-only change, the client in the mesh is pushed an mTLS cluster, the other keeps its
// plaintext one.
func TestProxylessAutoMTLS(t *testing.T) {
	src := fakebus.New(changes(t, echoService+echoEndpoints("echo", ""))...)
	srv := startServer(t, src)
	open := func(name string, labels map[string]any) discoverygrpc.AggregatedDiscoveryService_DeltaAggregatedResourcesClient {
		stream, err := adsClient(t, srv.Addr()).DeltaAggregatedResources(streamContext(t))
		if err != nil {
			t.Fatal(err)
		}
		md, _ := structpb.NewStruct(map[string]any{"GENERATOR": "grpc", "NAMESPACE": "demo", "LABELS": labels})
		node := testNode(name)
		node.Metadata = md
		if err := stream.Send(&discoverygrpc.DeltaDiscoveryRequest{Node: node, TypeUrl: resource.ClusterType,
			ResourceNamesSubscribe: []string{echoCluster}}); err != nil {
			t.Fatal(err)
		}
		return stream
	}
	// next returns the SANs of the next cluster pushed on stream (nil without mTLS), after
	// ACKing it.
	next := func(stream discoverygrpc.AggregatedDiscoveryService_DeltaAggregatedResourcesClient) []string {
		t.Helper()
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetResources()) != 1 {
			t.Fatalf("got %d clusters, want 1", len(resp.GetResources()))
		}
		var c clusterv3.Cluster
		if err := resp.GetResources()[0].GetResource().UnmarshalTo(&c); err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: resp.GetNonce()}); err != nil {
			t.Fatal(err)
		}
		if c.GetTransportSocket() == nil {
			return nil
		}
		var tls tlsv3.UpstreamTlsContext
		if err := c.GetTransportSocket().GetTypedConfig().UnmarshalTo(&tls); err != nil {
			t.Fatal(err)
		}
		sans := []string{}
		for _, m := range tls.GetCommonTlsContext().GetCombinedValidationContext().GetDefaultValidationContext().GetMatchSubjectAltNames() { //nolint:staticcheck // what gRPC reads
			sans = append(sans, m.GetExact())
		}
		return sans
	}
	inMesh := open("in-mesh", map[string]any{"security.istio.io/tlsMode": "istio"})
	if next(inMesh) != nil || next(open("outside", map[string]any{"app": "caller"})) != nil {
		t.Fatal("mTLS to an endpoint outside the mesh")
	}

	src.Push(changes(t, echoEndpoints("echo", inMeshLabel))[0])
	if got := next(inMesh); !slices.Equal(got, []string{"spiffe://cluster.local/ns/demo/sa/echo"}) {
		t.Fatalf("once the endpoint joined the mesh, the client in it got SANs %v, want the endpoint's", got)
	}
	// The endpoint's identity changes, endpoints only again: the SAN follows.
	src.Push(changes(t, echoEndpoints("echo-v2", inMeshLabel))[0])
	if got := next(inMesh); !slices.Equal(got, []string{"spiffe://cluster.local/ns/demo/sa/echo-v2"}) {
		t.Fatalf("after the identity changed: SANs %v, want echo-v2's", got)
	}
	// A client outside the mesh, in the same namespace, still gets plaintext (its cluster
	// never changed, so the one subscribed earlier is pushed nothing: ask afresh).
	if got := next(open("outside-2", map[string]any{"app": "caller"})); got != nil {
		t.Fatalf("mTLS for a client outside the mesh: %v", got)
	}
}
