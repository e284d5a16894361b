package xds

import (
	"encoding/json"
	"slices"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	"sailplane.dev/shared/bus"
)

const (
	cds = resourcev3.ClusterType
	eds = resourcev3.EndpointType
	lds = resourcev3.ListenerType
	rds = resourcev3.RouteType
)

func baseMesh() []bus.Change {
	return []bus.Change{
		services("demo", "a.demo", "b.demo"),
		endpoints("demo", "a.demo", "10.0.0.1"),
		endpoints("demo", "b.demo", "10.0.0.2"),
	}
}

func TestSotW(t *testing.T) {
	e := newEnv(t, Options{}, baseMesh()...)
	c := newSotW(t, e.addr, node("p", "demo", false))
	c.subscribe(cds)
	if got := sotwNames(t, c.recvType(cds)); !slices.Equal(got, []string{cluster("a.demo"), cluster("b.demo")}) {
		t.Fatalf("clusters = %v", got)
	}
	c.subscribe(eds, cluster("a.demo"))
	if got := sotwNames(t, c.recvType(eds)); !slices.Equal(got, []string{cluster("a.demo")}) {
		t.Fatalf("endpoints = %v", got)
	}
	c.subscribe(lds)
	if got := sotwNames(t, c.recvType(lds)); len(got) != 2 {
		t.Fatalf("listeners = %v", got)
	}
	c.subscribe(rds, cluster("b.demo"))
	if got := sotwNames(t, c.recvType(rds)); !slices.Equal(got, []string{cluster("b.demo")}) {
		t.Fatalf("routes = %v", got)
	}
	// ACKs draw no response.
	if got := c.drain(); len(got) != 0 {
		t.Fatalf("unexpected responses %v", types_(got))
	}
}

func TestDelta(t *testing.T) {
	e := newEnv(t, Options{}, baseMesh()...)
	c := newDelta(t, e.addr, node("p", "demo", false))
	c.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: cds})
	if got := names(c.recvType(cds).GetResources()); !slices.Equal(got, []string{cluster("a.demo"), cluster("b.demo")}) {
		t.Fatalf("clusters = %v", got)
	}
	c.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: eds, ResourceNamesSubscribe: []string{cluster("a.demo")}})
	if got := names(c.recvType(eds).GetResources()); !slices.Equal(got, []string{cluster("a.demo")}) {
		t.Fatalf("endpoints = %v", got)
	}
	e.update(endpoints("demo", "a.demo", "10.0.0.9"))
	resp := c.recvType(eds)
	if got := names(resp.GetResources()); !slices.Equal(got, []string{cluster("a.demo")}) {
		t.Fatalf("endpoint update = %v", got)
	}
	if got := c.drain(); len(got) != 0 {
		t.Fatalf("unexpected responses %v", deltaTypes(got))
	}
}

func nack(resp *discoverygrpc.DiscoveryResponse, names []string) *discoverygrpc.DiscoveryRequest {
	return &discoverygrpc.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce(), ResourceNames: names,
		ErrorDetail: &statuspb.Status{Code: 3, Message: "rejected by test"}}
}

// A NACK (error_detail set) keeps the rejected version from being sent again until the config
// changes; an ACK does not.
func TestNACKNotResent(t *testing.T) {
	t.Run("sotw", func(t *testing.T) {
		e := newEnv(t, Options{}, baseMesh()...)
		c := newSotW(t, e.addr, node("p", "demo", false))
		c.subscribe(cds)
		c.recvType(cds) // ACKed
		e.update(destinationRule("demo", "a", "a.demo"))
		rejected := c.recvRaw()
		c.send(nack(rejected, nil))
		c.drain()
		// A change that leaves clusters as they are pushes nothing of them.
		e.update(services("demo", "c.demo"), removeService("demo", "c.demo"))
		e.update(bus.Change{TypeURL: "core/v1alpha1/MeshConfig", Updated: []*bus.Resource{{Name: "mesh", Body: meshConfig()}}})
		if got := c.drain(); len(got) != 0 {
			t.Fatalf("rejected version resent: %v", types_(got))
		}
		// New config: new version.
		e.update(destinationRule("demo", "b", "b.demo"))
		resp := c.recvType(cds)
		if resp.GetVersionInfo() == rejected.GetVersionInfo() {
			t.Fatal("same version after a config change")
		}
	})
	t.Run("delta", func(t *testing.T) {
		e := newEnv(t, Options{}, baseMesh()...)
		c := newDelta(t, e.addr, node("p", "demo", false))
		c.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: cds})
		c.recvType(cds)
		e.update(destinationRule("demo", "a", "a.demo"))
		rejected := c.recvRaw()
		c.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: cds, ResponseNonce: rejected.GetNonce(),
			ErrorDetail: &statuspb.Status{Code: 3, Message: "rejected by test"}})
		c.drain()
		e.update(bus.Change{TypeURL: "core/v1alpha1/MeshConfig", Updated: []*bus.Resource{{Name: "mesh", Body: meshConfig()}}})
		if got := c.drain(); len(got) != 0 {
			t.Fatalf("rejected version resent: %v", deltaTypes(got))
		}
		e.update(destinationRule("demo", "b", "b.demo"))
		resp := c.recvType(cds)
		// Only b changed; a's rejected version stays unsent.
		if got := names(resp.GetResources()); !slices.Equal(got, []string{cluster("b.demo")}) {
			t.Fatalf("after change = %v", got)
		}
	})
}

