package xds

import (
	"maps"
	"testing"
)

// TestClientState checks the shared-base representation against a plain map through a
// sequence of updates, rebases included.
func TestClientState(t *testing.T) {
	mk := func(kv ...string) *set {
		st := &set{entries: map[string]*entry{}}
		for i := 0; i < len(kv); i += 2 {
			st.entries[kv[i]] = &entry{name: kv[i], version: kv[i+1]}
		}
		st.names = sortedKeys(st.entries)
		return st
	}
	base := mk("a", "1", "b", "1", "c", "1")
	var cs clientState
	want := map[string]string{}
	check := func(step string) {
		t.Helper()
		got := map[string]string{}
		cs.names(func(n string) { got[n] = cs.get(n) })
		if !maps.Equal(got, want) || cs.n != len(want) {
			t.Fatalf("%s: state %v (n=%d), want %v", step, got, cs.n, want)
		}
		for n, v := range want {
			if cs.get(n) != v {
				t.Fatalf("%s: get(%s) = %q, want %q", step, n, cs.get(n), v)
			}
		}
	}
	for _, n := range base.names {
		cs.set(&entry{name: n, version: "1"})
		want[n] = "1"
	}
	check("filled")
	cs.rebase(base)
	if cs.base != base || len(cs.over) != 0 {
		t.Fatal("rebase did not share the set")
	}
	check("rebased")
	cs.set(&entry{name: "b", version: "2"})
	want["b"] = "2"
	cs.del("c")
	delete(want, "c")
	cs.set(&entry{name: "d", version: "1"})
	want["d"] = "1"
	check("diffs")
	cs.set(&entry{name: "b", version: "1"}) // back to the base version: no difference left for b
	want["b"] = "1"
	if _, ok := cs.over["b"]; ok {
		t.Error("an override equal to the base was kept")
	}
	check("reverted")
	cs.del("zzz")
	cs.set(&entry{name: "c", version: "1"})
	want["c"] = "1"
	check("restored")
	cs.rebase(base) // holds d too: not exactly base
	if len(cs.over) == 0 {
		t.Error("rebased onto a set the client does not hold exactly")
	}
	cs.del("d")
	delete(want, "d")
	cs.rebase(base)
	if cs.base != base || len(cs.over) != 0 {
		t.Error("rebase failed on an exact match")
	}
	check("final")
}
