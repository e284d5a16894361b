package tree

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	networking "istio.io/api/networking/v1alpha3"

	"sailplane.dev/shared/schema"
)

func vsDoc(name string, w1, w2 int) string {
	return "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: " + name + ", namespace: demo, labels: {team: a}}\n" +
		"spec:\n  hosts: [echo]\n  http:\n  - route:\n    - {destination: {host: echo, subset: v1}, weight: " + itoa(w1) + "}\n" +
		"    - {destination: {host: echo, subset: v2}, weight: " + itoa(w2) + "}\n"
}

func itoa(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}

func weights(t *testing.T, tr *Tree, name string) []int32 {
	t.Helper()
	for _, r := range tr.State(schema.VirtualService.TypeURL) {
		if r.Name == name {
			var out []int32
			for _, d := range r.Body.(*networking.VirtualService).Http[0].Route {
				out = append(out, d.Weight)
			}
			return out
		}
	}
	return nil
}

// A restart serves exactly what was served before: the saved state gives every file its last
// valid version, kept where the file became invalid, malformed, empty or unreadable meanwhile.
func TestRestoreServesWhatWasServed(t *testing.T) {
	base := t.TempDir()
	conf := filepath.Join(base, "conf")
	put(t, filepath.Join(conf, "invalid.yaml"), vsDoc("split", 80, 20))
	put(t, filepath.Join(conf, "malformed.yaml"), vsDoc("malformed", 70, 30)+"---\n"+gwDoc("gw"))
	put(t, filepath.Join(conf, "emptied.yaml"), vsDoc("emptied", 60, 40))
	put(t, filepath.Join(conf, "deleted.yaml"), vsDoc("deleted", 50, 50))
	before, _, _ := newTree(t)
	before.Scan([]string{conf})
	saved, err := before.MarshalState()
	if err != nil {
		t.Fatal(err)
	}

	// While stopped: 80/20 gets an invalid weight, another file is cut mid-document, one is
	// emptied, one deleted.
	put(t, filepath.Join(conf, "invalid.yaml"), vsDoc("split", -180, 20))
	put(t, filepath.Join(conf, "malformed.yaml"), "kind: VirtualService\nspec: [unclosed\n")
	put(t, filepath.Join(conf, "emptied.yaml"), "")
	if err := os.Remove(filepath.Join(conf, "deleted.yaml")); err != nil {
		t.Fatal(err)
	}

	after, _, _ := newTree(t)
	if _, err := after.RestoreState(saved, []string{conf}); err != nil {
		t.Fatal(err)
	}
	after.Scan([]string{conf})
	if got := weights(t, after, "demo/split"); !slices.Equal(got, []int32{80, 20}) {
		t.Fatalf("after restart, demo/split weights = %v, want the last valid 80/20", got)
	}
	if got := names(after, schema.VirtualService.TypeURL); !slices.Equal(got, []string{"demo/emptied", "demo/malformed", "demo/split"}) {
		t.Fatalf("after restart, VirtualServices = %v", got)
	}
	if got := names(after, schema.Gateway.TypeURL); !slices.Equal(got, []string{"default/gw"}) {
		t.Fatalf("after restart, Gateways = %v", got)
	}
	if r := after.State(schema.VirtualService.TypeURL)[0]; r.Labels["team"] != "a" {
		t.Fatalf("labels lost: %v", r.Labels)
	}
	for _, f := range []string{"invalid.yaml", "malformed.yaml", "emptied.yaml"} {
		if !hasProblem(after, f) {
			t.Errorf("no problem names %s: %v", f, after.Problems())
		}
	}

	// The restored Tree goes on as the first would have: fixing the file replaces the version.
	put(t, filepath.Join(conf, "invalid.yaml"), vsDoc("split", 10, 90))
	after.Scan([]string{conf})
	if got := weights(t, after, "demo/split"); !slices.Equal(got, []int32{10, 90}) {
		t.Fatalf("after the fix, weights = %v", got)
	}
}

