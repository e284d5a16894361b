package xdsdiff

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"

	"sailplane.dev/shared/golden"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestGolden compares testdata/<case>/istiod.json with ours.json and checks the report against
// golden.txt. Each file holds resources in protojson ("@type" naming the type): a list, or lists
// by type URL as the differential e2e test dumps them (SAILPLANE_DIFF_DUMP), so that a case it
// fails on can be kept here.
func TestGolden(t *testing.T) {
	cases, err := filepath.Glob(filepath.Join("testdata", "*", "istiod.json"))
	if err != nil || len(cases) == 0 {
		t.Fatalf("no golden cases: %v", err)
	}
	for _, c := range cases {
		dir := filepath.Dir(c)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			diffs, stats, err := Compare(readSnapshot(t, c), readSnapshot(t, filepath.Join(dir, "ours.json")))
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			fmt.Fprintf(&b, "%d differences; compared %d resources, %d properties\n", len(diffs), stats.Resources, stats.Properties)
			for _, d := range diffs {
				d.Case = filepath.Base(dir)
				b.WriteString("\n" + d.String())
			}
			golden.Compare(t, filepath.Join(dir, "golden.txt"), []byte(b.String()))
		})
	}
}

func readSnapshot(t *testing.T, path string) Snapshot {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var raws []json.RawMessage
	if err := json.Unmarshal(data, &raws); err != nil {
		var byType map[string][]json.RawMessage
		if err := json.Unmarshal(data, &byType); err != nil {
			t.Fatalf("%s: neither a list of resources nor lists by type URL: %v", path, err)
		}
		for _, url := range slices.Sorted(maps.Keys(byType)) {
			raws = append(raws, byType[url]...)
		}
	}
	s := Snapshot{}
	for i, r := range raws {
		a := &anypb.Any{}
		if err := protojson.Unmarshal(r, a); err != nil {
			t.Fatalf("%s: resource %d: %v", path, i, err)
		}
		s[a.TypeUrl] = append(s[a.TypeUrl], a)
	}
	return s
}
