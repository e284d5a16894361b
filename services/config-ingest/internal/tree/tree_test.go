package tree

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"sailplane.dev/shared/schema"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func gwDoc(name string) string {
	return "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: " + name + "}\nspec:\n  servers:\n  - port: {number: 80, name: http, protocol: HTTP}\n    hosts: ['*']\n"
}

func put(t *testing.T, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestScan(t *testing.T) {
	dir := t.TempDir()
	tr := New("default", slog.New(slog.NewTextHandler(io.Discard, nil)))
	put(t, filepath.Join(dir, "a.yaml"), gwDoc("one")+"---\n"+gwDoc("one")+"---\n"+gwDoc("two"))
	ch := tr.Scan([]string{dir})
	if len(ch) != 1 || ch[0].TypeURL != schema.Gateway.TypeURL || len(ch[0].Upsert) != 2 {
		t.Fatalf("changes = %+v", ch)
	}
	if p := tr.Problems(); len(p) != 1 || !errors.Is(p[0], ErrDuplicate) {
		t.Fatalf("problems = %v", p)
	}
	// Nothing changed: nothing to publish.
	if ch := tr.Scan([]string{dir}); len(ch) != 0 {
		t.Fatalf("unchanged scan = %+v", ch)
	}
	// A malformed document could have held any of the file's resources: they all stay.
	put(t, filepath.Join(dir, "a.yaml"), "a: [\n")
	if ch := tr.Scan([]string{dir}); len(ch) != 0 {
		t.Fatalf("malformed file changed the state: %+v", ch)
	}
	if len(tr.State(schema.Gateway.TypeURL)) != 2 {
		t.Fatal("resources lost")
	}
	// The folder vanishes: its resources stay (a remount in progress must not empty the mesh).
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if ch := tr.Scan([]string{dir}); len(ch) != 0 || len(tr.Problems()) == 0 {
		t.Fatalf("vanished folder: %+v %v", ch, tr.Problems())
	}
	put(t, filepath.Join(dir, "a.yaml"), gwDoc("two"))
	ch = tr.Scan([]string{dir})
	if len(ch) != 1 || len(ch[0].Delete) != 1 || ch[0].Delete[0] != "default/one" || len(ch[0].Upsert) != 0 {
		t.Fatalf("changes = %+v", ch)
	}
}

// An editor writing in place truncates the file first: an empty file keeps what it held (and
// says so), while a file left with only a comment really holds nothing.
func TestEmptyFileKeepsResources(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "gw.yaml")
	tr := New("default", slog.New(slog.NewTextHandler(io.Discard, nil)))
	put(t, p, gwDoc("one"))
	tr.Scan([]string{dir})

	put(t, p, "")
	if ch := tr.Scan([]string{dir}); len(ch) != 0 {
		t.Fatalf("emptied file changed the state: %+v", ch)
	}
	if pr := tr.Problems(); len(pr) != 1 || !errors.Is(pr[0], ErrEmpty) {
		t.Fatalf("problems = %v, want ErrEmpty", pr)
	}

	put(t, p, "# nothing here any more\n")
	ch := tr.Scan([]string{dir})
	if len(ch) != 1 || len(ch[0].Delete) != 1 || ch[0].Delete[0] != "default/one" {
		t.Fatalf("comment-only file: changes = %+v, want the Gateway deleted", ch)
	}
	if pr := tr.Problems(); len(pr) != 0 {
		t.Fatalf("problems = %v", pr)
	}
}
