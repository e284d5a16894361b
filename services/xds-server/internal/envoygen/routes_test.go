package envoygen

import (
	"slices"
	"testing"
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
		if got := altHosts(tc.host, tc.proxyDomain); !slices.Equal(got, tc.want) {
			t.Errorf("altHosts(%q, %q) = %q, want %q", tc.host, tc.proxyDomain, got, tc.want)
		}
	}
}
