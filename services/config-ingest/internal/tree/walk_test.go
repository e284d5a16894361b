package tree

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"sailplane.dev/shared/schema"
)

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// resolved resolves symlinks in p (t.TempDir may itself sit behind one).
func resolved(t *testing.T, p string) string {
	t.Helper()
	r, err := filepath.EvalSymlinks(p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Symlinks are followed, and what cannot be followed is logged once: folder links are read,
// a linked file's target folder is watched, dangling links keep what they held, loops are
// skipped.
func TestSymlinks(t *testing.T) {
	conf, outside := t.TempDir(), t.TempDir()
	put(t, filepath.Join(outside, "shared.yaml"), gwHostDoc("shared", "a.example.com"))
	put(t, filepath.Join(outside, "team", "t.yaml"), gwDoc("team"))
	put(t, filepath.Join(conf, "local.yaml"), gwDoc("local"))
	symlink(t, filepath.Join(outside, "shared.yaml"), filepath.Join(conf, "shared.yaml"))
	symlink(t, filepath.Join(outside, "team"), filepath.Join(conf, "team"))
	symlink(t, conf, filepath.Join(conf, "loop"))
	symlink(t, filepath.Join(outside, "nowhere.yaml"), filepath.Join(conf, "dangling.yaml"))
	tr, _, logs := newTree(t)
	for range 2 {
		tr.Scan([]string{conf})
	}
	if got := names(tr, schema.Gateway.TypeURL); !slices.Equal(got, []string{"default/local", "default/shared", "default/team"}) {
		t.Fatalf("published %v", got)
	}
	// The linked file's folder and the linked folder are watched: their edits bring events.
	dirs := tr.Dirs()
	for _, d := range []string{resolved(t, outside), resolved(t, filepath.Join(outside, "team"))} {
		if !slices.Contains(dirs, d) {
			t.Errorf("Dirs() = %v, missing %s", dirs, d)
		}
	}
	if n := logs.count("config folder skipped", filepath.Join(conf, "loop"), "symlink loop"); n != 1 {
		t.Errorf("the loop was logged %d times over two scans, want once", n)
	}
	if n := logs.count("config symlink cannot be followed", "dangling.yaml"); n != 1 {
		t.Errorf("the dangling link was logged %d times over two scans, want once", n)
	}
	if !hasProblem(tr, "dangling.yaml", "cannot be read") {
		t.Errorf("problems = %v, want the dangling link", tr.Problems())
	}

	// The target outside changes: seen through the link.
	put(t, filepath.Join(outside, "shared.yaml"), gwHostDoc("shared", "b.example.com"))
	if ch := tr.Scan([]string{conf}); len(ch) != 1 || len(ch[0].Upsert) != 1 || ch[0].Upsert[0].Name != "default/shared" {
		t.Fatalf("changed target: changes = %+v", ch)
	}
	// The target goes away (an unmounted volume): the link dangles, what it held stays.
	if err := os.Remove(filepath.Join(outside, "shared.yaml")); err != nil {
		t.Fatal(err)
	}
	if ch := tr.Scan([]string{conf}); len(ch) != 0 {
		t.Fatalf("dangling link dropped what it held: %+v", ch)
	}
	// The link itself is removed: now it is gone.
	if err := os.Remove(filepath.Join(conf, "shared.yaml")); err != nil {
		t.Fatal(err)
	}
	if ch := tr.Scan([]string{conf}); len(ch) != 1 || len(ch[0].Delete) != 1 || ch[0].Delete[0] != "default/shared" {
		t.Fatalf("removed link: changes = %+v", ch)
	}
}

// A Kubernetes ConfigMap volume: every key is a link into "..data", itself a link to a
// timestamped folder swapped on update; keys with a folder in their path make folder links.
func TestConfigMapVolume(t *testing.T) {
	conf := t.TempDir()
	version := func(name, host string) {
		put(t, filepath.Join(conf, name, "vs.yaml"), gwHostDoc("top", host))
		put(t, filepath.Join(conf, name, "team", "t.yaml"), gwHostDoc("team", host))
		symlink(t, name, filepath.Join(conf, "..data_tmp"))
		if err := os.Rename(filepath.Join(conf, "..data_tmp"), filepath.Join(conf, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	version("..2026_01", "a.example.com")
	symlink(t, "..data/vs.yaml", filepath.Join(conf, "vs.yaml"))
	symlink(t, "..data/team", filepath.Join(conf, "team"))
	tr, _, _ := newTree(t)
	tr.Scan([]string{conf})
	if got := names(tr, schema.Gateway.TypeURL); !slices.Equal(got, []string{"default/team", "default/top"}) {
		t.Fatalf("published %v, problems %v", got, tr.Problems())
	}
	if !slices.Contains(tr.Dirs(), resolved(t, filepath.Join(conf, "..2026_01", "team"))) {
		t.Fatalf("Dirs() = %v", tr.Dirs())
	}

	version("..2026_02", "b.example.com")
	if err := os.RemoveAll(filepath.Join(conf, "..2026_01")); err != nil {
		t.Fatal(err)
	}
	ch := tr.Scan([]string{conf})
	if len(ch) != 1 || len(ch[0].Upsert) != 2 || len(ch[0].Delete) != 0 {
		t.Fatalf("ConfigMap update: changes = %+v", ch)
	}
	if !slices.Contains(tr.Dirs(), resolved(t, filepath.Join(conf, "..2026_02", "team"))) {
		t.Fatalf("Dirs() = %v, want the new version's folder watched", tr.Dirs())
	}
	if len(tr.Problems()) != 0 {
		t.Fatalf("problems = %v", tr.Problems())
	}
}

// Config sources switched to a folder that cannot be read, or to a source that cannot be read
// at all: what the previous folders published stays until the new sources can be read.
func TestSourceSwitch(t *testing.T) {
	base := t.TempDir()
	old, typo := filepath.Join(base, "conf"), filepath.Join(base, "typo")
	put(t, filepath.Join(old, "a.yaml"), gwDoc("old"))
	tr, _, logs := newTree(t)
	tr.Scan([]string{old})

	for range 2 {
		if ch := tr.Scan([]string{typo}); len(ch) != 0 {
			t.Fatalf("switch to a missing folder: changes = %+v", ch)
		}
	}
	if !hasProblem(tr, typo, "no such file") {
		t.Fatalf("problems = %v", tr.Problems())
	}
	if n := logs.count("cannot read config folder", typo); n != 1 {
		t.Fatalf("the missing folder was logged %d times over two scans, want once", n)
	}
	unsupported := errors.New("config sources k8s://: not supported yet")
	if ch := tr.Scan(nil, unsupported); len(ch) != 0 {
		t.Fatalf("switch to an unsupported source: changes = %+v", ch)
	}
	if n := logs.count("config source cannot be read", "k8s://"); n != 1 {
		t.Fatalf("unsupported source logged %d times, want once", n)
	}

	// The folder appears: the switch completes.
	put(t, filepath.Join(typo, "b.yaml"), gwDoc("new"))
	ch := tr.Scan([]string{typo})
	if len(ch) != 1 || len(ch[0].Upsert) != 1 || ch[0].Upsert[0].Name != "default/new" || len(ch[0].Delete) != 1 || ch[0].Delete[0] != "default/old" {
		t.Fatalf("completed switch: changes = %+v", ch)
	}
	if len(tr.Problems()) != 0 {
		t.Fatalf("problems = %v", tr.Problems())
	}
}