// A restart while the configured folder cannot be read serves what that folder held.
func TestRestoreWithUnreadableSource(t *testing.T) {
	base := t.TempDir()
	conf := filepath.Join(base, "conf")
	put(t, filepath.Join(conf, "a.yaml"), vsDoc("split", 80, 20))
	before, _, _ := newTree(t)
	before.Scan([]string{conf})
	saved, err := before.MarshalState()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(conf, filepath.Join(base, "away")); err != nil {
		t.Fatal(err)
	}
	after, _, _ := newTree(t)
	if _, err := after.RestoreState(saved, []string{conf}); err != nil {
		t.Fatal(err)
	}
	after.Scan([]string{conf})
	if got := weights(t, after, "demo/split"); !slices.Equal(got, []int32{80, 20}) {
		t.Fatalf("weights = %v, want 80/20 kept while the folder cannot be read", got)
	}
}

// The saved state belongs to the sources it was read from: a restart configured with other
// folders (another mesh file run from the same working folder) serves none of it, even while
// its own folders cannot be read; a source that stays configured keeps its part.
func TestRestoreOnlyConfiguredSources(t *testing.T) {
	base := t.TempDir()
	first, shared := filepath.Join(base, "first"), filepath.Join(base, "shared")
	put(t, filepath.Join(first, "a.yaml"), vsDoc("first", 80, 20))
	put(t, filepath.Join(shared, "b.yaml"), vsDoc("shared", 70, 30))
	before, _, _ := newTree(t)
	before.Scan([]string{first, shared})
	saved, err := before.MarshalState()
	if err != nil {
		t.Fatal(err)
	}
	// While stopped, the shared folder goes missing (a mount not there yet).
	if err := os.RemoveAll(shared); err != nil {
		t.Fatal(err)
	}

	other := filepath.Join(base, "other")
	after, _, _ := newTree(t)
	ignored, err := after.RestoreState(saved, []string{other, shared})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{SourceAddress(first)}; !slices.Equal(ignored, want) {
		t.Errorf("ignored sources = %v, want %v", ignored, want)
	}
	after.Scan([]string{other, shared}, errors.New("xds://upstream: not supported"))
	if got := names(after, schema.VirtualService.TypeURL); !slices.Equal(got, []string{"demo/shared"}) {
		t.Fatalf("VirtualServices = %v, want only demo/shared, of the source still configured", got)
	}
}

// Sources are matched by absolute path: a state saved with a relative root is restored for the
// same folder reached by another path, and its files take the new path.
func TestRestoreSameFolderOtherPath(t *testing.T) {
	base := t.TempDir()
	put(t, filepath.Join(base, "etc/sailplane/conf/a.yaml"), vsDoc("split", 80, 20))
	t.Chdir(base)
	before, _, _ := newTree(t)
	before.Scan([]string{"etc/sailplane/conf"})
	saved, err := before.MarshalState()
	if err != nil {
		t.Fatal(err)
	}
	put(t, filepath.Join(base, "etc/sailplane/conf/a.yaml"), vsDoc("split", -80, 20))
	t.Chdir(t.TempDir())
	conf := filepath.Join(base, "etc/sailplane/conf")
	after, _, _ := newTree(t)
	if _, err := after.RestoreState(saved, []string{conf}); err != nil {
		t.Fatal(err)
	}
	after.Scan([]string{conf})
	if got := weights(t, after, "demo/split"); !slices.Equal(got, []int32{80, 20}) {
		t.Fatalf("weights = %v, want the saved 80/20", got)
	}
	if !hasProblem(after, filepath.Join(conf, "a.yaml")) {
		t.Errorf("no problem names %s: %v", filepath.Join(conf, "a.yaml"), after.Problems())
	}
}

func TestRestoreRejectsBadState(t *testing.T) {
	for name, data := range map[string]string{
		"not JSON":     "{",
		"version":      `{"version": 99, "sources": []}`,
		"format 1":     `{"version": 1, "roots": ["/c"], "files": {"/c/a.yaml": []}}`,
		"unknown type": `{"version": 2, "sources": [{"source": "fs:///c", "files": {"a.yaml": [{"type": "x/v1/Nope", "name": "n", "spec": {}}]}}]}`,
		"bad spec":     `{"version": 2, "sources": [{"source": "fs:///c", "files": {"a.yaml": [{"type": "networking.istio.io/v1/VirtualService", "name": "n", "spec": {"hosts": 1}}]}}]}`,
		"outside":      `{"version": 2, "sources": [{"source": "fs:///c", "files": {"../a.yaml": []}}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			tr, _, _ := newTree(t)
			if _, err := tr.RestoreState([]byte(data), []string{"/c"}); !errors.Is(err, ErrState) {
				t.Fatalf("err = %v, want ErrState", err)
			}
		})
	}
}
