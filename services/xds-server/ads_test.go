package xdsserver

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"sailplane.dev/services/xds-server/internal/fakebus"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/testwait"
)

const (
	echoListener = "echo.demo.svc.cluster.local:7070"
	echoCluster  = "outbound|7070||echo.demo.svc.cluster.local"
)

func adsClient(t *testing.T, addr net.Addr, opts ...grpc.DialOption) discoverygrpc.AggregatedDiscoveryServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr.String(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return discoverygrpc.NewAggregatedDiscoveryServiceClient(conn)
}

// testNode is a proxyless client of namespace demo; name is its pod name.
func testNode(name string) *corev3.Node {
	md, _ := structpb.NewStruct(map[string]any{"GENERATOR": "grpc", "NAMESPACE": "demo"})
	return &corev3.Node{Id: "sidecar~127.0.0.1~" + name + ".demo~demo.svc.cluster.local", Metadata: md}
}

func streamContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	t.Cleanup(cancel)
	return ctx
}

func TestDeltaADS(t *testing.T) {
	src := fakebus.New(changes(t, registry(10001, 10002))...)
	srv := startServer(t, src)
	stream, err := adsClient(t, srv.Addr()).DeltaAggregatedResources(streamContext(t))
	if err != nil {
		t.Fatal(err)
	}
	recv := func(typeURL string) *discoverygrpc.DeltaDiscoveryResponse {
		t.Helper()
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetTypeUrl() != typeURL {
			t.Fatalf("got %s, want %s", resp.GetTypeUrl(), typeURL)
		}
		// ACK, as a client must before the server sends this type again.
		if err := stream.Send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: typeURL, ResponseNonce: resp.GetNonce()}); err != nil {
			t.Fatal(err)
		}
		return resp
	}

	t.Run("listener by name", func(t *testing.T) {
		if err := stream.Send(&discoverygrpc.DeltaDiscoveryRequest{
			Node: testNode("delta-client"), TypeUrl: resource.ListenerType, ResourceNamesSubscribe: []string{echoListener},
		}); err != nil {
			t.Fatal(err)
		}
		resp := recv(resource.ListenerType)
		if len(resp.GetResources()) != 1 || resp.GetResources()[0].GetName() != echoListener {
			t.Fatalf("resources = %v", resp.GetResources())
		}
		var l listenerv3.Listener
		if err := resp.GetResources()[0].GetResource().UnmarshalTo(&l); err != nil {
			t.Fatal(err)
		}
		if l.GetApiListener() == nil {
			t.Fatal("listener has no API listener")
		}
	})

	t.Run("clusters wildcard", func(t *testing.T) {
		if err := stream.Send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType}); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, r := range recv(resource.ClusterType).GetResources() {
			names = append(names, r.GetName())
		}
		slices.Sort(names)
		want := []string{"outbound|7070|v1|echo.demo.svc.cluster.local", "outbound|7070|v2|echo.demo.svc.cluster.local", echoCluster}
		if !slices.Equal(names, want) {
			t.Fatalf("clusters = %v, want %v", names, want)
		}
	})

	t.Run("endpoint update", func(t *testing.T) {
		if err := stream.Send(&discoverygrpc.DeltaDiscoveryRequest{
			TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{echoCluster},
		}); err != nil {
			t.Fatal(err)
		}
		if n := countEndpoints(t, recv(resource.EndpointType)); n != 2 {
			t.Fatalf("%d endpoints, want 2", n)
		}
		src.Push(bus.Change{TypeURL: schema.Endpoints.TypeURL, Removed: []string{"demo/" + echoHost}})
		if n := countEndpoints(t, recv(resource.EndpointType)); n != 0 {
			t.Fatalf("%d endpoints after removal, want 0", n)
		}
	})
}

