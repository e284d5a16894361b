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
	if err := after.RestoreState(saved); err != nil {
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

// A restart while the configured folder cannot be read serves what the previous folders held.
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
	after, _, _ := newTree(t)
	if err := after.RestoreState(saved); err != nil {
		t.Fatal(err)
	}
	after.Scan([]string{filepath.Join(base, "typo")})
	if got := weights(t, after, "demo/split"); !slices.Equal(got, []int32{80, 20}) {
		t.Fatalf("weights = %v, want 80/20 kept while the new folder cannot be read", got)
	}
}

func TestRestoreRejectsBadState(t *testing.T) {
	for name, data := range map[string]string{
		"not JSON":     "{",
		"version":      `{"version": 99, "files": {}}`,
		"unknown type": `{"version": 1, "files": {"a.yaml": [{"type": "x/v1/Nope", "name": "n", "spec": {}}]}}`,
		"bad spec":     `{"version": 1, "files": {"a.yaml": [{"type": "networking.istio.io/v1/VirtualService", "name": "n", "spec": {"hosts": 1}}]}}`,
	} {
		t.Run(name, func(t *testing.T) {
			tr, _, _ := newTree(t)
			if err := tr.RestoreState([]byte(data)); !errors.Is(err, ErrState) {
				t.Fatalf("err = %v, want ErrState", err)
			}
		})
	}
}
