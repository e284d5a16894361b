// Package golden compares test output with golden files, the convention of Sailplane's
// translation tests: testdata/<case>/input.yaml → golden.yaml, refreshed with UPDATE_GOLDEN=1.
package golden

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// Update reports whether golden files are being refreshed (UPDATE_GOLDEN set).
func Update() bool { return os.Getenv("UPDATE_GOLDEN") != "" }

// Compare fails t when got differs from the file at path; with UPDATE_GOLDEN set it writes got
// to path instead.
func Compare(t testing.TB, path string, got []byte) {
	t.Helper()
	if Update() {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with UPDATE_GOLDEN=1 to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the output (UPDATE_GOLDEN=1 refreshes it); got:\n%s", path, got)
	}
}

// Cases lists the case folders under dir (usually "testdata"): those holding an input.yaml, sorted.
func Cases(t testing.TB, dir string) []string {
	t.Helper()
	inputs, err := filepath.Glob(filepath.Join(dir, "*", "input.yaml"))
	if err != nil || len(inputs) == 0 {
		t.Fatalf("no golden cases under %s: %v", dir, err)
	}
	for i, in := range inputs {
		inputs[i] = filepath.Dir(in)
	}
	return inputs
}
