package xds

import (
	"slices"
	"testing"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// TestSubscriptionInterning: equal name sets are one shared subscription, whatever the path to them;
// changes derive new ones and leave the old untouched.
func TestSubscriptionInterning(t *testing.T) {
	subs := newSubscriptions()
	eds := resourcev3.EndpointType
	a := subs.derive(emptySubscription, eds, []string{"outbound|80||b", "outbound|80||a", "outbound|81||a"}, nil)
	b := subs.derive(emptySubscription, eds, []string{"outbound|81||a", "outbound|80||a", "outbound|80||b", "outbound|80||a"}, nil)
	if a != b {
		t.Fatal("equal subscriptions are not shared")
	}
	if !slices.Equal(a.sorted, []string{"outbound|80||a", "outbound|80||b", "outbound|81||a"}) || a.hosts["a"] != 2 || a.hosts["b"] != 1 {
		t.Fatalf("subscription %v, hosts %v", a.sorted, a.hosts)
	}
	c := subs.derive(a, eds, []string{"outbound|80||c"}, []string{"outbound|80||b"})
	if c == a || c.has("outbound|80||b") || !c.has("outbound|80||c") || c.hosts["b"] != 0 || !a.has("outbound|80||b") {
		t.Fatalf("derived %v from %v", c.sorted, a.sorted)
	}
	if subs.derive(a, eds, []string{"outbound|80||a"}, []string{"missing"}) != a {
		t.Error("a no-op change made a new subscription")
	}
	if subs.derive(c, eds, nil, c.sorted) != emptySubscription {
		t.Error("removing everything did not give the empty subscription")
	}
	// The same names for another type are another subscription: hosts are for endpoints only.
	if cds := subs.derive(emptySubscription, resourcev3.ClusterType, a.sorted, nil); cds == a || len(cds.hosts) != 0 {
		t.Error("a cluster subscription shares an endpoint subscription")
	}
	if again := subs.derive(emptySubscription, eds, a.sorted, nil); again != a || again.hosts["a"] != 2 {
		t.Error("an endpoint subscription was not shared after a cluster one with the same names")
	}
	// Removed and added back in one change: still subscribed.
	if d := subs.derive(a, eds, []string{"outbound|80||b"}, []string{"outbound|80||b"}); !d.has("outbound|80||b") {
		t.Error("name removed and re-added is gone")
	}
}
