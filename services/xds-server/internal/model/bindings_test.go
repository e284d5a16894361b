package model

import (
	"testing"
	"time"

	networking "istio.io/api/networking/v1alpha3"
)

func TestBindingsDestinationRule(t *testing.T) {
	const host = "a.ns.svc.cluster.local"
	dr := func(ns, name, h string, age int) Config[*networking.DestinationRule] {
		return Config[*networking.DestinationRule]{Namespace: ns, Name: name,
			CreateTime: time.Unix(int64(age), 0), Spec: &networking.DestinationRule{Host: h}}
	}
	snap := &Snapshot{DestinationRules: []Config[*networking.DestinationRule]{
		dr("other", "wild", "*.svc.cluster.local", 1),
		dr("other", "old", host, 2),
		dr("mine", "new", host, 3),
	}}
	rank := func(ns, _ string) int {
		if ns == "mine" {
			return 0
		}
		return 1
	}
	tests := []struct {
		name string
		b    *Bindings
		host string
		want string
	}{
		{"proxyless: exact, then oldest", snap.Bindings(nil, nil), host, "old"},
		{"ranked namespace wins", snap.Bindings(nil, rank), host, "new"},
		{"invisible rule skipped", snap.Bindings(func(ns string, _ []string) bool { return ns != "mine" }, rank), host, "old"},
		{"wildcard when no exact", snap.Bindings(nil, rank), "b.ns.svc.cluster.local", "wild"},
		{"no match", snap.Bindings(nil, nil), "example.com", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := ""
			if dr := tc.b.DestinationRule(tc.host); dr != nil {
				got = dr.Name
			}
			if got != tc.want {
				t.Errorf("DestinationRule(%s) = %q, want %q", tc.host, got, tc.want)
			}
		})
	}
}
