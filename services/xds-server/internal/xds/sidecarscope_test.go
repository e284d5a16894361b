package xds

import (
	"slices"
	"strings"
	"testing"

	networking "istio.io/api/networking/v1alpha3"
	security "istio.io/api/security/v1beta1"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/xdstype"
)

const (
	svcA   = "svc.a.svc.cluster.local"
	svcB   = "svc.b.svc.cluster.local"
	otherB = "other.b.svc.cluster.local"
)

func authzPolicy(ns, name string) bus.Change {
	return bus.Change{TypeURL: schema.AuthorizationPolicy.TypeURL, Updated: []*bus.Resource{{Name: ns + "/" + name,
		Body: &security.AuthorizationPolicy{Action: security.AuthorizationPolicy_DENY, Rules: []*security.Rule{{}}}}}}
}

func peerAuthentication(ns, name string) bus.Change {
	return bus.Change{TypeURL: schema.PeerAuthentication.TypeURL, Updated: []*bus.Resource{{Name: ns + "/" + name,
		Body: &security.PeerAuthentication{Mtls: &security.PeerAuthentication_MutualTLS{Mode: security.PeerAuthentication_MutualTLS_STRICT}}}}}
}

func inMeshEndpoints(ns, h string, addrs ...string) bus.Change {
	c := endpoints(ns, h, addrs...)
	for _, ep := range c.Updated[0].Body.(*discoveryv1.Endpoints).GetEndpoints() {
		ep.Labels = map[string]string{model.TLSModeLabel: "istio"}
	}
	return c
}

func sidecar(ns, name string, hosts ...string) bus.Change {
	return bus.Change{TypeURL: schema.Sidecar.TypeURL, Updated: []*bus.Resource{{Name: ns + "/" + name,
		Body: &networking.Sidecar{Egress: []*networking.IstioEgressListener{{Hosts: hosts}}}}}}
}

var abbrev = map[string]string{cds: "CDS", eds: "EDS", lds: "LDS", rds: "RDS", xdstype.NameTable: "NDS"}

// withPort is a Service update that changes only its ports.
func withPort(ns, h string, port uint32) bus.Change {
	c := services(ns, h)
	c.Updated[0].Body.(*discoveryv1.Service).Ports[0].Number = port
	return c
}

func routingVS(ns, name, host, dest string) bus.Change {
	return bus.Change{TypeURL: schema.VirtualService.TypeURL, Updated: []*bus.Resource{{Name: ns + "/" + name,
		Body: &networking.VirtualService{Hosts: []string{host}, Http: []*networking.HTTPRoute{{
			Route: []*networking.HTTPRouteDestination{{Destination: &networking.Destination{Host: dest}}}}}}}}}
}