// One push adding c and removing a: clusters, endpoints, listeners, routes are added first, and
// only then removed, listeners before clusters.
func TestMakeBeforeBreak(t *testing.T) {
	t.Run("sotw", func(t *testing.T) {
		e := newEnv(t, Options{}, baseMesh()...)
		c := newSotW(t, e.addr, node("p", "demo", false))
		c.subscribe(cds)
		c.recvType(cds)
		c.subscribe(eds, cluster("a.demo"), cluster("b.demo"))
		c.recvType(eds)
		c.subscribe(lds)
		c.recvType(lds)
		c.subscribe(rds, cluster("a.demo"), cluster("b.demo"))
		c.recvType(rds)
		e.updatePushed(services("demo", "c.demo"), removeService("demo", "a.demo"))
		got := c.drain()
		want := []string{"Cluster", "Listener", "Listener", "Cluster"}
		if !slices.Equal(types_(got), want) {
			t.Fatalf("order = %v, want %v", types_(got), want)
		}
		if n := sotwNames(t, got[0]); !slices.Equal(n, []string{cluster("a.demo"), cluster("b.demo"), cluster("c.demo")}) {
			t.Fatalf("first CDS = %v, want old and new", n)
		}
		if n := sotwNames(t, got[3]); !slices.Equal(n, []string{cluster("b.demo"), cluster("c.demo")}) {
			t.Fatalf("last CDS = %v", n)
		}
	})
	t.Run("delta", func(t *testing.T) {
		e := newEnv(t, Options{}, baseMesh()...)
		c := newDelta(t, e.addr, node("p", "demo", false))
		for _, typ := range []string{cds, lds} {
			c.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: typ})
			c.recvType(typ)
		}
		for _, typ := range []string{eds, rds} {
			c.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: typ, ResourceNamesSubscribe: []string{cluster("a.demo"), cluster("b.demo"), cluster("c.demo")}})
			c.recvType(typ)
		}
		e.update(endpoints("demo", "c.demo", "10.0.0.3"))
		c.drain()
		e.updatePushed(services("demo", "c.demo"), removeService("demo", "a.demo"))
		got := c.drain()
		var order []string
		for _, r := range got {
			kind := "+"
			if len(r.GetRemovedResources()) > 0 {
				kind = "-"
			}
			order = append(order, kind+short(r.GetTypeUrl()))
		}
		want := []string{"+Cluster", "+ClusterLoadAssignment", "+Listener", "+RouteConfiguration",
			"-RouteConfiguration", "-Listener", "-ClusterLoadAssignment", "-Cluster"}
		if !slices.Equal(order, want) {
			t.Fatalf("order = %v, want %v", order, want)
		}
	})
}

// A changed cluster is followed by its endpoints, even when they did not change: Envoy warms a
// cluster until they arrive.
func TestClusterChangeFollowedByEndpoints(t *testing.T) {
	e := newEnv(t, Options{}, baseMesh()...)
	c := newSotW(t, e.addr, node("p", "demo", false))
	c.subscribe(cds)
	c.recvType(cds)
	c.subscribe(eds, cluster("a.demo"), cluster("b.demo"))
	c.recvType(eds)
	e.updatePushed(destinationRule("demo", "a", "a.demo"))
	got := c.drain()
	if !slices.Equal(types_(got), []string{"Cluster", "ClusterLoadAssignment"}) {
		t.Fatalf("responses = %v", types_(got))
	}
	var cl clusterv3.Cluster
	for _, a := range got[0].GetResources() {
		if err := a.UnmarshalTo(&cl); err != nil {
			t.Fatal(err)
		}
	}
	if n := sotwNames(t, got[1]); !slices.Equal(n, []string{cluster("a.demo")}) {
		t.Fatalf("endpoints after cluster change = %v, want a only", n)
	}
}

