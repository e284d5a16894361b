package loadgen

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	networking "istio.io/api/networking/v1alpha3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	xdsserver "sailplane.dev/services/xds-server"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/testlog"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testLogger(t testing.TB) *slog.Logger {
	return testlog.New(t, slog.LevelInfo)
}

func registry(m Mesh, svc int, extra ...string) (*bus.Resource, *bus.Resource) {
	host := m.Host(svc)
	s := &discoveryv1.Service{Hostname: host, Namespace: m.Namespace,
		Ports: []*discoveryv1.Port{{Name: "http", Number: ServicePort, Protocol: "HTTP"}}}
	eps := &discoveryv1.Endpoints{Hostname: host, Namespace: m.Namespace}
	for e := range m.Endpoints {
		eps.Endpoints = append(eps.Endpoints, &discoveryv1.Endpoint{Address: ProxyIP(svc*m.Endpoints + e)})
	}
	for _, ip := range extra {
		eps.Endpoints = append(eps.Endpoints, &discoveryv1.Endpoint{Address: ip})
	}
	name := schema.Name(m.Namespace, host)
	return &bus.Resource{Name: name, Body: s}, &bus.Resource{Name: name, Body: eps}
}

// startServer serves mesh's registry with a real xds-server on 127.0.0.1 until the test ends;
// it returns the store to change and the server, ready.
func startServer(t *testing.T, mesh Mesh, cfg xdsserver.Config) (*bus.Store, *xdsserver.Server) {
	t.Helper()
	store := bus.NewStore()
	for i := range mesh.Services {
		svc, eps := registry(mesh, i)
		store.Upsert(schema.Service.TypeURL, svc)
		store.Upsert(schema.Endpoints.TypeURL, eps)
	}
	src := bus.Local(store)
	srv, err := xdsserver.New(cfg, xdsserver.Deps{Logger: testLogger(t), Config: src, Registry: src})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ctx, lis); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("serve: %v", err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	wait(t, "server ready", srv.Ready())
	return store, srv
}

// wait fails the test unless ch closes within a generous deadline.
func wait(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	timer := time.NewTimer(30 * time.Second)
	defer timer.Stop()
	select {
	case <-ch:
	case <-timer.C:
		t.Fatalf("timed out waiting for %s", what)
	}
}

// TestProxiesAgainstXDSServer runs simulated sidecars, SotW and delta, against a real
// xds-server: they sync the whole mesh, follow EDS and RDS names, and see a VirtualService
// change and an endpoint change through the marker mechanism.
func TestProxiesAgainstXDSServer(t *testing.T) {
	for _, delta := range []bool{false, true} {
		name := "sotw"
		if delta {
			name = "delta"
		}
		t.Run(name, func(t *testing.T) {
			mesh := Mesh{Namespace: "load", Services: 5, Endpoints: 2}
			store, srv := startServer(t, mesh, xdsserver.Config{Debounce: 5 * time.Millisecond, CacheAssert: true})
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			defer wg.Wait()
			defer cancel()

			shared := NewShared()
			var proxies []*Proxy
			for i := range 4 {
				p := NewProxy(ProxyConfig{Addr: srv.Addr().String(), Delta: delta, Index: i, Namespace: mesh.Namespace,
					IP: mesh.IPOf(i), Labels: mesh.Labels(i), Shared: shared, Logger: testLogger(t)})
				proxies = append(proxies, p)
				wg.Go(func() {
					if err := p.Run(ctx); err != nil {
						t.Errorf("proxy %d: %v", i, err)
					}
				})
			}
			var clusters []string
			for i := range mesh.Services {
				clusters = append(clusters, mesh.Cluster(i))
			}
			for i, p := range proxies {
				wait(t, "proxy synced", p.Synced())
				if got := p.Names(EndpointType); !slices.Equal(got, clusters) {
					t.Errorf("proxy %d watches EDS %v, want %v", i, got, clusters)
				}
				if got := p.Names(RouteType); !slices.Equal(got, []string{"8080"}) {
					t.Errorf("proxy %d watches RDS %v, want [8080]", i, got)
				}
				if d, ok := p.SyncedAfter(); !ok || d <= 0 {
					t.Errorf("proxy %d: SyncedAfter = %v, %v", i, d, ok)
				}
				if p.BytesReceived() == 0 {
					t.Errorf("proxy %d: no bytes counted", i)
				}
			}

			// A VirtualService whose header value must reach every proxy's RDS "8080".
			m := shared.NewMarker(RouteType, "8080", "marker-value-1", watching(proxies, RouteType, "8080"))
			m.Begin()
			vs := &networking.VirtualService{Hosts: []string{mesh.Host(0)}, Http: []*networking.HTTPRoute{{
				Match: []*networking.HTTPMatchRequest{{Headers: map[string]*networking.StringMatch{
					"x-loadgen-marker": {MatchType: &networking.StringMatch_Exact{Exact: "marker-value-1"}}}}},
				Route: []*networking.HTTPRouteDestination{{Destination: &networking.Destination{Host: mesh.Host(0)}}},
			}}}
			store.Upsert(schema.VirtualService.TypeURL, &bus.Resource{Name: "load/loadgen-marker", Body: vs})
			wait(t, "VirtualService marker", m.Done())
			if lat, missing := m.Latencies(); len(lat) != len(proxies) || missing != 0 {
				t.Errorf("VirtualService marker: %d latencies, %d missing", len(lat), missing)
			}
			shared.Remove(m)

			// One more endpoint of service 3 must reach the EDS of every proxy watching it.
			ip := MarkerIP(0)
			m = shared.NewMarker(EndpointType, mesh.Cluster(3), ip, watching(proxies, EndpointType, mesh.Cluster(3)))
			m.Begin()
			_, eps := registry(mesh, 3, ip)
			store.Upsert(schema.Endpoints.TypeURL, eps)
			wait(t, "endpoint marker", m.Done())
			if lat, missing := m.Latencies(); len(lat) != len(proxies) || missing != 0 {
				t.Errorf("endpoint marker: %d latencies, %d missing", len(lat), missing)
			}
			if shared.BytesReceived.Load() == 0 || shared.Responses.Load() == 0 {
				t.Error("no response bytes counted")
			}
		})
	}
}