func countEndpoints(t *testing.T, resp *discoverygrpc.DeltaDiscoveryResponse) int {
	t.Helper()
	if len(resp.GetResources()) != 1 {
		t.Fatalf("got %d resources, want 1", len(resp.GetResources()))
	}
	var cla endpointv3.ClusterLoadAssignment
	if err := resp.GetResources()[0].GetResource().UnmarshalTo(&cla); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range cla.GetEndpoints() {
		n += len(l.GetLbEndpoints())
	}
	return n
}

// gatedSource holds subscriptions back until open is closed, like a bus that is slow to sync.
type gatedSource struct {
	bus.Source
	open chan struct{}
}

func (g gatedSource) Subscribe(ctx context.Context, typeURLs []string, h bus.Handler) error {
	select {
	case <-ctx.Done():
		return nil
	case <-g.open:
	}
	return g.Source.Subscribe(ctx, typeURLs, h)
}

// A client that connects before the sources synced is refused with Unavailable at once (so it
// tries another server instead of waiting); once synced, the server answers.
func TestClientBeforeSync(t *testing.T) {
	gate := gatedSource{Source: fakebus.New(changes(t, registry(10001, 10002))...), open: make(chan struct{})}
	srv, err := New(Config{CacheAssert: true}, Deps{Logger: testLogger(t), Config: fakebus.New(), Registry: gate})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, srv)
	client := adsClient(t, addr)

	if _, err := listenerRequest(t, client, "early-client"); status.Code(err) != codes.Unavailable {
		t.Fatalf("stream before the sync: %v, want Unavailable", err)
	}
	select {
	case <-srv.Ready():
		t.Fatal("ready before the registry synced")
	default:
	}
	close(gate.open)
	select {
	case <-srv.Ready():
	case <-time.After(waitFor):
		t.Fatal("not ready")
	}
	resp, err := listenerRequest(t, client, "early-client")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetResources()) != 1 {
		t.Fatalf("got %d listeners, want 1", len(resp.GetResources()))
	}
}

func waitUntil(t testing.TB, cond func() bool) {
	t.Helper()
	testwait.Until(t, waitFor, "condition", cond)
}

// A proxyless client asks for clusters by name, as gRPC does: the answer holds those only, on
// both protocols (istiod's grpcgen builds only the requested clusters).
func TestNamedClusters(t *testing.T) {
	srv := startServer(t, fakebus.New(changes(t, registry(10001, 10002))...))
	v1 := "outbound|7070|v1|echo.demo.svc.cluster.local"
	t.Run("sotw", func(t *testing.T) {
		stream, err := adsClient(t, srv.Addr()).StreamAggregatedResources(streamContext(t))
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&discoverygrpc.DiscoveryRequest{Node: testNode("sotw-named"), TypeUrl: resource.ClusterType,
			ResourceNames: []string{v1, "outbound|7070||unknown.demo.svc.cluster.local"}}); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetResources()) != 1 {
			t.Fatalf("got %d clusters, want only %s", len(resp.GetResources()), v1)
		}
		var c clusterv3.Cluster
		if err := resp.GetResources()[0].UnmarshalTo(&c); err != nil {
			t.Fatal(err)
		}
		if c.GetName() != v1 {
			t.Fatalf("got cluster %s, want %s", c.GetName(), v1)
		}
	})
	t.Run("delta", func(t *testing.T) {
		stream, err := adsClient(t, srv.Addr()).DeltaAggregatedResources(streamContext(t))
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&discoverygrpc.DeltaDiscoveryRequest{Node: testNode("delta-named"), TypeUrl: resource.ClusterType,
			ResourceNamesSubscribe: []string{echoCluster}}); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetResources()) != 1 || resp.GetResources()[0].GetName() != echoCluster {
			t.Fatalf("resources = %v, want only %s", resp.GetResources(), echoCluster)
		}
	})
}

