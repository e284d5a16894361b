package xdsserver

import (
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"sailplane.dev/services/xds-server/internal/fakebus"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
)

const (
	ratingsCluster = "outbound|9080||ratings.demo.svc.cluster.local"
	ratingsService = `
apiVersion: sailplane.dev/v1
kind: Service
spec:
  hostname: ratings.demo.svc.cluster.local
  namespace: demo
  ports: [{name: http, number: 9080, protocol: HTTP}]
`
)

func ratingsEndpoints(tlsMode string) string {
	return `
apiVersion: sailplane.dev/v1
kind: Endpoints
spec:
  hostname: ratings.demo.svc.cluster.local
  namespace: demo
  endpoints:
  - {address: 10.0.0.1, serviceAccount: ratings, labels: {app: ratings, security.istio.io/tlsMode: "` + tlsMode + `"}}
`
}

func peerAuthentication(mode string) string {
	return `
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: demo}
spec: {mtls: {mode: ` + mode + `}}
`
}

// TestEnvoyMTLSPushes: an Envoy sidecar (the ratings workload, client of its own service)
// follows mTLS changes: its endpoint losing the sidecar label unmarks it in EDS, a
// PeerAuthentication changes its inbound chains, and DISABLE ends auto-mTLS in its clusters
// and the endpoint marks.
func TestEnvoyMTLSPushes(t *testing.T) {
	src := fakebus.New(changes(t, ratingsService+"---"+ratingsEndpoints("istio"))...)
	srv := startServer(t, src)
	stream, err := adsClient(t, srv.Addr()).DeltaAggregatedResources(streamContext(t))
	if err != nil {
		t.Fatal(err)
	}
	md, _ := structpb.NewStruct(map[string]any{"NAMESPACE": "demo", "LABELS": map[string]any{"app": "ratings"}})
	node := &corev3.Node{Id: "sidecar~10.0.0.1~ratings-1.demo~demo.svc.cluster.local", Metadata: md}
	latest := map[string]map[string]*anypb.Any{}
	// await reads (and ACKs) responses until the latest resources of typeURL satisfy ok.
	await := func(what, typeURL string, ok func(map[string]*anypb.Any) bool) {
		t.Helper()
		for !ok(latest[typeURL]) {
			resp, err := stream.Recv()
			if err != nil {
				t.Fatalf("waiting for %s: %v", what, err)
			}
			if latest[resp.GetTypeUrl()] == nil {
				latest[resp.GetTypeUrl()] = map[string]*anypb.Any{}
			}
			for _, r := range resp.GetResources() {
				latest[resp.GetTypeUrl()][r.GetName()] = r.GetResource()
			}
			for _, n := range resp.GetRemovedResources() {
				delete(latest[resp.GetTypeUrl()], n)
			}
			if err := stream.Send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i, sub := range []struct {
		typeURL string
		names   []string
	}{{resource.ClusterType, nil}, {resource.EndpointType, []string{ratingsCluster}}, {resource.ListenerType, nil}} {
		req := &discoverygrpc.DeltaDiscoveryRequest{TypeUrl: sub.typeURL, ResourceNamesSubscribe: sub.names}
		if i == 0 {
			req.Node = node
		}
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	autoMTLS := func(want bool) func(map[string]*anypb.Any) bool {
		return func(rs map[string]*anypb.Any) bool {
			var c clusterv3.Cluster
			return rs[ratingsCluster] != nil && rs[ratingsCluster].UnmarshalTo(&c) == nil &&
				(len(c.GetTransportSocketMatches()) == 2) == want
		}
	}
	marked := func(want bool) func(map[string]*anypb.Any) bool {
		return func(rs map[string]*anypb.Any) bool {
			var cla endpointv3.ClusterLoadAssignment
			if rs[ratingsCluster] == nil || rs[ratingsCluster].UnmarshalTo(&cla) != nil || len(cla.GetEndpoints()) != 1 {
				return false
			}
			md := cla.GetEndpoints()[0].GetLbEndpoints()[0].GetMetadata()
			return (md.GetFilterMetadata()["envoy.transport_socket_match"].GetFields()["tlsMode"].GetStringValue() == "istio") == want
		}
	}
	// inbound: whether port 9080 has a plaintext and an mTLS chain.
	inbound := func(plain, mtls bool) func(map[string]*anypb.Any) bool {
		return func(rs map[string]*anypb.Any) bool {
			var l listenerv3.Listener
			if rs["virtualInbound"] == nil || rs["virtualInbound"].UnmarshalTo(&l) != nil {
				return false
			}
			var gotPlain, gotMTLS bool
			for _, fc := range l.GetFilterChains() {
				if fc.GetFilterChainMatch().GetDestinationPort().GetValue() != 9080 {
					continue
				}
				if fc.GetTransportSocket() != nil {
					gotMTLS = true
				} else {
					gotPlain = true
				}
			}
			return gotPlain == plain && gotMTLS == mtls
		}
	}
	await("auto-mTLS cluster", resource.ClusterType, autoMTLS(true))
	await("marked endpoint", resource.EndpointType, marked(true))
	await("PERMISSIVE inbound", resource.ListenerType, inbound(true, true))

	src.Push(changes(t, ratingsEndpoints("disabled"))[0])
	await("unmarked endpoint", resource.EndpointType, marked(false))
	src.Push(changes(t, ratingsEndpoints("istio"))[0])
	await("marked endpoint again", resource.EndpointType, marked(true))

	src.Push(changes(t, peerAuthentication("STRICT"))[0])
	await("STRICT inbound", resource.ListenerType, inbound(false, true))

	// The workload's own policy DISABLEs its port: its clusters stay, EDS unmarks it.
	src.Push(changes(t, `
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: ratings, namespace: demo}
spec:
  selector: {matchLabels: {app: ratings}}
  portLevelMtls: {9080: {mode: DISABLE}}
`)[0])
	await("endpoint unmarked by its port-level DISABLE", resource.EndpointType, marked(false))
	await("auto-mTLS cluster kept", resource.ClusterType, autoMTLS(true))
	src.Push(bus.Change{TypeURL: schema.PeerAuthentication.TypeURL, Removed: []string{"demo/ratings"}})
	await("endpoint marked once the workload policy is gone", resource.EndpointType, marked(true))

	src.Push(changes(t, peerAuthentication("DISABLE"))[0])
	await("DISABLE inbound", resource.ListenerType, inbound(true, false))
	await("no auto-mTLS", resource.ClusterType, autoMTLS(false))
	await("endpoint unmarked by DISABLE", resource.EndpointType, marked(false))
}
