package tree

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"sailplane.dev/shared/schema"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func gwDoc(name string) string {
	return gwHostDoc(name, "*")
}

func gwHostDoc(name, host string) string {
	return "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: " + name + "}\nspec:\n  servers:\n  - port: {number: 80, name: http, protocol: HTTP}\n    hosts: ['" + host + "']\n"
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

// clock is a test clock that moves only when told to.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time          { return c.now }
func (c *clock) Advance(d time.Duration) { c.now = c.now.Add(d) }

// logs keeps what a Tree logged, one line per record, and shows it in the test's log.
type logs struct {
	t     *testing.T
	lines []string
}

func (l *logs) Write(p []byte) (int, error) {
	l.lines = append(l.lines, string(p))
	l.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// count returns how many lines contain every part.
func (l *logs) count(parts ...string) int {
	n := 0
	for _, line := range l.lines {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			n++
		}
	}
	return n
}

// newTree returns a Tree on a test clock, logging into the returned logs.
func newTree(t *testing.T) (*Tree, *clock, *logs) {
	c := &clock{now: time.Unix(1e9, 0)}
	l := &logs{t: t}
	return New("default", slog.New(slog.NewTextHandler(l, nil)), WithClock(c.Now)), c, l
}

// hasProblem reports whether a current problem's message contains every part.
func hasProblem(tr *Tree, parts ...string) bool {
	for _, p := range tr.Problems() {
		ok := true
		for _, s := range parts {
			ok = ok && strings.Contains(p.Error(), s)
		}
		if ok {
			return true
		}
	}
	return false
}

// names returns the published names of a type.
func names(tr *Tree, typeURL string) []string {
	var out []string
	for _, r := range tr.State(typeURL) {
		out = append(out, r.Name)
	}
	return out
}

func TestScan(t *testing.T) {
	dir := t.TempDir()
	tr, clk, _ := newTree(t)
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
	if ch := tr.Scan([]string{dir}); len(ch) != 0 {
		t.Fatalf("a file that shrank was applied before it settled: %+v", ch)
	}
	clk.Advance(DefaultSettle)
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
	tr, clk, _ := newTree(t)
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
	tr.Scan([]string{dir})
	clk.Advance(DefaultSettle)
	ch := tr.Scan([]string{dir})
	if len(ch) != 1 || len(ch[0].Delete) != 1 || ch[0].Delete[0] != "default/one" {
		t.Fatalf("comment-only file: changes = %+v, want the Gateway deleted", ch)
	}
	if pr := tr.Problems(); len(pr) != 0 {
		t.Fatalf("problems = %v", pr)
	}
}