// TestSidecarScopedPush runs changes through a real model.Store and checks which types
// affectedTypes gives each proxy: sidecars are skipped when their Sidecar imports none of the
// hosts a change concerns, other proxies keep the namespace rules.
func TestSidecarScopedPush(t *testing.T) {
	base := []bus.Change{
		services("a", svcA),
		services("b", svcB, otherB),
		sidecar("a", "default", "./*"),
		sidecar("c", "default", "b/"+svcB),
		sidecar("istio-system", "default", "istio-system/*"),
	}
	sc := func(ns string, ips ...string) *model.Proxy {
		return &model.Proxy{Type: model.SidecarProxy, Namespace: ns, IPs: ips}
	}
	proxies := map[string]*model.Proxy{
		"sidecarA":   sc("a", "10.0.0.1"),
		"sidecarC":   sc("c"),
		"sidecarE":   sc("e"), // the root namespace's default Sidecar applies
		"routerA":    {Type: model.Router, Namespace: "a"},
		"proxylessA": {Type: model.Proxyless, Namespace: "a"},
		// A proxyless gRPC server at the endpoint's address.
		"proxylessServer": {Type: model.Proxyless, Namespace: "a", IPs: []string{"10.0.0.1"}},
	}
	all := "CDS,EDS,LDS,NDS,RDS"
	for _, tc := range []struct {
		name    string
		noSC    bool // drop the Sidecars: today's behaviour
		pre     []bus.Change
		changes []bus.Change
		want    map[string]string
	}{
		{name: "service in other namespace", changes: []bus.Change{withPort("b", otherB, 81)},
			want: map[string]string{"sidecarA": "", "sidecarC": "", "sidecarE": "", "routerA": all, "proxylessA": all}},
		{name: "service in own namespace", changes: []bus.Change{withPort("a", svcA, 81)},
			want: map[string]string{"sidecarA": all, "sidecarC": "", "sidecarE": "", "routerA": all, "proxylessA": all}},
		{name: "imported host only", changes: []bus.Change{withPort("b", svcB, 81)},
			want: map[string]string{"sidecarA": "", "sidecarC": all, "sidecarE": "", "routerA": all, "proxylessA": all}},
		{name: "deleted imported service", changes: []bus.Change{removeService("b", svcB)},
			want: map[string]string{"sidecarA": "", "sidecarC": all, "sidecarE": ""}},
		{name: "without Sidecars", noSC: true, changes: []bus.Change{withPort("b", otherB, 81)},
			want: map[string]string{"sidecarA": all, "sidecarC": all, "sidecarE": all, "routerA": all, "proxylessA": all}},
		{name: "VirtualService for imported host", changes: []bus.Change{virtualService("a", "vs", nil, svcB)},
			want: map[string]string{"sidecarA": "", "sidecarC": "LDS,RDS", "sidecarE": "", "routerA": "LDS,RDS", "proxylessA": "RDS"}},
		{name: "VirtualService short host", changes: []bus.Change{virtualService("a", "vs", nil, "svc")},
			want: map[string]string{"sidecarA": "LDS,RDS", "sidecarC": "", "sidecarE": ""}},
		{name: "VirtualService wildcard host is conservative", changes: []bus.Change{virtualService("a", "vs", nil, "*.b.svc.cluster.local")},
			want: map[string]string{"sidecarA": "LDS,RDS", "sidecarC": "LDS,RDS", "sidecarE": "LDS,RDS"}},
		{name: "VirtualService host renamed", pre: []bus.Change{virtualService("a", "vs", nil, svcB)},
			changes: []bus.Change{virtualService("a", "vs", nil, svcA)},
			want:    map[string]string{"sidecarA": "LDS,RDS", "sidecarC": "LDS,RDS", "sidecarE": ""}},
		{name: "DestinationRule", changes: []bus.Change{destinationRule("b", "dr", svcA)},
			want: map[string]string{"sidecarA": "CDS,EDS,RDS", "sidecarC": "", "sidecarE": "", "routerA": "CDS,EDS,RDS", "proxylessA": "CDS,EDS,RDS"}},
		{name: "DestinationRule of a service the proxy serves", pre: []bus.Change{endpoints("b", otherB, "10.0.0.1")},
			changes: []bus.Change{destinationRule("b", "dr", otherB)},
			want:    map[string]string{"sidecarA": "CDS,EDS,RDS", "sidecarC": "", "sidecarE": ""}},
		{name: "service routed to by imported VirtualService", pre: []bus.Change{routingVS("a", "vs", svcA, otherB)},
			changes: []bus.Change{withPort("b", otherB, 81)},
			want:    map[string]string{"sidecarA": all, "sidecarC": "", "sidecarE": ""}},
		{name: "service with endpoints at the proxy", pre: []bus.Change{endpoints("b", otherB, "10.0.0.1")},
			changes: []bus.Change{withPort("b", otherB, 81)},
			want:    map[string]string{"sidecarA": all, "sidecarC": "", "sidecarE": ""}},
		{name: "own endpoint appears", changes: []bus.Change{endpoints("b", otherB, "10.0.0.1")},
			want: map[string]string{"sidecarA": "CDS,EDS,LDS", "sidecarC": "EDS", "routerA": "EDS", "proxylessA": "EDS", "proxylessServer": "EDS,LDS"}},
		{name: "endpoint joins the mesh", pre: []bus.Change{endpoints("b", svcB, "10.0.9.1")},
			changes: []bus.Change{inMeshEndpoints("b", svcB, "10.0.9.1")},
			want:    map[string]string{"sidecarA": "EDS", "sidecarC": "CDS,EDS", "routerA": "CDS,EDS", "proxylessA": "CDS,EDS"}},
		{name: "AuthorizationPolicy in a namespace", changes: []bus.Change{authzPolicy("a", "deny")},
			want: map[string]string{"sidecarA": "LDS", "sidecarC": "", "sidecarE": "", "routerA": "LDS", "proxylessA": "LDS"}},
		{name: "AuthorizationPolicy deleted", pre: []bus.Change{authzPolicy("c", "deny")},
			changes: []bus.Change{{TypeURL: schema.AuthorizationPolicy.TypeURL, Removed: []string{"c/deny"}}},
			want:    map[string]string{"sidecarA": "", "sidecarC": "LDS", "sidecarE": "", "proxylessA": ""}},
		{name: "AuthorizationPolicy in the root namespace", changes: []bus.Change{authzPolicy("istio-system", "deny")},
			want: map[string]string{"sidecarA": "LDS", "sidecarC": "LDS", "sidecarE": "LDS", "routerA": "LDS", "proxylessA": "LDS"}},
		{name: "PeerAuthentication in a namespace", changes: []bus.Change{peerAuthentication("a", "default")},
			want: map[string]string{"sidecarA": "CDS,EDS,LDS", "sidecarC": "CDS,EDS", "routerA": "CDS,EDS,LDS", "proxylessA": "CDS,EDS,LDS", "proxylessServer": "CDS,EDS,LDS"}},
		{name: "PeerAuthentication deleted", pre: []bus.Change{peerAuthentication("c", "default")},
			changes: []bus.Change{{TypeURL: schema.PeerAuthentication.TypeURL, Removed: []string{"c/default"}}},
			want:    map[string]string{"sidecarA": "CDS,EDS", "sidecarC": "CDS,EDS,LDS", "proxylessA": "CDS,EDS"}},
		{name: "PeerAuthentication in the root namespace", changes: []bus.Change{peerAuthentication("istio-system", "default")},
			want: map[string]string{"sidecarA": "CDS,EDS,LDS", "sidecarC": "CDS,EDS,LDS", "sidecarE": "CDS,EDS,LDS", "proxylessA": "CDS,EDS,LDS"}},
		{name: "RequestAuthentication", changes: []bus.Change{{TypeURL: schema.RequestAuthentication.TypeURL,
			Updated: []*bus.Resource{{Name: "c/jwt", Body: &security.RequestAuthentication{}}}}},
			want: map[string]string{"sidecarA": "", "sidecarC": "LDS", "sidecarE": "", "routerA": ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := model.NewStore()
			h := s.Handler(nil)
			apply := func(cs []bus.Change) {
				t.Helper()
				for _, c := range cs {
					if tc.noSC && c.TypeURL == schema.Sidecar.TypeURL {
						continue
					}
					if err := h.Apply(c); err != nil {
						t.Fatal(err)
					}
				}
			}
			apply(base)
			apply(tc.pre)
			s.Next()
			apply(tc.changes)
			snap, ch := s.Next()
			req := &PushRequest{Full: ch.Full, Configs: ch.Configs, Endpoints: ch.Endpoints, Hosts: ch.Hosts}
			for name, want := range tc.want {
				var got []string
				for typ := range affectedTypes(proxies[name], req, snap) {
					got = append(got, abbrev[typ])
				}
				slices.Sort(got)
				if g := strings.Join(got, ","); g != want {
					t.Errorf("%s: pushed %q, want %q", name, g, want)
				}
			}
		})
	}
}

