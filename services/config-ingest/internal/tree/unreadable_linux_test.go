package tree

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"syscall"
	"testing"

	"sailplane.dev/shared/schema"
)

// nobody is the uid and gid scans run as in asUser.
const nobody = 65534

// asUser runs fn on an OS thread whose file-system identity is an ordinary user's, so that
// permissions bind as they do for a control plane that does not run as root (root reads
// through chmod 000). Linux's fsuid is per thread; the thread is discarded afterwards.
func asUser(t *testing.T, fn func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		fn()
		return
	}
	failed := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		if err := syscall.Setfsgid(nobody); err != nil {
			failed <- err
			return
		}
		if err := syscall.Setfsuid(nobody); err != nil {
			failed <- err
			return
		}
		fn()
		failed <- nil
	}()
	if err := <-failed; err != nil {
		t.Fatal(err)
	}
}

// publicTempDir is a temporary folder an ordinary user can read (t.TempDir's are root's only).
func publicTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "tree-unreadable-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// A subfolder that cannot be read is unknown, not empty: its resources stay, it is reported
// once, and it is read again as soon as it can be.
func TestUnreadableSubfolderKeepsResources(t *testing.T) {
	dir := publicTempDir(t)
	sub := filepath.Join(dir, "team")
	put(t, filepath.Join(dir, "a.yaml"), gwDoc("one"))
	put(t, filepath.Join(sub, "b.yaml"), gwHostDoc("two", "a.example.com"))
	tr, _, logs := newTree(t)
	scan := func() (ch []Change, readable bool) {
		asUser(t, func() {
			_, err := os.ReadDir(sub)
			readable = err == nil
			ch = tr.Scan([]string{dir})
		})
		return ch, readable
	}
	if _, readable := scan(); !readable {
		t.Fatal("the subfolder is not readable to begin with")
	}
	if got := names(tr, schema.Gateway.TypeURL); !slices.Equal(got, []string{"default/one", "default/two"}) {
		t.Fatalf("published %v", got)
	}

	if err := os.Chmod(sub, 0); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		ch, readable := scan()
		if readable {
			t.Fatal("chmod 000 did not make the subfolder unreadable to the scan")
		}
		if len(ch) != 0 {
			t.Fatalf("unreadable subfolder changed what is published: %+v", ch)
		}
	}
	if !hasProblem(tr, sub, "cannot be read") {
		t.Fatalf("problems = %v, want the subfolder named", tr.Problems())
	}
	var ce interface{ Unwrap() error }
	if p := tr.Problems(); len(p) != 1 || !errors.Is(p[0], ErrUnreadable) || !errors.As(p[0], &ce) {
		t.Fatalf("problems = %v, want one ErrUnreadable", p)
	}
	if n := logs.count("cannot read config folder", sub); n != 1 {
		t.Fatalf("the unreadable subfolder was logged %d times over two scans, want once", n)
	}

	// Readable again: read as before, and its edits go through.
	if err := os.Chmod(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	put(t, filepath.Join(sub, "b.yaml"), gwHostDoc("two", "b.example.com"))
	ch, _ := scan()
	if len(ch) != 1 || len(ch[0].Upsert) != 1 || ch[0].Upsert[0].Name != "default/two" || len(ch[0].Delete) != 0 {
		t.Fatalf("recovered subfolder: changes = %+v", ch)
	}
	if len(tr.Problems()) != 0 {
		t.Fatalf("problems = %v", tr.Problems())
	}
}
