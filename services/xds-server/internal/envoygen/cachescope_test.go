package envoygen

import (
	"bytes"
	"fmt"
	"maps"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/shared/golden"
)

// TestCacheScope checks CacheScope's contract on every golden case: proxies with equal scopes
// get byte-identical resources, and proxies that differ only in what the output does not read
// (pod name, IPs serving nothing, unselected labels) share a scope.
func TestCacheScope(t *testing.T) {
	types := []string{resourcev3.ClusterType, resourcev3.EndpointType, resourcev3.ListenerType, resourcev3.RouteType}
	for _, dir := range golden.Cases(t, "testdata") {
		t.Run(dir, func(t *testing.T) {
			tc := load(t, dir)
			g := New(nil, WithAutoAddresses(model.NewAllocator()))
			var proxies []*model.Proxy
			namespaces := map[string]bool{}
			for _, np := range tc.proxies {
				namespaces[np.proxy.Namespace] = true
			}
			for i, np := range tc.proxies {
				p := np.proxy
				proxies = append(proxies, p)
				other := clone(p)
				other.NodeID, other.ID = p.NodeID+"-replica", p.ID+"-replica"
				proxies = append(proxies, other)
				// Same scope: only the pod differs.
				for _, typeURL := range types {
					if a, b := g.CacheScope(tc.snap, p, typeURL), g.CacheScope(tc.snap, other, typeURL); a != b {
						t.Errorf("%s: replica of proxy %d has scope %q, want %q", typeURL, i, b, a)
					}
				}
				v := clone(p)
				v.IPs = []string{"198.51.100.7"}
				proxies = append(proxies, v)
				// IPv6-only: DNS clusters look up AAAA records.
				v = clone(p)
				v.IPs = []string{"2001:db8::7"}
				proxies = append(proxies, v)
				v = clone(p)
				v.Labels["unrelated"] = "x"
				proxies = append(proxies, v)
				v = clone(p)
				v.Labels = map[string]string{}
				proxies = append(proxies, v)
				v = clone(p)
				v.NodeLocality = &discoveryv1.Locality{Region: "elsewhere"}
				proxies = append(proxies, v)
				// DNS captured, or not: auto-allocated addresses in listeners and domains.
				v = clone(p)
				v.DNSCapture = !p.DNSCapture
				proxies = append(proxies, v)
				v = clone(v)
				v.IPs = []string{"2001:db8::7"}
				proxies = append(proxies, v)
				// The same workload at each endpoint address: replicas of one service.
				for _, addr := range endpointAddresses(tc.snap) {
					v = clone(p)
					v.IPs = []string{addr}
					proxies = append(proxies, v)
				}
				for ns := range namespaces {
					v = clone(p)
					v.Namespace = ns
					proxies = append(proxies, v)
				}
			}
			for _, typeURL := range types {
				seen := map[string][]byte{}
				who := map[string]string{}
				for _, p := range proxies {
					res, err := g.Generate(tc.snap, p, typeURL, nil)
					if err != nil {
						t.Fatal(err)
					}
					var buf bytes.Buffer
					for _, r := range res {
						b, err := proto.MarshalOptions{Deterministic: true}.Marshal(r)
						if err != nil {
							t.Fatal(err)
						}
						fmt.Fprintf(&buf, "%d:", len(b))
						buf.Write(b)
					}
					scope := g.CacheScope(tc.snap, p, typeURL)
					if prev, ok := seen[scope]; ok && !bytes.Equal(prev, buf.Bytes()) {
						t.Errorf("%s: scope %q: %s and %s get different resources", typeURL, scope, who[scope], describe(p))
					} else if !ok {
						seen[scope], who[scope] = buf.Bytes(), describe(p)
					}
				}
			}
		})
	}
}

func endpointAddresses(snap *model.Snapshot) []string {
	seen := map[string]bool{}
	var out []string
	for _, h := range snap.Hostnames() {
		for _, ep := range snap.Services[h].Endpoints {
			if a := ep.GetAddress(); !seen[a] {
				seen[a] = true
				out = append(out, a)
			}
		}
	}
	return out
}

func clone(p *model.Proxy) *model.Proxy {
	c := *p
	c.Labels = maps.Clone(p.Labels)
	if c.Labels == nil {
		c.Labels = map[string]string{}
	}
	return &c
}

func describe(p *model.Proxy) string {
	return fmt.Sprintf("%s ns=%s ips=%v labels=%v", p.NodeID, p.Namespace, p.IPs, p.Labels)
}

// TestCacheScopeSharedByServices: the workloads of different services that serve the same
// ports read nothing of their service but its DestinationRule, so they share one cluster and
// listener scope (one generation for a mesh of many small services, as in Istio's load test)
// unless different rules apply to them.
func TestCacheScopeSharedByServices(t *testing.T) {
	// Services a and b, one HTTP port each, with one workload at 10.0.0.1 and 10.0.0.2.
	var services string
	for i, name := range []string{"a", "b"} {
		services += fmt.Sprintf(`
apiVersion: sailplane.dev/v1
kind: Service
spec:
  hostname: %[1]s.load.svc.cluster.local
  namespace: load
  ports: [{name: http, number: 8080, protocol: HTTP}]
---
apiVersion: sailplane.dev/v1
kind: Endpoints
spec:
  hostname: %[1]s.load.svc.cluster.local
  namespace: load
  endpoints: [{address: 10.0.0.%[2]d}]
---
`, name, i+1)
	}
	const poolOnA = `
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: a, namespace: load}
spec:
  host: a
  trafficPolicy: {connectionPool: {tcp: {maxConnections: 7}}}
`
	const poolOnAll = `
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: all, namespace: load}
spec:
  host: "*.load.svc.cluster.local"
  trafficPolicy: {connectionPool: {tcp: {maxConnections: 7}}}
`
	cases := []struct {
		name  string
		rules string
		share bool
	}{
		{"no DestinationRule", "", true},
		{"one rule for both", poolOnAll, true},
		{"a rule for one", poolOnA, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			snap := snapshotOf(t, services+c.rules)
			g := New(nil)
			a := &model.Proxy{Type: model.SidecarProxy, Namespace: "load", IPs: []string{"10.0.0.1"}, Labels: map[string]string{}}
			b := clone(a)
			b.IPs = []string{"10.0.0.2"}
			for _, typeURL := range []string{resourcev3.ClusterType, resourcev3.ListenerType} {
				sa, sb := g.CacheScope(snap, a, typeURL), g.CacheScope(snap, b, typeURL)
				if (sa == sb) != c.share {
					t.Errorf("%s: scopes %q and %q, want shared = %v", typeURL, sa, sb, c.share)
				}
				ra, err := g.Generate(snap, a, typeURL, nil)
				if err != nil {
					t.Fatal(err)
				}
				rb, err := g.Generate(snap, b, typeURL, nil)
				if err != nil {
					t.Fatal(err)
				}
				// Shared scopes must mean equal output; the rule on one service must change its
				// inbound cluster, or the case proves nothing.
				same := equalResources(ra, rb)
				if c.share && !same || !c.share && typeURL == resourcev3.ClusterType && same {
					t.Errorf("%s: outputs equal = %v, want %v", typeURL, same, c.share)
				}
			}
		})
	}
}

func equalResources(a, b []types.Resource) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !proto.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}
