package xdsserver

import (
	"slices"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/types/known/structpb"

	ndsv1 "sailplane.dev/proto/istio/networking/nds/v1"
	"sailplane.dev/services/xds-server/internal/fakebus"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/xdstype"
)

// headlessHTTP is a headless service with HTTP ports only: sidecars have no listener per
// endpoint of it, so its endpoints reach nothing but EDS and the name table.
const headlessHTTP = `
apiVersion: sailplane.dev/v1
kind: Service
spec:
  hostname: web.demo.svc.cluster.local
  namespace: demo
  registry: kubernetes
  resolution: NONE
  ports: [{name: http, number: 8080, protocol: HTTP}]
---
apiVersion: sailplane.dev/v1
kind: Endpoints
spec:
  hostname: web.demo.svc.cluster.local
  namespace: demo
  endpoints:
  - {address: 10.0.0.1}
`

const ndsRegistry = headlessHTTP + `---
apiVersion: sailplane.dev/v1
kind: Service
spec:
  hostname: api.partner.example
  namespace: demo
  registry: serviceentry
  resolution: STATIC
  addresses: [192.0.2.1]
  ports: [{name: tls, number: 443, protocol: TLS}]
`

// An agent asking for the name table over state-of-the-world ADS, as pilot-agent does with
// ISTIO_META_DNS_CAPTURE, gets it, and gets it again when a ServiceEntry host appears and when
// a headless service's endpoints change (its name answers with them).
func TestNameTablePushes(t *testing.T) {
	src := fakebus.New(changes(t, ndsRegistry)...)
	// Without CacheAssert, which regenerates everything: the cache must see that the table
	// reads endpoints.
	srv, err := New(Config{Debounce: 10 * time.Millisecond}, Deps{Logger: testLogger(t), Config: src, Registry: src})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, srv)
	select {
	case <-srv.Ready():
	case <-time.After(waitFor):
		t.Fatal("server not ready")
	}
	stream, err := adsClient(t, srv.Addr()).StreamAggregatedResources(streamContext(t))
	if err != nil {
		t.Fatal(err)
	}
	md, _ := structpb.NewStruct(map[string]any{"NAMESPACE": "demo", "DNS_CAPTURE": "true"})
	node := &corev3.Node{Id: "sidecar~10.0.9.9~client-1.demo~demo.svc.cluster.local", Metadata: md}
	if err := stream.Send(&discoverygrpc.DiscoveryRequest{Node: node, TypeUrl: xdstype.NameTable}); err != nil {
		t.Fatal(err)
	}
	// recv waits for a table in which host has want (the last one received, or a next one),
	// ACKing every response.
	var last *ndsv1.NameTable
	recv := func(host string, want ...string) {
		t.Helper()
		for last == nil || !slices.Equal(last.GetTable()[host].GetIps(), want) {
			if last != nil {
				t.Logf("table without %s = %v yet: %v", host, want, last.GetTable()[host].GetIps())
			}
			resp, err := stream.Recv()
			if err != nil {
				t.Fatalf("waiting for %s = %v: %v", host, want, err)
			}
			if err := stream.Send(&discoverygrpc.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), VersionInfo: resp.GetVersionInfo(),
				ResponseNonce: resp.GetNonce()}); err != nil {
				t.Fatal(err)
			}
			if resp.GetTypeUrl() != xdstype.NameTable || len(resp.GetResources()) != 1 {
				t.Fatalf("got %s with %d resources, want one name table", resp.GetTypeUrl(), len(resp.GetResources()))
			}
			last = &ndsv1.NameTable{}
			if err := resp.GetResources()[0].UnmarshalTo(last); err != nil {
				t.Fatal(err)
			}
		}
	}
	recv("api.partner.example", "192.0.2.1")
	recv("web.demo.svc.cluster.local", "10.0.0.1")

	for _, c := range changes(t, `
apiVersion: sailplane.dev/v1
kind: Service
spec:
  hostname: new.partner.example
  namespace: demo
  registry: serviceentry
  resolution: STATIC
  addresses: [192.0.2.2]
  ports: [{name: tls, number: 443, protocol: TLS}]
`) {
		src.Push(c)
	}
	recv("new.partner.example", "192.0.2.2")
	for _, c := range changes(t, headlessHTTP+"  - {address: 10.0.0.2}\n") {
		if c.TypeURL == schema.Endpoints.TypeURL {
			src.Push(c)
		}
	}
	recv("web.demo.svc.cluster.local", "10.0.0.1", "10.0.0.2")
}
