package bus_test

import (
	"context"
	"maps"
	"slices"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	mcp "istio.io/api/mcp/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/bus/bustest"
	"sailplane.dev/shared/schema"
)

const (
	legacyVS = "networking.istio.io/v1alpha3/VirtualService"
	unknown  = "example.com/v1/Nothing"
)

// adsClient opens a raw ADS client to a fresh server on s.
func adsClient(t *testing.T, s *bus.Store) (discoveryv3.AggregatedDiscoveryServiceClient, context.Context) {
	t.Helper()
	p := startPeer(t, s)
	conn, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), bustest.Timeout)
	t.Cleanup(cancel)
	return discoveryv3.NewAggregatedDiscoveryServiceClient(conn), ctx
}

func decodeAny(t *testing.T, a *anypb.Any) (name, version string, body *networking.VirtualService) {
	t.Helper()
	m := &mcp.Resource{}
	if err := a.UnmarshalTo(m); err != nil {
		t.Fatalf("not an MCP resource: %v", err)
	}
	body = &networking.VirtualService{}
	if err := m.GetBody().UnmarshalTo(body); err != nil {
		t.Fatalf("body: %v", err)
	}
	return m.GetMetadata().GetName(), m.GetMetadata().GetVersion(), body
}

func deltaNames(t *testing.T, resp *discoveryv3.DeltaDiscoveryResponse) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, r := range resp.GetResources() {
		name, version, _ := decodeAny(t, r.GetResource())
		if name != r.GetName() || version != r.GetVersion() {
			t.Errorf("delta wrapper %s@%s around MCP %s@%s", r.GetName(), r.GetVersion(), name, version)
		}
		out[name] = version
	}
	return out
}

func hasRejection(s *bus.Store, consumer, name, version, msg string) bool {
	for _, r := range s.Rejections() {
		if r.Consumer == consumer && r.Name == name && r.Version == version && r.Err == msg &&
			r.TypeURL == schema.VirtualService.TypeURL {
			return true
		}
	}
	return false
}

