package xdstype

import "testing"

func TestNames(t *testing.T) {
	for _, tc := range []struct{ url, short, label string }{
		{"type.googleapis.com/envoy.config.cluster.v3.Cluster", "CDS", "cds"},
		{"type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment", "EDS", "eds"},
		{"type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret", "SDS", "sds"},
		{NameTable, "NDS", "nds"},
		{"istio.io/debug/syncz", "syncz", "istio.io/debug/syncz"},
		{"type.googleapis.com/envoy.service.runtime.v3.Runtime", "Runtime", "type.googleapis.com/envoy.service.runtime.v3.Runtime"},
	} {
		if got := Short(tc.url); got != tc.short {
			t.Errorf("Short(%q) = %q, want %q", tc.url, got, tc.short)
		}
		if got := MetricLabel(tc.url); got != tc.label {
			t.Errorf("MetricLabel(%q) = %q, want %q", tc.url, got, tc.label)
		}
	}
}