// Fetched JWKS are inlined into sidecars' and gateways' listeners, not proxyless ones.
func TestJWKSPush(t *testing.T) {
	s := model.NewStore()
	s.Next()
	s.SetJWKS("https://idp/keys", "k")
	snap, ch := s.Next()
	req := &PushRequest{Full: ch.Full, Configs: ch.Configs, Endpoints: ch.Endpoints, Hosts: ch.Hosts}
	for _, tc := range []struct {
		proxy *model.Proxy
		want  string
	}{
		{&model.Proxy{Type: model.SidecarProxy, Namespace: "a"}, "LDS"},
		{&model.Proxy{Type: model.Router, Namespace: "a"}, "LDS"},
		{&model.Proxy{Type: model.Proxyless, Namespace: "a"}, ""},
	} {
		var got []string
		for typ := range affectedTypes(tc.proxy, req, snap) {
			got = append(got, abbrev[typ])
		}
		if g := strings.Join(got, ","); g != tc.want {
			t.Errorf("%s: pushed %q, want %q", tc.proxy.Type, g, tc.want)
		}
	}
}

// Merging requests keeps the hosts of both, so a debounced push still reaches the proxy.
func TestPushRequestMergeHosts(t *testing.T) {
	k1 := model.ConfigKey{Kind: "Service", Namespace: "a", Name: svcA}
	k2 := model.ConfigKey{Kind: "Service", Namespace: "b", Name: svcB}
	r1 := &PushRequest{Full: true, Hosts: map[model.ConfigKey]model.HostSet{k1: {Hosts: []model.HostRef{{Namespace: "a", Hostname: svcA}}}}}
	r2 := &PushRequest{Full: true, Hosts: map[model.ConfigKey]model.HostSet{k2: {Hosts: []model.HostRef{{Namespace: "b", Hostname: svcB}}}}}
	m := r1.Merge(r2)
	if len(m.Hosts) != 2 || len(r1.Hosts) != 1 {
		t.Fatalf("merged hosts %v, first request now %v", m.Hosts, r1.Hosts)
	}
}

// Through the server: a sidecar whose Sidecar imports only its namespace is not pushed for a
// service of another namespace.
func TestSidecarScopedPushServer(t *testing.T) {
	e := newEnv(t, Options{}, services("a", svcA), services("b", svcB), sidecar("a", "default", "./*"))
	c := newSotW(t, e.addr, node("p", "a", false))
	c.subscribe(cds)
	c.recvType(cds)
	// New services, so a push would change the clusters fakeGen lists.
	e.update(services("b", "new.b.svc.cluster.local"))
	if got := c.drain(); len(got) != 0 {
		t.Fatalf("pushed %v for a service its Sidecar does not import", types_(got))
	}
	e.updatePushed(services("a", "new.a.svc.cluster.local"))
	if got := c.drain(); len(got) == 0 {
		t.Fatal("not pushed for a service its Sidecar imports")
	}
}