func TestRawDelta(t *testing.T) {
	s := bus.NewStore(bus.WithLogger(testLogger(t)))
	s.Upsert(schema.VirtualService.TypeURL,
		bustest.VirtualService("ns/a", "v1", "a"), bustest.VirtualService("ns/b", "v1", "b"))
	ads, ctx := adsClient(t, s)

	stream, err := ads.DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send := func(req *discoveryv3.DeltaDiscoveryRequest) {
		t.Helper()
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	recv := func() *discoveryv3.DeltaDiscoveryResponse {
		t.Helper()
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}

	// Legacy wildcard (no names) with the legacy type URL spelling.
	send(&discoveryv3.DeltaDiscoveryRequest{Node: &corev3.Node{Id: "raw"}, TypeUrl: legacyVS})
	r1 := recv()
	if r1.GetTypeUrl() != legacyVS {
		t.Errorf("answered in %q, want the spelling asked for %q", r1.GetTypeUrl(), legacyVS)
	}
	if got, want := deltaNames(t, r1), map[string]string{"ns/a": "v1", "ns/b": "v1"}; !maps.Equal(got, want) {
		t.Errorf("first response = %v, want %v", got, want)
	}

	// An unknown type gets an empty first response.
	send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: unknown, ResourceNamesSubscribe: []string{"*"}})
	r2 := recv()
	if r2.GetTypeUrl() != unknown || len(r2.GetResources()) != 0 || r2.GetNonce() == "" {
		t.Errorf("unknown type: got %v, want an empty response with a nonce", r2)
	}
	send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: unknown, ResponseNonce: r2.GetNonce()})
	send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: legacyVS, ResponseNonce: r1.GetNonce()})

	// NACK a@v2: recorded, never resent on this stream.
	s.Upsert(schema.VirtualService.TypeURL, bustest.VirtualService("ns/a", "v2", "a"))
	r3 := recv()
	if got := deltaNames(t, r3); !maps.Equal(got, map[string]string{"ns/a": "v2"}) {
		t.Fatalf("update = %v", got)
	}
	send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: legacyVS, ResponseNonce: r3.GetNonce(),
		ErrorDetail: &status.Status{Code: 3, Message: "nope"}})
	bustest.WaitFor(t, "rejection", func() bool { return hasRejection(s, "raw", "ns/a", "v2", "nope") })
	s.Upsert(schema.VirtualService.TypeURL, bustest.VirtualService("ns/b", "v2", "b"))
	r4 := recv()
	if got := deltaNames(t, r4); !maps.Equal(got, map[string]string{"ns/b": "v2"}) {
		t.Errorf("after NACK = %v, want only ns/b@v2 (no resend of ns/a@v2)", got)
	}
	send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: legacyVS, ResponseNonce: r4.GetNonce()})

	s.Delete(schema.VirtualService.TypeURL, "ns/b")
	r5 := recv()
	if !slices.Equal(r5.GetRemovedResources(), []string{"ns/b"}) || len(r5.GetResources()) != 0 {
		t.Errorf("delete: got %v", r5)
	}
	stream.CloseSend()

	// Resume: only what differs, and removals of what the client holds but the store does not.
	s.Upsert(schema.VirtualService.TypeURL, bustest.VirtualService("ns/d", "v1", "d"))
	resume, err := ads.DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := resume.Send(&discoveryv3.DeltaDiscoveryRequest{
		TypeUrl:                 schema.VirtualService.TypeURL,
		ResourceNamesSubscribe:  []string{"*"},
		InitialResourceVersions: map[string]string{"ns/a": "v1", "ns/b": "v1", "ns/c": "x", "ns/d": "v1"},
	}); err != nil {
		t.Fatal(err)
	}
	rr, err := resume.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if got := deltaNames(t, rr); !maps.Equal(got, map[string]string{"ns/a": "v2"}) {
		t.Errorf("resume updates = %v, want ns/a@v2 only", got)
	}
	if got := rr.GetRemovedResources(); !slices.Equal(got, []string{"ns/b", "ns/c"}) {
		t.Errorf("resume removals = %v, want [ns/b ns/c]", got)
	}
	resume.CloseSend()

	// Named subscriptions.
	named, err := ads.DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nsend := func(req *discoveryv3.DeltaDiscoveryRequest) {
		t.Helper()
		if err := named.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	nrecv := func() map[string]string {
		t.Helper()
		resp, err := named.Recv()
		if err != nil {
			t.Fatal(err)
		}
		nsend(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()})
		return deltaNames(t, resp)
	}
	vs := schema.VirtualService.TypeURL
	nsend(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: vs, ResourceNamesSubscribe: []string{"ns/a"}})
	if got := nrecv(); !maps.Equal(got, map[string]string{"ns/a": "v2"}) {
		t.Errorf("named = %v, want ns/a only", got)
	}
	nsend(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: vs, ResourceNamesSubscribe: []string{"ns/d"},
		ResourceNamesUnsubscribe: []string{"ns/a"}})
	if got := nrecv(); !maps.Equal(got, map[string]string{"ns/d": "v1"}) {
		t.Errorf("after subscribing ns/d = %v", got)
	}
	s.Upsert(vs, bustest.VirtualService("ns/a", "v3", "a"))
	s.Upsert(vs, bustest.VirtualService("ns/d", "v2", "d"))
	if got := nrecv(); !maps.Equal(got, map[string]string{"ns/d": "v2"}) {
		t.Errorf("after unsubscribing ns/a = %v, want ns/d@v2 only", got)
	}
	named.CloseSend()
}