// Proxyless clients get EDS priorities relative to their own locality (here from the xDS node),
// as istiod sends them: with outlier detection, the other region comes second.
func TestProxylessLocality(t *testing.T) {
	srv := startServer(t, fakebus.New(changes(t, `
apiVersion: v1alpha1
kind: MeshConfig
metadata: {name: mesh}
spec:
  localityLbSetting: {enabled: true}
---
apiVersion: sailplane.dev/v1
kind: Service
spec:
  hostname: echo.demo.svc.cluster.local
  namespace: demo
  ports: [{name: grpc, number: 7070, protocol: GRPC}]
---
apiVersion: sailplane.dev/v1
kind: Endpoints
spec:
  hostname: echo.demo.svc.cluster.local
  namespace: demo
  endpoints:
  - {address: 10.0.0.1, locality: {region: us-east, zone: a}}
  - {address: 10.0.0.2, locality: {region: eu-west, zone: b}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: echo, namespace: demo}
spec:
  host: echo
  trafficPolicy:
    outlierDetection: {consecutive5xxErrors: 2}
`)...))
	priorities := func(region string) map[string]uint32 {
		t.Helper()
		stream, err := adsClient(t, srv.Addr()).DeltaAggregatedResources(streamContext(t))
		if err != nil {
			t.Fatal(err)
		}
		node := testNode("locality-" + region)
		node.Locality = &corev3.Locality{Region: region}
		if err := stream.Send(&discoverygrpc.DeltaDiscoveryRequest{Node: node, TypeUrl: resource.EndpointType,
			ResourceNamesSubscribe: []string{echoCluster}}); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetResources()) != 1 {
			t.Fatalf("got %d load assignments, want 1", len(resp.GetResources()))
		}
		var cla endpointv3.ClusterLoadAssignment
		if err := resp.GetResources()[0].GetResource().UnmarshalTo(&cla); err != nil {
			t.Fatal(err)
		}
		out := map[string]uint32{}
		for _, l := range cla.GetEndpoints() {
			out[l.GetLocality().GetRegion()] = l.GetPriority()
		}
		return out
	}
	for _, tc := range []struct{ region, other string }{{"us-east", "eu-west"}, {"eu-west", "us-east"}} {
		got := priorities(tc.region)
		if got[tc.region] != 0 || got[tc.other] != 1 {
			t.Errorf("client in %s: priorities %v, want its region 0 and %s 1", tc.region, got, tc.other)
		}
	}
}

// TestProxylessShortNamesPerNamespace: a proxyless client's virtual host matches the short
// names of its own DNS domain, as istiod writes them, so clients of two namespaces connected at
// once must not share one cached route configuration.
func TestProxylessShortNamesPerNamespace(t *testing.T) {
	srv := startServer(t, fakebus.New(changes(t, registry(10001, 10002))...))
	domains := func(ns string) []string {
		t.Helper()
		stream, err := adsClient(t, srv.Addr()).DeltaAggregatedResources(streamContext(t))
		if err != nil {
			t.Fatal(err)
		}
		md, _ := structpb.NewStruct(map[string]any{"GENERATOR": "grpc", "NAMESPACE": ns})
		node := &corev3.Node{Id: "sidecar~127.0.0.1~client." + ns + "~" + ns + ".svc.cluster.local", Metadata: md}
		if err := stream.Send(&discoverygrpc.DeltaDiscoveryRequest{
			Node: node, TypeUrl: resource.RouteType, ResourceNamesSubscribe: []string{echoCluster},
		}); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetResources()) != 1 {
			t.Fatalf("%s: got %d route configurations, want 1", ns, len(resp.GetResources()))
		}
		var rc routev3.RouteConfiguration
		if err := resp.GetResources()[0].GetResource().UnmarshalTo(&rc); err != nil {
			t.Fatal(err)
		}
		return rc.GetVirtualHosts()[0].GetDomains()
	}
	demo, other := domains("demo"), domains("other")
	for _, d := range []string{"echo", "echo:7070", "echo.demo", "echo.demo.svc.cluster.local."} {
		if !slices.Contains(demo, d) {
			t.Errorf("client in demo: domains %q lack %q", demo, d)
		}
	}
	if slices.Contains(other, "echo") || !slices.Contains(other, "echo.demo") {
		t.Errorf("client in other: domains %q, want echo.demo and not the bare echo", other)
	}
}
