package configingest_test

import (
	"strings"
	"testing"
)

// TestProblemsMetric: each kind of broken file shows in sailplane_config_problems under its
// resource kind and reason, and goes once the file is fixed.
func TestProblemsMetric(t *testing.T) {
	good := vsDoc("reviews", "reviews", 100)
	e := start(t, func(e *env) { e.write("a.yaml", good) })
	const problems = "sailplane_config_problems"
	if _, ok := e.metrics.Scrape().Value(problems); ok {
		t.Fatalf("problems reported for good config: %v", e.svc.Problems())
	}
	for _, tc := range []struct {
		name, file, content string
		kind, reason        string
	}{
		{name: "invalid field", file: "a.yaml", content: vsDoc("reviews", "reviews", -150), kind: "VirtualService", reason: "invalid"},
		{name: "unknown field", file: "a.yaml", content: strings.Replace(good, "destination:", "destinaton:", 1), kind: "VirtualService", reason: "schema"},
		{name: "malformed YAML", file: "a.yaml", content: good + "---\nkind: DestinationRule\nmetadata: [oops\n", reason: "malformed"},
		{name: "duplicate", file: "b.yaml", content: good, kind: "VirtualService", reason: "duplicate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.write(tc.file, tc.content)
			e.metrics.WaitValue(1, problems, "kind", tc.kind, "reason", tc.reason)
			if tc.file == "a.yaml" {
				e.write("a.yaml", good)
			} else {
				e.write(tc.file, "# emptied\n")
			}
			eventually(t, "the problem gone from the metric", func() bool {
				_, ok := e.metrics.Scrape().Value(problems)
				return !ok
			})
		})
	}
}
