package xds

import "testing"

// TestVersionOf pins state-of-the-world versions: equal content has an equal version on every
// replica, of this release or the one before, and a name's end cannot pass for its version's
// start.
func TestVersionOf(t *testing.T) {
	for _, tc := range []struct {
		entries []*entry
		want    string
	}{
		{[]*entry{{name: "a", version: "1"}}, "42992a067359e6cc"},
		{[]*entry{{name: "ab", version: "c"}}, "88598a7678be5691"},
		{[]*entry{{name: "a", version: "bc"}}, "57cb980e41933ae6"},
		{[]*entry{{name: "outbound|80||reviews.default.svc.cluster.local", version: "0123456789abcdef"}, {name: "x", version: "y"}}, "521ab1373c31a3f0"},
	} {
		if got := versionOf(tc.entries); got != tc.want {
			t.Errorf("versionOf(%s/%s, …) = %s, want %s", tc.entries[0].name, tc.entries[0].version, got, tc.want)
		}
	}
}
