package upstream

import (
	"crypto/x509"
	"errors"
	"log/slog"
	"net/url"
	"testing"

	"go.uber.org/goleak"
	networking "istio.io/api/networking/v1alpha3"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSynthetic(t *testing.T) {
	se := func(name string, hosts ...string) *bus.Resource {
		return &bus.Resource{Name: name, Body: &networking.ServiceEntry{Hosts: hosts}}
	}
	for _, tc := range []struct {
		name string
		r    *bus.Resource
		want bool
	}{
		{"istiod's for a Kubernetes service", se("default/synthetic-kubernetes", "kubernetes.default.svc.cluster.local"), true},
		{"another domain suffix", se("demo/synthetic-web", "web.demo.svc.example.org"), true},
		{"a user's ServiceEntry of the same name, another host", se("default/synthetic-kubernetes", "api.example.com"), false},
		{"another namespace's host", se("demo/synthetic-web", "web.other.svc.cluster.local"), false},
		{"several hosts", se("demo/synthetic-web", "web.demo.svc.cluster.local", "x.example"), false},
		{"no prefix", se("demo/web", "web.demo.svc.cluster.local"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := synthetic(tc.r); got != tc.want {
				t.Fatalf("synthetic = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestAcceptServer(t *testing.T) {
	spiffeURL, _ := url.Parse("spiffe://cluster.local/ns/istio-system/sa/config-ingest")
	istiod := &x509.Certificate{DNSNames: []string{"istiod.istio-system.svc", "istiod"}}
	sailplane := &x509.Certificate{URIs: []*url.URL{spiffeURL}}
	for _, tc := range []struct {
		name       string
		leaf       *x509.Certificate
		serverName string
		sans       []string
		ok         bool
	}{
		{"istiod by host name", istiod, "istiod.istio-system.svc", nil, true},
		{"istiod dialled by IP, no sni", istiod, "127.0.0.1", nil, false},
		{"Sailplane by its namespace's identity", sailplane, "127.0.0.1", nil, true},
		{"subjectAltNames listed", sailplane, "127.0.0.1", []string{"spiffe://cluster.local/ns/istio-system/sa/config-ingest"}, true},
		{"subjectAltNames not matching", istiod, "istiod.istio-system.svc", []string{"spiffe://cluster.local/ns/istio-system/sa/istiod"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := acceptServer(tc.leaf, tc.serverName, tc.sans, "cluster.local", "istio-system")
			if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrServerIdentity)) {
				t.Fatalf("acceptServer = %v, want ok %v", err, tc.ok)
			}
		})
	}
	other := &x509.Certificate{URIs: []*url.URL{{Scheme: "spiffe", Host: "cluster.local", Path: "/ns/apps/sa/web"}}}
	if err := acceptServer(other, "127.0.0.1", nil, "cluster.local", "istio-system"); err == nil {
		t.Fatal("a workload of another namespace accepted as the upstream")
	}
}

type recorder struct {
	state map[string]map[string]*bus.Resource
}

func (r *recorder) typ(t string) map[string]*bus.Resource {
	if r.state[t] == nil {
		r.state[t] = map[string]*bus.Resource{}
	}
	return r.state[t]
}
func (r *recorder) Upsert(t string, rs ...*bus.Resource) error {
	for _, x := range rs {
		r.typ(t)[x.Name] = x
	}
	return nil
}
func (r *recorder) Delete(t string, names ...string) {
	for _, n := range names {
		delete(r.typ(t), n)
	}
}
func (r *recorder) Replace(t string, rs []*bus.Resource) error {
	r.state[t] = map[string]*bus.Resource{}
	return r.Upsert(t, rs...)
}

// The merger serves, per key, the first layer's version; dropping a layer falls back to the
// next; a conflict is listed once per loser.
func TestMerger(t *testing.T) {
	out := &recorder{state: map[string]map[string]*bus.Resource{}}
	m := NewMerger(out, slog.New(slog.DiscardHandler), nil, nil)
	m.SetOrder([]string{"xds://a", "xds://b"})
	vs := schema.VirtualService.TypeURL
	res := func(name, host string) *bus.Resource {
		return &bus.Resource{Name: name, Body: &networking.VirtualService{Hosts: []string{host}}}
	}
	host := func(name string) string {
		if r := out.state[vs][name]; r != nil {
			return r.Body.(*networking.VirtualService).GetHosts()[0]
		}
		return ""
	}
	_ = m.Publisher("xds://b").Replace(vs, []*bus.Resource{res("ns/x", "b"), res("ns/only-b", "b")})
	_ = m.Publisher("xds://a").Replace(vs, []*bus.Resource{res("ns/x", "a")})
	if host("ns/x") != "a" || host("ns/only-b") != "b" {
		t.Fatalf("x from %q, only-b from %q", host("ns/x"), host("ns/only-b"))
	}
	_ = m.Publisher(Local).Replace(vs, []*bus.Resource{res("ns/x", "local")})
	if host("ns/x") != "local" || host("ns/only-b") != "b" {
		t.Fatalf("after the local state: x from %q, only-b from %q", host("ns/x"), host("ns/only-b"))
	}
	if c := m.Conflicts(); len(c) != 2 {
		t.Fatalf("conflicts = %v, want x's copies in a and b", c)
	}
	m.Publisher(Local).Delete(vs, "ns/x")
	m.SetOrder([]string{"xds://b"})
	if host("ns/x") != "b" || len(m.Conflicts()) != 0 {
		t.Fatalf("after dropping the local copy and a: x from %q, conflicts %v", host("ns/x"), m.Conflicts())
	}
	m.SetOrder(nil)
	if len(out.state[vs]) != 0 {
		t.Fatalf("after dropping every upstream: %v", out.state[vs])
	}
}
