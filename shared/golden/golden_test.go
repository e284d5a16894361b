package golden

import (
	"os"
	"path/filepath"
	"testing"
)

func TestCompareAndUpdate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "golden.yaml")
	t.Setenv("UPDATE_GOLDEN", "1")
	Compare(t, path, []byte("a: 1\n"))
	if b, err := os.ReadFile(path); err != nil || string(b) != "a: 1\n" {
		t.Fatalf("UPDATE_GOLDEN did not write the file: %q, %v", b, err)
	}
	t.Setenv("UPDATE_GOLDEN", "")
	Compare(t, path, []byte("a: 1\n")) // equal: passes

	ft := &fakeT{TB: t}
	Compare(ft, path, []byte("a: 2\n"))
	if !ft.failed {
		t.Error("a differing output did not fail")
	}
}

// fakeT records a failure instead of failing the real test.
type fakeT struct {
	testing.TB
	failed bool
}

func (f *fakeT) Errorf(string, ...any) { f.failed = true }
func (f *fakeT) Helper()               {}
