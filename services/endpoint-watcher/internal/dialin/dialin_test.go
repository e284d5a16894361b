package dialin_test

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/endpoint-watcher/internal/dialin"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/bus/bustest"
	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/spiffe"
	"sailplane.dev/shared/testlog"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			slog.Error("leaked goroutines", "err", err)
			code = 1
		}
	}
	os.Exit(code)
}

const host = "ns/web.ns.svc.cluster.local"

func service(cluster string, ports ...string) *bus.Resource {
	svc := &discoveryv1.Service{Hostname: "web.ns.svc.cluster.local", Namespace: "ns", ClusterId: cluster, Registry: "Kubernetes"}
	for i, p := range ports {
		svc.Ports = append(svc.Ports, &discoveryv1.Port{Name: p, Number: uint32(8080 + i)})
	}
	return &bus.Resource{Name: host, Body: svc}
}

func endpoints(name, cluster string, addrs ...string) *bus.Resource {
	eps := &discoveryv1.Endpoints{Hostname: "web.ns.svc.cluster.local", Namespace: "ns"}
	for _, a := range addrs {
		eps.Endpoints = append(eps.Endpoints, &discoveryv1.Endpoint{Address: a, ClusterId: cluster, Ports: map[string]uint32{"http": 8080}})
	}
	return &bus.Resource{Name: name, Body: eps}
}

// merged reports the central store's web service: its port names and endpoint addresses.
func merged(s *bus.Store) (ports, addrs []string) {
	if r, ok := s.Get(schema.Service.TypeURL, host); ok {
		for _, p := range r.Body.(*discoveryv1.Service).GetPorts() {
			ports = append(ports, p.GetName())
		}
	}
	if r, ok := s.Get(schema.Endpoints.TypeURL, host); ok {
		for _, e := range r.Body.(*discoveryv1.Endpoints).GetEndpoints() {
			addrs = append(addrs, e.GetAddress()+"@"+e.GetClusterId())
		}
	}
	return ports, addrs
}

func equal(a []string, b ...string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestDialedInRegistry: a remote endpoint-watcher dials central over mTLS and publishes its
// registry; central, which never dials, merges it with its own (union of ports, endpoints of
// both clusters), refuses resources of another cluster than the peer's, keeps the remote's last
// state while it is away and takes its full state when it is back.
func TestDialedInRegistry(t *testing.T) {
	auth, err := pki.NewSelfSigned(pki.ECDSAP256, "test", 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	log, logged := testlog.NewRecording(t, slog.LevelDebug)
	centralID := spiffe.ID{TrustDomain: "cluster.local", Namespace: "istio-system", ServiceAccount: "endpoint-watcher"}
	westID := spiffe.ID{TrustDomain: "cluster.local", Namespace: "istio-system", ServiceAccount: "endpoint-watcher-west"}

	central := bus.NewStore(bus.WithLogger(log))
	m := dialin.NewMerger(central)
	local := m.Layer("")
	if err := local.Upsert(schema.Service.TypeURL, service("primary", "http")); err != nil {
		t.Fatal(err)
	}
	if err := local.Upsert(schema.Endpoints.TypeURL, endpoints(host, "primary", "198.18.0.1")); err != nil {
		t.Fatal(err)
	}
	acceptor := bus.NewAcceptor([]spiffe.ID{westID}, dialin.Accept(m, map[spiffe.ID]string{westID: "west"}, log), bus.WithAcceptorLogger(log))
	addr := bustest.Serve(t, central, log, bus.Security{Identity: bustest.SignIdentity(t, auth, centralID), Peers: []spiffe.ID{}}, acceptor)

	remote := bus.NewStore(bus.WithLogger(log))
	if err := remote.Upsert(schema.Service.TypeURL, service("west", "http", "grpc")); err != nil {
		t.Fatal(err)
	}
	if err := remote.Upsert(schema.Endpoints.TypeURL, endpoints(host, "west", "198.18.1.1"), endpoints("ns/only-west", "west", "198.18.1.2")); err != nil {
		t.Fatal(err)
	}
	westIdentity := bustest.SignIdentity(t, auth, westID)
	dial := func() (stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- bus.DialOut(ctx, addr, remote, bus.WithDialLogger(log), bus.WithBackoff(10*time.Millisecond, 50*time.Millisecond),
				bus.WithSecurity(bus.Security{Identity: westIdentity, Peers: []spiffe.ID{centralID}}))
		}()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("DialOut: %v", err)
			}
		}
	}
	stop := dial()
	t.Cleanup(func() { stop() })

	bustest.WaitFor(t, "the remote's registry merged", func() bool {
		ports, addrs := merged(central)
		_, onlyWest := central.Get(schema.Endpoints.TypeURL, "ns/only-west")
		return equal(ports, "http", "grpc") && equal(addrs, "198.18.0.1@primary", "198.18.1.1@west") && onlyWest
	})

	// A resource of another cluster is refused, the rest of the registry kept.
	bad := endpoints("ns/bad", "east", "198.18.2.1")
	if err := remote.Upsert(schema.Endpoints.TypeURL, bad); err != nil {
		t.Fatal(err)
	}
	bustest.WaitFor(t, "the other cluster's resource refused", func() bool { return logged.Count("dialed-in resource refused") > 0 })
	if _, ok := central.Get(schema.Endpoints.TypeURL, "ns/bad"); ok {
		t.Error("central published ns/bad, of cluster east, from the peer of cluster west")
	}
	remote.Delete(schema.Endpoints.TypeURL, "ns/bad")

	// Away: the last state stays.
	stop()
	bustest.WaitFor(t, "the remote's stream ended", func() bool { return logged.Count("dialed-in registry disconnected") > 0 })
	if _, addrs := merged(central); !equal(addrs, "198.18.0.1@primary", "198.18.1.1@west") {
		t.Errorf("after the remote left, endpoints %v, want its last state kept", addrs)
	}

	// Back with a changed registry: its full state replaces the last one.
	remote.Delete(schema.Endpoints.TypeURL, "ns/only-west")
	if err := remote.Upsert(schema.Service.TypeURL, service("west", "http")); err != nil {
		t.Fatal(err)
	}
	stop = dial()
	bustest.WaitFor(t, "the reconnected remote's full state", func() bool {
		ports, _ := merged(central)
		_, onlyWest := central.Get(schema.Endpoints.TypeURL, "ns/only-west")
		return equal(ports, "http") && !onlyWest
	})
}
