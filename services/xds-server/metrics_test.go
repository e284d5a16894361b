package xdsserver

import (
	"testing"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resource "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"sailplane.dev/services/xds-server/internal/fakebus"
	"sailplane.dev/shared/telemetry/telemetrytest"
)

// A config change moves pilot_proxy_convergence_time and pilot_debounce_time, as Prometheus
// scrapes them, and pilot_xds counts the proxy connected.
func TestConvergenceMetric(t *testing.T) {
	metrics := telemetrytest.New(t)
	src := fakebus.New(changes(t, registry(10001, 10002))...)
	srv, err := New(Config{CacheAssert: true}, Deps{Logger: testLogger(t), Config: src, Registry: src, MeterProvider: metrics.Provider()})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, srv)
	waitUntil(t, func() bool {
		select {
		case <-srv.Ready():
			return true
		default:
			return false
		}
	})
	stream, err := adsClient(t, srv.Addr()).DeltaAggregatedResources(streamContext(t))
	if err != nil {
		t.Fatal(err)
	}
	recvCDS := func() {
		t.Helper()
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetTypeUrl() != resource.ClusterType {
			t.Fatalf("got %s, want clusters", resp.GetTypeUrl())
		}
		if err := stream.Send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: resp.GetNonce()}); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Send(&discoverygrpc.DeltaDiscoveryRequest{Node: testNode("metrics"), TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	recvCDS()
	metrics.WaitValue(1, "pilot_xds", "type", "proxyless")
	before := metrics.Scrape()
	converged, _ := before.Value("pilot_proxy_convergence_time")
	debounced, _ := before.Value("pilot_debounce_time")

	for _, c := range changes(t, `
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: echo, namespace: demo}
spec:
  host: echo
  subsets:
  - {name: v1, labels: {version: v1}}
`) {
		src.Push(c)
	}
	recvCDS()
	metrics.WaitValue(converged+1, "pilot_proxy_convergence_time")
	metrics.WaitValue(debounced+1, "pilot_debounce_time")
	if got := metrics.Value("pilot_xds_pushes", "type", "cds"); got != 2 {
		t.Errorf("pilot_xds_pushes{type=cds} = %v, want 2 (the answer to the request, the push)", got)
	}
}