func TestRawSotW(t *testing.T) {
	s := bus.NewStore(bus.WithLogger(testLogger(t)))
	vs := schema.VirtualService.TypeURL
	s.Upsert(vs, bustest.VirtualService("ns/a", "v1", "a"), bustest.VirtualService("ns/b", "v1", "b"))
	ads, ctx := adsClient(t, s)
	stream, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send := func(req *discoveryv3.DiscoveryRequest) {
		t.Helper()
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	recv := func() (*discoveryv3.DiscoveryResponse, map[string]string) {
		t.Helper()
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, a := range resp.GetResources() {
			name, version, _ := decodeAny(t, a)
			out[name] = version
		}
		return resp, out
	}

	send(&discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: "sotw"}, TypeUrl: legacyVS})
	r1, got := recv()
	if r1.GetTypeUrl() != legacyVS || !maps.Equal(got, map[string]string{"ns/a": "v1", "ns/b": "v1"}) {
		t.Fatalf("first response %s %v", r1.GetTypeUrl(), got)
	}
	send(&discoveryv3.DiscoveryRequest{TypeUrl: legacyVS, VersionInfo: r1.GetVersionInfo(), ResponseNonce: r1.GetNonce()})

	send(&discoveryv3.DiscoveryRequest{TypeUrl: unknown})
	r2, got := recv()
	if r2.GetTypeUrl() != unknown || len(got) != 0 || r2.GetNonce() == "" {
		t.Errorf("unknown type: %v", r2)
	}
	send(&discoveryv3.DiscoveryRequest{TypeUrl: unknown, VersionInfo: r2.GetVersionInfo(), ResponseNonce: r2.GetNonce()})

	s.Upsert(vs, bustest.VirtualService("ns/a", "v2", "a"))
	r3, got := recv()
	if !maps.Equal(got, map[string]string{"ns/a": "v2", "ns/b": "v1"}) || r3.GetVersionInfo() == r1.GetVersionInfo() {
		t.Fatalf("full state after update %s %v", r3.GetVersionInfo(), got)
	}
	// A stale nonce is ignored; the NACK of the current one is recorded for what changed only.
	send(&discoveryv3.DiscoveryRequest{TypeUrl: legacyVS, VersionInfo: r1.GetVersionInfo(), ResponseNonce: r1.GetNonce(),
		ErrorDetail: &status.Status{Code: 3, Message: "stale"}})
	send(&discoveryv3.DiscoveryRequest{TypeUrl: legacyVS, VersionInfo: r1.GetVersionInfo(), ResponseNonce: r3.GetNonce(),
		ErrorDetail: &status.Status{Code: 3, Message: "nope"}})
	bustest.WaitFor(t, "rejection", func() bool { return hasRejection(s, "sotw", "ns/a", "v2", "nope") })
	for _, r := range s.Rejections() {
		if r.Name == "ns/b" || r.Err == "stale" {
			t.Errorf("unexpected rejection %+v", r)
		}
	}
	// Not resent: the next response is the next change.
	s.Upsert(vs, bustest.VirtualService("ns/b", "v2", "b"))
	r4, got := recv()
	if !maps.Equal(got, map[string]string{"ns/a": "v2", "ns/b": "v2"}) {
		t.Errorf("after NACK: %v", got)
	}
	send(&discoveryv3.DiscoveryRequest{TypeUrl: legacyVS, VersionInfo: r4.GetVersionInfo(), ResponseNonce: r4.GetNonce()})

	// Named resources.
	send(&discoveryv3.DiscoveryRequest{TypeUrl: legacyVS, VersionInfo: r4.GetVersionInfo(), ResponseNonce: r4.GetNonce(),
		ResourceNames: []string{"ns/b"}})
	_, got = recv()
	if !maps.Equal(got, map[string]string{"ns/b": "v2"}) {
		t.Errorf("named: %v", got)
	}
	stream.CloseSend()
}

func TestStoreVersions(t *testing.T) {
	s := bus.NewStore()
	vs := schema.VirtualService.TypeURL
	r := bustest.VirtualService("ns/a", "", "a")
	s.Upsert(vs, r)
	if r.Version != "" {
		t.Errorf("caller's resource modified: version %q", r.Version)
	}
	got, ok := s.Get(vs, "ns/a")
	if !ok || got.Version == "" || got.Version != bus.ContentVersion(r) {
		t.Fatalf("stored %+v, want content version %s", got, bus.ContentVersion(r))
	}
	// Same content, new struct: no change.
	s.Upsert(legacyVS, bustest.VirtualService("ns/a", "", "a"))
	if again, _ := s.Get(vs, "ns/a"); again != got {
		t.Errorf("identical upsert replaced the stored resource")
	}
	changed := bustest.VirtualService("ns/a", "", "a")
	changed.Labels["extra"] = "1"
	if bus.ContentVersion(changed) == got.Version {
		t.Errorf("labels do not change the version")
	}
	body := proto.Clone(changed.Body).(*networking.VirtualService)
	body.Hosts = append(body.Hosts, "x")
	if bus.ContentVersion(&bus.Resource{Name: "ns/a", Body: body, Labels: changed.Labels}) == bus.ContentVersion(changed) {
		t.Errorf("body does not change the version")
	}
	if list := s.List(legacyVS); len(list) != 1 {
		t.Errorf("List by legacy URL = %d resources", len(list))
	}
}
