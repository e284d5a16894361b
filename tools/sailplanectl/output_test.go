package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestWriteOutput(t *testing.T) {
	tab := table{header: []string{"NAME", "STATUS"}}
	tab.add("a", "SYNCED")
	tab.add("longer-name", "STALE")
	data := []map[string]string{{"name": "a", "status": "SYNCED"}, {"name": "longer-name", "status": "STALE"}}
	for _, tc := range []struct{ format, want string }{
		{formatTable, "NAME         STATUS\na            SYNCED\nlonger-name  STALE\n"},
		{formatJSON, "[\n  {\n    \"name\": \"a\",\n    \"status\": \"SYNCED\"\n  },\n  {\n    \"name\": \"longer-name\",\n    \"status\": \"STALE\"\n  }\n]\n"},
		{formatYAML, "- name: a\n  status: SYNCED\n- name: longer-name\n  status: STALE\n"},
	} {
		var b bytes.Buffer
		if err := writeOutput(&b, tc.format, tab, data); err != nil {
			t.Fatalf("%s: %v", tc.format, err)
		}
		if b.String() != tc.want {
			t.Errorf("%s:\n%s\nwant:\n%s", tc.format, b.String(), tc.want)
		}
	}
	if err := writeOutput(&bytes.Buffer{}, "xml", tab, data); err == nil || !strings.Contains(err.Error(), "table, yaml, json") {
		t.Errorf("unknown format: err = %v", err)
	}
}
