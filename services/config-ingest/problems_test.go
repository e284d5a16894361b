package configingest_test

import (
	"strings"
	"testing"
)

// TestProblemsMetric: each kind of broken file shows in sailplane_config_problems under its
// resource kind and reason, and drops to 0 once the file is fixed.
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
			// Cleared, the series stays at 0 (an alert on it resolves) and no other appears.
			e.metrics.WaitValue(0, problems, "kind", tc.kind, "reason", tc.reason)
			eventually(t, "every problem series at 0", func() bool {
				total, ok := e.metrics.Scrape().Value(problems)
				return ok && total == 0
			})
			if _, ok := e.metrics.Scrape().Value(problems, "kind", tc.kind, "reason", tc.reason); !ok {
				t.Errorf("%s{kind=%q, reason=%q} vanished once cleared, want 0", problems, tc.kind, tc.reason)
			}
		})
	}
}
