package tree

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"sailplane.dev/shared/schema"
)

// A file written in place by a writer that pauses halfway is read while it holds only its
// first part: valid YAML, with fewer resources. Nothing it held may be deleted or replaced
// until it stays that way for the settle window.
func TestShrunkFileSettles(t *testing.T) {
	dir := t.TempDir()
	tr, clk, _ := newTree(t)
	p := filepath.Join(dir, "gw.yaml")
	full := gwHostDoc("one", "a.example.com") + "---\n" + gwHostDoc("two", "b.example.com")
	put(t, p, full)
	tr.Scan([]string{dir})

	// Halfway: the first document changed, the second is not written yet.
	put(t, p, gwHostDoc("one", "new.example.com"))
	if ch := tr.Scan([]string{dir}); len(ch) != 0 {
		t.Fatalf("half-written file published: %+v", ch)
	}
	if pr := tr.Problems(); len(pr) != 1 || !errors.Is(pr[0], ErrSettling) {
		t.Fatalf("problems = %v, want ErrSettling", pr)
	}
	if at := tr.SettleAt(); !at.Equal(clk.Now().Add(DefaultSettle)) {
		t.Fatalf("SettleAt = %v, want now + %v", at, DefaultSettle)
	}
	// Other files are not held back meanwhile.
	put(t, filepath.Join(dir, "other.yaml"), gwDoc("three"))
	if ch := tr.Scan([]string{dir}); len(ch) != 1 || len(ch[0].Upsert) != 1 || ch[0].Upsert[0].Name != "default/three" {
		t.Fatalf("other file: changes = %+v", ch)
	}

	// The writer finishes within the window: published as one update, nothing deleted.
	clk.Advance(DefaultSettle / 2)
	full = gwHostDoc("one", "new.example.com") + "---\n" + gwHostDoc("two", "b.example.com")
	put(t, p, full)
	ch := tr.Scan([]string{dir})
	if len(ch) != 1 || len(ch[0].Upsert) != 1 || ch[0].Upsert[0].Name != "default/one" || len(ch[0].Delete) != 0 {
		t.Fatalf("completed write: changes = %+v", ch)
	}
	if len(tr.Problems()) != 0 || !tr.SettleAt().IsZero() {
		t.Fatalf("after the write: problems %v, SettleAt %v", tr.Problems(), tr.SettleAt())
	}

	// A removal meant as one: applied when the file is re-read after the window.
	put(t, p, gwHostDoc("one", "new.example.com"))
	tr.Scan([]string{dir})
	clk.Advance(DefaultSettle - 1)
	if ch := tr.Scan([]string{dir}); len(ch) != 0 {
		t.Fatalf("applied before the window ended: %+v", ch)
	}
	clk.Advance(1)
	ch = tr.Scan([]string{dir})
	if len(ch) != 1 || len(ch[0].Delete) != 1 || ch[0].Delete[0] != "default/two" {
		t.Fatalf("settled removal: changes = %+v", ch)
	}
	if got := names(tr, schema.Gateway.TypeURL); len(got) != 2 {
		t.Fatalf("published %v, want one and three", got)
	}
}

// A file replaced by a rename was written whole: what it no longer defines goes at once.
func TestReplacedFileAppliesAtOnce(t *testing.T) {
	dir := t.TempDir()
	tr, _, _ := newTree(t)
	p := filepath.Join(dir, "gw.yaml")
	put(t, p, gwDoc("one")+"---\n"+gwDoc("two"))
	tr.Scan([]string{dir})

	tmp := filepath.Join(dir, ".gw.yaml.tmp")
	put(t, tmp, gwDoc("one"))
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
	ch := tr.Scan([]string{dir})
	if len(ch) != 1 || len(ch[0].Delete) != 1 || ch[0].Delete[0] != "default/two" {
		t.Fatalf("replaced file: changes = %+v, problems %v", ch, tr.Problems())
	}
}

// A file written in place on a full filesystem is cut short for good (the write failed): what
// it held stays published past the settle window while the filesystem has no room, and its
// new content applies once there is room again (found by e2e's TestFaults, full filesystem).
func TestShrunkFileOnFullDiskHeld(t *testing.T) {
	dir := t.TempDir()
	c := &clock{now: time.Unix(1e9, 0)}
	l := &logs{t: t}
	full := true
	tr := New("default", slog.New(slog.NewTextHandler(l, nil)), WithClock(c.Now), WithDiskFull(func(string) bool { return full }))
	p := filepath.Join(dir, "gw.yaml")
	put(t, p, gwDoc("one")+"---\n"+gwDoc("two"))
	tr.Scan([]string{dir})

	// What fit before the space ran out: a comment, valid YAML defining nothing.
	put(t, p, "# the start of a long comment\n")
	for range 3 {
		if ch := tr.Scan([]string{dir}); len(ch) != 0 {
			t.Fatalf("half-written file on a full disk published: %+v", ch)
		}
		c.Advance(DefaultSettle)
	}
	if ch := tr.Scan([]string{dir}); len(ch) != 0 {
		t.Fatalf("half-written file on a full disk published: %+v", ch)
	}
	if pr := tr.Problems(); len(pr) != 1 || !errors.Is(pr[0], ErrDiskFull) {
		t.Fatalf("problems = %v, want ErrDiskFull", pr)
	}
	if at := tr.SettleAt(); !at.Equal(c.Now().Add(DefaultSettle)) {
		t.Fatalf("SettleAt = %v, want now + %v: re-checked until there is room", at, DefaultSettle)
	}

	// Room again, and the file saved whole, in place: it settles as any in-place write.
	full = false
	put(t, p, gwDoc("one"))
	if ch := tr.Scan([]string{dir}); len(ch) != 0 {
		t.Fatalf("saved again in place: published before the settle window: %+v", ch)
	}
	c.Advance(DefaultSettle)
	ch := tr.Scan([]string{dir})
	if len(ch) != 1 || len(ch[0].Delete) != 1 || ch[0].Delete[0] != "default/two" {
		t.Fatalf("saved again with room: changes = %+v, problems %v", ch, tr.Problems())
	}
}