func TestDiffSorted(t *testing.T) {
	for _, tc := range []struct {
		have, want, add, remove []string
	}{
		{nil, []string{"a", "b"}, []string{"a", "b"}, nil},
		{[]string{"a", "b"}, nil, nil, []string{"a", "b"}},
		{[]string{"a", "c"}, []string{"b", "c", "d"}, []string{"b", "d"}, []string{"a"}},
	} {
		add, remove := diffSorted(tc.have, tc.want)
		if !slices.Equal(add, tc.add) || !slices.Equal(remove, tc.remove) {
			t.Errorf("diffSorted(%v, %v) = %v, %v", tc.have, tc.want, add, remove)
		}
	}
}

func TestNameField(t *testing.T) {
	if got := nameField([]byte("\x0a\x04abcd\x12\x01x")); got != "abcd" {
		t.Errorf("nameField = %q", got)
	}
	if got := nameField([]byte("\x12\x01x\x0a\x02ok")); got != "ok" {
		t.Errorf("nameField after another field = %q", got)
	}
}

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i))
	}
	if Percentile(d, .5) != 50 || Percentile(d, .99) != 99 || Percentile(d, 1) != 100 || Percentile(nil, .5) != 0 {
		t.Errorf("percentiles: %v %v %v", Percentile(d, .5), Percentile(d, .99), Percentile(d, 1))
	}
}

// Against a server that takes one initial push at a time, a connect storm is refused in part
// (Unavailable with a retry delay); the proxies retry after the delay, from several loopback
// addresses, until every one holds its configuration.
func TestProxiesRetryWhenRefused(t *testing.T) {
	mesh := Mesh{Namespace: "load", Services: 5, Endpoints: 2}
	_, srv := startServer(t, mesh, xdsserver.Config{Debounce: 5 * time.Millisecond,
		Overload: xdsserver.Overload{MaxInitializing: 1, AdmissionWait: time.Millisecond, AdmissionRate: -1}})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	shared := NewShared()
	var proxies []*Proxy
	for i := range 20 {
		addr := srv.Addr().String()
		p := NewProxy(ProxyConfig{Addr: addr, Index: i, Namespace: mesh.Namespace, IP: mesh.IPOf(i), Labels: mesh.Labels(i),
			Shared: shared, Logger: testLogger(t), SourceIP: SourceIP(addr, i)})
		proxies = append(proxies, p)
		wg.Go(func() {
			if err := p.Run(ctx); err != nil {
				t.Errorf("proxy %d: %v", i, err)
			}
		})
	}
	for _, p := range proxies {
		wait(t, "proxy synced", p.Synced())
	}
	if shared.Refused.Load() == 0 {
		t.Error("no stream was refused: the storm did not exceed one initial push")
	}
}

func TestSourceIP(t *testing.T) {
	for _, tc := range []struct {
		server string
		i      int
		want   string
	}{
		{"127.0.0.1:15010", 0, "127.0.0.1"},
		{"127.0.0.1:15010", 205, "127.0.0.6"},
		{"10.0.0.1:15010", 3, ""},
		{"[::1]:15010", 3, ""},
		{"xds:15010", 3, ""},
	} {
		if got := SourceIP(tc.server, tc.i); got != tc.want {
			t.Errorf("SourceIP(%q, %d) = %q, want %q", tc.server, tc.i, got, tc.want)
		}
	}
}
