package envoygen

import (
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	"sailplane.dev/services/xds-server/internal/model"
)

// TestSetDNS: DNS clusters resolve as istiod's do: the mesh's dnsRefreshRate (60s when unset or
// unusable), the records' TTL, 100ms jitter, c-ares, and IPv6 lookups for IPv6-only proxies.
func TestSetDNS(t *testing.T) {
	for _, tc := range []struct {
		name   string
		rate   *durationpb.Duration
		ips    []string
		want   time.Duration
		family clusterv3.Cluster_DnsLookupFamily
	}{
		{name: "mesh default", ips: []string{"198.18.0.1"}, want: time.Minute, family: clusterv3.Cluster_V4_ONLY},
		{name: "mesh rate", rate: durationpb.New(7 * time.Second), ips: []string{"198.18.0.1"}, want: 7 * time.Second,
			family: clusterv3.Cluster_V4_ONLY},
		{name: "rate Envoy refuses", rate: durationpb.New(time.Millisecond), want: time.Minute, family: clusterv3.Cluster_V4_ONLY},
		{name: "IPv6 only", ips: []string{"fd00::1", "2001:db8::1"}, want: time.Minute, family: clusterv3.Cluster_V6_ONLY},
		{name: "dual stack", ips: []string{"fd00::1", "198.18.0.1"}, want: time.Minute, family: clusterv3.Cluster_V4_ONLY},
		{name: "IPv4-mapped", ips: []string{"::ffff:198.18.0.1"}, want: time.Minute, family: clusterv3.Cluster_V4_ONLY},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &builder{snap: &model.Snapshot{Mesh: &meshv1alpha1.MeshConfig{DnsRefreshRate: tc.rate}},
				proxy: &model.Proxy{IPs: tc.ips}}
			c := &clusterv3.Cluster{}
			b.setDNS(c)
			if got := c.GetDnsRefreshRate().AsDuration(); got != tc.want { //nolint:staticcheck // as istiod
				t.Errorf("dns_refresh_rate = %v, want %v", got, tc.want)
			}
			if c.GetDnsLookupFamily() != tc.family {
				t.Errorf("dns_lookup_family = %v, want %v", c.GetDnsLookupFamily(), tc.family)
			}
			if !c.GetRespectDnsTtl() || c.GetDnsJitter().AsDuration() != 100*time.Millisecond { //nolint:staticcheck // as istiod
				t.Errorf("respect_dns_ttl %v, dns_jitter %v; want true, 100ms", c.GetRespectDnsTtl(), c.GetDnsJitter()) //nolint:staticcheck // as istiod
			}
			if c.GetTypedDnsResolverConfig().GetName() != "envoy.network.dns_resolver.cares" {
				t.Errorf("resolver %v, want c-ares", c.GetTypedDnsResolverConfig())
			}
		})
	}
}
