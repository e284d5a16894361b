package translate

import (
	"slices"
	"testing"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
)

// TestAltHosts checks the short names against the examples istiod documents for
// GenerateAltVirtualHosts.
func TestAltHosts(t *testing.T) {
	for _, tc := range []struct {
		host, proxyDomain string
		want              []string
	}{
		{"foo.ns1.svc.cluster.local", "ns1.svc.cluster.local", []string{"foo", "foo.ns1.svc", "foo.ns1"}},
		{"foo.ns1.svc.cluster.local", "ns2.svc.cluster.local", []string{"foo.ns1", "foo.ns1.svc"}},
		{"foo.ns1.svc.other.local", "ns1.svc.cluster.local", nil},
		{"foo.svc.cluster.local", "ns1.svc.cluster.local", nil},
		{"api.example.com", "ns1.svc.cluster.local", nil},
		{"foo.local.campus.net", "local.campus.net", []string{"foo"}},
		{"foo.local.campus.net", "remote.campus.net", []string{"foo.local", "foo.local.campus"}},
		{"foo.local.campus.net", "example.com", nil},
		{"foo.local.campus.net", "", nil},
		{"campus.net", "campus.net", nil},
	} {
		if got := AltHosts(tc.host, tc.proxyDomain); !slices.Equal(got, tc.want) {
			t.Errorf("AltHosts(%q, %q) = %q, want %q", tc.host, tc.proxyDomain, got, tc.want)
		}
	}
}

// TestDomains checks the virtual host domains against istiod's for the same services (seen
// side by side): trailing-dot form, short names, headless wildcards, VIPs.
func TestDomains(t *testing.T) {
	kube := func(host string, res discoveryv1.Resolution, addrs ...string) *discoveryv1.Service {
		return &discoveryv1.Service{Hostname: host, Namespace: "default", Registry: "kubernetes",
			Resolution: res, Addresses: addrs}
	}
	for _, tc := range []struct {
		name string
		svc  *discoveryv1.Service
		want []string
	}{
		{"vip", kube("api.default.svc.cluster.local", discoveryv1.Resolution_STATIC, "10.96.5.2"),
			[]string{"api.default.svc.cluster.local", "api.default.svc.cluster.local.", "api", "api.default.svc", "api.default", "10.96.5.2"}},
		{"headless", kube("db.default.svc.cluster.local", discoveryv1.Resolution_NONE),
			[]string{"db.default.svc.cluster.local", "db.default.svc.cluster.local.", "db", "db.default.svc", "db.default",
				"*.db.default.svc.cluster.local", "*.db.default.svc.cluster.local.", "*.db", "*.db.default.svc", "*.db.default"}},
		{"ipv6 vip and wildcard address", kube("v6.default.svc.cluster.local", discoveryv1.Resolution_STATIC, "fd00::1", "0.0.0.0"),
			[]string{"v6.default.svc.cluster.local", "v6.default.svc.cluster.local.", "v6", "v6.default.svc", "v6.default", "[fd00::1]"}},
		{"service entry without resolution is not headless",
			&discoveryv1.Service{Hostname: "api.example.com", Registry: "serviceentry", Resolution: discoveryv1.Resolution_NONE},
			[]string{"api.example.com", "api.example.com."}},
		{"ip host has no absolute form", &discoveryv1.Service{Hostname: "10.1.2.3", Registry: "serviceentry"},
			[]string{"10.1.2.3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Domains(tc.svc, "default.svc.cluster.local"); !slices.Equal(got, tc.want) {
				t.Errorf("Domains = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestWithPort(t *testing.T) {
	got := WithPort([]string{"a", "[fd00::1]"}, 80)
	if want := []string{"a", "a:80", "[fd00::1]", "[fd00::1]:80"}; !slices.Equal(got, want) {
		t.Errorf("WithPort = %q, want %q", got, want)
	}
}
