package xdsserver

import (
	"slices"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resource "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"sailplane.dev/services/xds-server/internal/fakebus"
	"sailplane.dev/shared/schema"
)

const headlessRegistry = `
apiVersion: sailplane.dev/v1
kind: Service
spec:
  hostname: db.demo.svc.cluster.local
  namespace: demo
  registry: kubernetes
  resolution: NONE
  ports: [{name: tcp-pg, number: 5432, protocol: TCP}]
---
apiVersion: sailplane.dev/v1
kind: Endpoints
spec:
  hostname: db.demo.svc.cluster.local
  namespace: demo
  endpoints:
  - {address: 10.0.0.1}
`

// A sidecar has a listener per endpoint of a headless TCP service, so a new endpoint reaches
// it as a listener, through the cache and the push queue, as istiod's full push does.
func TestHeadlessEndpointsPushListeners(t *testing.T) {
	src := fakebus.New(changes(t, headlessRegistry)...)
	srv := startServer(t, src)
	stream, err := adsClient(t, srv.Addr()).DeltaAggregatedResources(streamContext(t))
	if err != nil {
		t.Fatal(err)
	}
	md, _ := structpb.NewStruct(map[string]any{"NAMESPACE": "demo"})
	node := &corev3.Node{Id: "sidecar~10.0.9.9~client-1.demo~demo.svc.cluster.local", Metadata: md}
	if err := stream.Send(&discoverygrpc.DeltaDiscoveryRequest{Node: node, TypeUrl: resource.ListenerType}); err != nil {
		t.Fatal(err)
	}
	// recvListeners waits for a listener response naming want, ACKing every response.
	recvListeners := func(want string) {
		t.Helper()
		for {
			resp, err := stream.Recv()
			if err != nil {
				t.Fatalf("waiting for listener %s: %v", want, err)
			}
			if err := stream.Send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(),
				ResponseNonce: resp.GetNonce()}); err != nil {
				t.Fatal(err)
			}
			if slices.ContainsFunc(resp.GetResources(), func(r *discoverygrpc.Resource) bool { return r.GetName() == want }) {
				return
			}
		}
	}
	recvListeners("10.0.0.1_5432")
	for _, c := range changes(t, headlessRegistry+"  - {address: 10.0.0.2}\n") {
		if c.TypeURL == schema.Endpoints.TypeURL {
			src.Push(c)
		}
	}
	recvListeners("10.0.0.2_5432")
}
