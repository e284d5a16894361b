package xds

import (
	"slices"
	"testing"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
)

// PushAll (istiod's debug push) sends every connection all it holds again, unchanged, in
// push order; a NACKed version stays unsent.
func TestPushAllResends(t *testing.T) {
	t.Run("sotw", func(t *testing.T) {
		e := newEnv(t, Options{}, baseMesh()...)
		c := newSotW(t, e.addr, node("p", "demo", false))
		c.subscribe(cds)
		c.recvType(cds)
		c.subscribe(eds, cluster("a.demo"))
		c.recvType(eds)
		if n := e.srv.PushAll(); n != 1 {
			t.Fatalf("PushAll queued %d connections, want 1", n)
		}
		got := []*discoverygrpc.DiscoveryResponse{c.recv(), c.recv()}
		if got[0].GetTypeUrl() != cds || !slices.Equal(sotwNames(t, got[0]), []string{cluster("a.demo"), cluster("b.demo")}) {
			t.Errorf("first response %s %v, want every cluster", short(got[0].GetTypeUrl()), sotwNames(t, got[0]))
		}
		if got[1].GetTypeUrl() != eds || !slices.Equal(sotwNames(t, got[1]), []string{cluster("a.demo")}) {
			t.Errorf("second response %s %v, want a's endpoints", short(got[1].GetTypeUrl()), sotwNames(t, got[1]))
		}
		if rest := c.drain(); len(rest) != 0 {
			t.Errorf("more responses: %v", types_(rest))
		}
	})
	t.Run("delta", func(t *testing.T) {
		e := newEnv(t, Options{}, baseMesh()...)
		c := newDelta(t, e.addr, node("p", "demo", false))
		c.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: cds})
		c.recvType(cds)
		c.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: eds, ResourceNamesSubscribe: []string{cluster("b.demo")}})
		rejected := c.recvRaw()
		c.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: eds, ResponseNonce: rejected.GetNonce(),
			ErrorDetail: &statuspb.Status{Code: 3, Message: "rejected by test"}})
		c.drain()
		e.srv.PushAll()
		if got := names(c.recvType(cds).GetResources()); !slices.Equal(got, []string{cluster("a.demo"), cluster("b.demo")}) {
			t.Errorf("clusters resent %v, want both", got)
		}
		if rest := c.drain(); len(rest) != 0 {
			t.Errorf("more responses (the rejected endpoints?): %v", deltaTypes(rest))
		}
	})
}
