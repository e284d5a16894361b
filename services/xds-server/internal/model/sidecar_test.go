package model

import (
	"slices"
	"testing"

	networking "istio.io/api/networking/v1alpha3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
)

func egress(port uint32, hosts ...string) *networking.IstioEgressListener {
	l := &networking.IstioEgressListener{Hosts: hosts}
	if port != 0 {
		l.Port = &networking.SidecarPort{Number: port}
	}
	return l
}

func TestSidecarImports(t *testing.T) {
	const svcB = "svc.b.svc.cluster.local"
	for _, tc := range []struct {
		name         string
		egress       []*networking.IstioEgressListener
		ns, hostname string
		port         uint32 // 0: any port (SidecarImports)
		want         bool
	}{
		{name: "no egress imports all", ns: "b", hostname: svcB, want: true},
		{name: "own namespace", egress: []*networking.IstioEgressListener{egress(0, "./*")}, ns: "a", hostname: "x.a.svc.cluster.local", want: true},
		{name: "own namespace, other host", egress: []*networking.IstioEgressListener{egress(0, "./*")}, ns: "b", hostname: svcB},
		{name: "exact host", egress: []*networking.IstioEgressListener{egress(0, "b/"+svcB)}, ns: "b", hostname: svcB, want: true},
		{name: "exact host, another", egress: []*networking.IstioEgressListener{egress(0, "b/"+svcB)}, ns: "b", hostname: "o.b.svc.cluster.local"},
		{name: "host in wrong namespace", egress: []*networking.IstioEgressListener{egress(0, "c/"+svcB)}, ns: "b", hostname: svcB},
		{name: "any namespace", egress: []*networking.IstioEgressListener{egress(0, "*/"+svcB)}, ns: "b", hostname: svcB, want: true},
		{name: "wildcard host", egress: []*networking.IstioEgressListener{egress(0, "b/*.svc.cluster.local")}, ns: "b", hostname: svcB, want: true},
		{name: "no namespace", egress: []*networking.IstioEgressListener{egress(0, "~/*")}, ns: "b", hostname: svcB},
		{name: "entry without namespace ignored", egress: []*networking.IstioEgressListener{egress(0, svcB)}, ns: "b", hostname: svcB},
		{name: "other port listener, any port", egress: []*networking.IstioEgressListener{egress(9090, "b/*")}, ns: "b", hostname: svcB, want: true},
		{name: "other port listener, port 80", egress: []*networking.IstioEgressListener{egress(9090, "b/*")}, ns: "b", hostname: svcB, port: 80},
		{name: "same port listener", egress: []*networking.IstioEgressListener{egress(80, "b/*")}, ns: "b", hostname: svcB, port: 80, want: true},
		// "~" excludes, as in istiod, whatever else in the listener imports the host.
		{name: "excluded host", egress: []*networking.IstioEgressListener{egress(0, "b/*", "~b/"+svcB)}, ns: "b", hostname: svcB},
		{name: "excluded in any namespace", egress: []*networking.IstioEgressListener{egress(0, "*/*", "~/*.b.svc.cluster.local")}, ns: "b", hostname: svcB},
		{name: "exclusion of another host", egress: []*networking.IstioEgressListener{egress(0, "b/*", "~b/o.b.svc.cluster.local")}, ns: "b", hostname: svcB, want: true},
		{name: "exclusion of another namespace", egress: []*networking.IstioEgressListener{egress(0, "*/*", "~c/*")}, ns: "b", hostname: svcB, want: true},
		{name: "excluded in the own namespace", egress: []*networking.IstioEgressListener{egress(0, "*/*", "~./*")}, ns: "a", hostname: "x.a.svc.cluster.local"},
		{name: "another listener still imports", egress: []*networking.IstioEgressListener{egress(0, "b/*", "~b/"+svcB), egress(0, "*/"+svcB)},
			ns: "b", hostname: svcB, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := &networking.Sidecar{Egress: tc.egress}
			got := SidecarImports(sc, "a", tc.ns, tc.hostname)
			if tc.port != 0 {
				got = SidecarImportsPort(sc, "a", tc.ns, tc.hostname, tc.port)
			}
			if got != tc.want {
				t.Fatalf("imports = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSelectSidecar(t *testing.T) {
	snap := &Snapshot{Sidecars: []Config[*networking.Sidecar]{
		{Namespace: "istio-system", Name: "root", Spec: &networking.Sidecar{}},
		{Namespace: "a", Name: "default", Spec: &networking.Sidecar{}},
		{Namespace: "a", Name: "app", Spec: &networking.Sidecar{WorkloadSelector: &networking.WorkloadSelector{Labels: map[string]string{"app": "x"}}}},
	}}
	for _, tc := range []struct {
		name   string
		proxy  *Proxy
		wantSC string
	}{
		{"selector wins", &Proxy{Namespace: "a", Labels: map[string]string{"app": "x"}}, "a/app"},
		{"namespace default", &Proxy{Namespace: "a", Labels: map[string]string{"app": "y"}}, "a/default"},
		{"root default", &Proxy{Namespace: "b"}, "istio-system/root"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := SelectSidecar(snap, tc.proxy)
			if sc == nil || sc.Namespace+"/"+sc.Name != tc.wantSC {
				t.Fatalf("selected %v, want %s", sc, tc.wantSC)
			}
		})
	}
	if sc := SelectSidecar(&Snapshot{}, &Proxy{Namespace: "a"}); sc != nil {
		t.Fatalf("selected %v with no Sidecars", sc)
	}
}

// Change.Hosts lists the hosts of old and new versions, resolved against both snapshots.
func TestChangeHosts(t *testing.T) {
	svc := func(ns, host string) bus.Change {
		return bus.Change{TypeURL: schema.Service.TypeURL, Updated: []*bus.Resource{{Name: ns + "/" + host,
			Body: &discoveryv1.Service{Hostname: host, Namespace: ns}}}}
	}
	vs := func(ns string, hosts ...string) bus.Change {
		return bus.Change{TypeURL: schema.VirtualService.TypeURL, Updated: []*bus.Resource{{Name: ns + "/vs",
			Body: &networking.VirtualService{Hosts: hosts}}}}
	}
	eps := func(ns, host string, ips ...string) bus.Change {
		e := &discoveryv1.Endpoints{Hostname: host, Namespace: ns}
		for _, ip := range ips {
			e.Endpoints = append(e.Endpoints, &discoveryv1.Endpoint{Address: ip})
		}
		return bus.Change{TypeURL: schema.Endpoints.TypeURL, Updated: []*bus.Resource{{Name: ns + "/" + host, Body: e}}}
	}
	dr := func(ns, host string) bus.Change {
		return bus.Change{TypeURL: schema.DestinationRule.TypeURL, Updated: []*bus.Resource{{Name: ns + "/dr",
			Body: &networking.DestinationRule{Host: host}}}}
	}
	ref := func(ns, h string) HostRef { return HostRef{Namespace: ns, Hostname: h} }
	vsKey := ConfigKey{Kind: "VirtualService", Namespace: "a", Name: "vs"}
	for _, tc := range []struct {
		name   string
		pre    []bus.Change
		change bus.Change
		key    ConfigKey
		want   HostSet
	}{
		{name: "network gateway service is unknown", change: bus.Change{TypeURL: schema.Service.TypeURL, Updated: []*bus.Resource{{
			Name: "istio-system/gw.istio-system.svc.cluster.local", Body: &discoveryv1.Service{Hostname: "gw.istio-system.svc.cluster.local",
				Namespace: "istio-system", NetworkGateways: []*discoveryv1.NetworkGateway{{Network: "n2", Address: "198.18.2.1", Port: 15443}}}}}},
			key:  ConfigKey{Kind: "Service", Namespace: "istio-system", Name: "gw.istio-system.svc.cluster.local"},
			want: HostSet{Unknown: true, Hosts: []HostRef{ref("istio-system", "gw.istio-system.svc.cluster.local")}}},
		{name: "deleted service", pre: []bus.Change{svc("b", "s.b.svc.cluster.local")},
			change: bus.Change{TypeURL: schema.Service.TypeURL, Removed: []string{"b/s.b.svc.cluster.local"}},
			key:    ConfigKey{Kind: "Service", Namespace: "b", Name: "s.b.svc.cluster.local"},
			want:   HostSet{Hosts: []HostRef{ref("b", "s.b.svc.cluster.local")}}},
		{name: "renamed VirtualService host", pre: []bus.Change{svc("b", "s.b.svc.cluster.local"), vs("a", "s.b.svc.cluster.local")},
			change: vs("a", "t.a.svc.cluster.local"), key: vsKey,
			want: HostSet{Hosts: []HostRef{ref("b", "s.b.svc.cluster.local"), ref("a", "t.a.svc.cluster.local")}}},
		{name: "short host resolves in the config namespace", change: vs("a", "t"), key: vsKey,
			want: HostSet{Hosts: []HostRef{ref("a", "t.a.svc.cluster.local")}}},
		{name: "wildcard host is unknown", change: vs("a", "*.b.svc.cluster.local"), key: vsKey, want: HostSet{Unknown: true}},
		{name: "delegate is unknown", change: vs("a"), key: vsKey, want: HostSet{Unknown: true}},
		{name: "DestinationRule reaches its service's workloads",
			pre:    []bus.Change{svc("b", "s.b.svc.cluster.local"), eps("b", "s.b.svc.cluster.local", "10.0.0.2", "10.0.0.1")},
			change: dr("a", "s.b.svc.cluster.local"), key: ConfigKey{Kind: "DestinationRule", Namespace: "a", Name: "dr"},
			want: HostSet{Hosts: []HostRef{ref("b", "s.b.svc.cluster.local")}, Addresses: []string{"10.0.0.1", "10.0.0.2"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewStore()
			h := s.Handler(nil)
			for _, c := range tc.pre {
				if err := h.Apply(c); err != nil {
					t.Fatal(err)
				}
			}
			s.Next()
			if err := h.Apply(tc.change); err != nil {
				t.Fatal(err)
			}
			_, ch := s.Next()
			got := ch.Hosts[tc.key]
			if got.Unknown != tc.want.Unknown || !slices.Equal(got.Hosts, tc.want.Hosts) || !slices.Equal(got.Addresses, tc.want.Addresses) {
				t.Fatalf("hosts = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestSidecarImportsVirtualService(t *testing.T) {
	const svcB = "svc.b.svc.cluster.local"
	for _, tc := range []struct {
		name   string
		egress []*networking.IstioEgressListener
		vsNS   string
		hosts  []string
		want   bool
	}{
		{name: "no egress imports all", vsNS: "c", hosts: []string{svcB}, want: true},
		// A VirtualService is imported by its own namespace, not the host's.
		{name: "host's namespace imported, VirtualService's not", egress: []*networking.IstioEgressListener{egress(0, "b/*")},
			vsNS: "c", hosts: []string{svcB}},
		{name: "VirtualService's namespace", egress: []*networking.IstioEgressListener{egress(0, "c/*")}, vsNS: "c", hosts: []string{svcB}, want: true},
		{name: "own namespace", egress: []*networking.IstioEgressListener{egress(0, "./*")}, vsNS: "a", hosts: []string{svcB}, want: true},
		{name: "exact host", egress: []*networking.IstioEgressListener{egress(0, "*/"+svcB)}, vsNS: "c", hosts: []string{svcB}, want: true},
		{name: "other host", egress: []*networking.IstioEgressListener{egress(0, "*/"+svcB)}, vsNS: "c", hosts: []string{"o.b.svc.cluster.local"}},
		{name: "wildcard VirtualService host matches an imported host", egress: []*networking.IstioEgressListener{egress(0, "*/"+svcB)},
			vsNS: "c", hosts: []string{"*.b.svc.cluster.local"}, want: true},
		{name: "excluded host", egress: []*networking.IstioEgressListener{egress(0, "*/*", "~c/"+svcB)}, vsNS: "c", hosts: []string{svcB}},
		{name: "another host not excluded", egress: []*networking.IstioEgressListener{egress(0, "*/*", "~c/"+svcB)}, vsNS: "c",
			hosts: []string{svcB, "o.b.svc.cluster.local"}, want: true},
		{name: "a wildcard is not within an exact exclusion", egress: []*networking.IstioEgressListener{egress(0, "*/*", "~c/"+svcB)}, vsNS: "c",
			hosts: []string{"*.b.svc.cluster.local"}, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := &networking.Sidecar{Egress: tc.egress}
			if got := SidecarImportsVirtualService(sc, "a", tc.vsNS, tc.hosts); got != tc.want {
				t.Fatalf("imports = %v, want %v", got, tc.want)
			}
		})
	}
}