func TestSubscriptions(t *testing.T) {
	t.Run("delta named, unsubscribe", func(t *testing.T) {
		e := newEnv(t, Options{}, baseMesh()...)
		c := newDelta(t, e.addr, node("p", "demo", false))
		c.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: eds, ResourceNamesSubscribe: []string{cluster("a.demo")}})
		c.recvType(eds)
		c.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: eds, ResourceNamesSubscribe: []string{cluster("b.demo"), cluster("nope")}})
		resp := c.recvType(eds)
		if got := names(resp.GetResources()); !slices.Equal(got, []string{cluster("b.demo")}) {
			t.Fatalf("subscribe b = %v", got)
		}
		if !slices.Equal(resp.GetRemovedResources(), []string{cluster("nope")}) {
			t.Fatalf("unknown name should be reported removed, got %v", resp.GetRemovedResources())
		}
		c.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: eds, ResourceNamesUnsubscribe: []string{cluster("a.demo")}})
		c.drain() // the server has read the unsubscription
		e.update(endpoints("demo", "a.demo", "10.1.1.1"))
		if got := c.drain(); len(got) != 0 {
			t.Fatalf("pushed an unsubscribed resource: %v", got)
		}
		e.update(endpoints("demo", "b.demo", "10.1.1.2"))
		if got := names(c.recvType(eds).GetResources()); !slices.Equal(got, []string{cluster("b.demo")}) {
			t.Fatalf("b update = %v", got)
		}
	})
	t.Run("sotw wildcard and named", func(t *testing.T) {
		e := newEnv(t, Options{}, baseMesh()...)
		c := newSotW(t, e.addr, node("p", "demo", true))
		c.subscribe(lds)
		if got := sotwNames(t, c.recvType(lds)); len(got) != 2 {
			t.Fatalf("wildcard listeners = %v", got)
		}
		c.subscribe(rds, cluster("a.demo"))
		c.recvType(rds)
		c.subscribe(rds) // unsubscribes from everything: routes are not a wildcard type here
		c.drain()
		e.update(virtualService("demo", "vs", nil, "a.demo"))
		if got := c.drain(); len(got) != 0 {
			t.Fatalf("pushed routes after unsubscribing all: %v", types_(got))
		}
	})
}

// A reconnecting delta client names what it holds and gets only what changed, removals
// included.
func TestDeltaReconnect(t *testing.T) {
	e := newEnv(t, Options{}, baseMesh()...)
	c := newDelta(t, e.addr, node("p", "demo", false))
	c.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: cds})
	c.recvType(cds)
	held := c.have[cds]
	e.update(destinationRule("demo", "b", "b.demo"), services("demo", "c.demo"), removeService("demo", "a.demo"))

	c2 := newDelta(t, e.addr, node("p", "demo", false))
	c2.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: cds, InitialResourceVersions: held})
	got := c2.drain()
	var up, rm []string
	for _, r := range got {
		up = append(up, names(r.GetResources())...)
		rm = append(rm, r.GetRemovedResources()...)
	}
	slices.Sort(up)
	if !slices.Equal(up, []string{cluster("b.demo"), cluster("c.demo")}) || !slices.Equal(rm, []string{cluster("a.demo")}) {
		t.Fatalf("after reconnect: updated %v removed %v", up, rm)
	}
}

func TestRemovedWhenNoLongerNeeded(t *testing.T) {
	e := newEnv(t, Options{}, baseMesh()...)
	c := newDelta(t, e.addr, node("p", "demo", false))
	s := newSotW(t, e.addr, node("q", "demo", false))
	c.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: lds})
	c.recvType(lds)
	s.subscribe(lds)
	s.recvType(lds)
	e.update(removeService("demo", "b.demo"))
	if resp := c.recvType(lds); !slices.Equal(resp.GetRemovedResources(), []string{"b.demo:80"}) {
		t.Fatalf("delta removed = %v", resp.GetRemovedResources())
	}
	if got := sotwNames(t, s.recvType(lds)); !slices.Equal(got, []string{"a.demo:80"}) {
		t.Fatalf("sotw listeners = %v", got)
	}
}

func meshConfig() *meshv1alpha1.MeshConfig {
	return &meshv1alpha1.MeshConfig{RootNamespace: "istio-system", TrustDomain: "changed.local"}
}

// Every response names the replica that sent it, with istiod's control plane identifier: to a
// request and in a push, state of the world and delta.
func TestControlPlaneIdentifier(t *testing.T) {
	check := func(t *testing.T, cp *corev3.ControlPlane) {
		t.Helper()
		var id struct {
			Component, ID string
			Info          struct{ Version string }
		}
		if err := json.Unmarshal([]byte(cp.GetIdentifier()), &id); err != nil || id.Component != ComponentName ||
			id.ID != "xds-server-0" || id.Info.Version != "1.2.3" {
			t.Errorf("control plane identifier %q (%v), want xds-server, xds-server-0, 1.2.3", cp.GetIdentifier(), err)
		}
	}
	opts := Options{Replica: "xds-server-0", Version: "1.2.3"}
	t.Run("sotw", func(t *testing.T) {
		e := newEnv(t, opts, baseMesh()...)
		c := newSotW(t, e.addr, node("p", "demo", false))
		c.subscribe(cds)
		check(t, c.recvType(cds).GetControlPlane())
		e.update(destinationRule("demo", "a", "a.demo"))
		check(t, c.recvType(cds).GetControlPlane())
	})
	t.Run("delta", func(t *testing.T) {
		e := newEnv(t, opts, baseMesh()...)
		c := newDelta(t, e.addr, node("p", "demo", false))
		c.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: cds})
		check(t, c.recvType(cds).GetControlPlane())
		e.update(destinationRule("demo", "a", "a.demo"))
		check(t, c.recvType(cds).GetControlPlane())
	})
}
