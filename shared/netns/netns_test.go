package netns

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newNamespace creates a namespace of its own for the test; it has only a loopback, down.
func newNamespace(t *testing.T) string {
	t.Helper()
	name := "sp-netns-" + strings.ReplaceAll(strings.ToLower(t.Name()), "/", "-")
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	return "/run/netns/" + name
}

func interfaces(t *testing.T) []string {
	t.Helper()
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, i := range ifs {
		names = append(names, i.Name)
	}
	return names
}

func TestDoRunsInsideAndReturns(t *testing.T) {
	path := newNamespace(t)
	outside := interfaces(t)
	var inside []string
	sentinel := errors.New("from fn")
	err := Do(path, func() error {
		inside = interfaces(t)
		return sentinel
	})
	if err != sentinel {
		t.Fatalf("Do returned %v, want fn's error unchanged", err)
	}
	if strings.Join(inside, ",") != "lo" {
		t.Errorf("inside the new namespace the interfaces are %v, want only lo", inside)
	}
	if got := interfaces(t); strings.Join(got, ",") != strings.Join(outside, ",") {
		t.Errorf("after Do the caller sees %v, before %v", got, outside)
	}
}

func TestDoAsSetsFsuidWhileInside(t *testing.T) {
	path := newNamespace(t)
	fsuid := func() string {
		status, err := os.ReadFile("/proc/thread-self/status")
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(status), "\n") {
			if f := strings.Fields(l); len(f) == 5 && f[0] == "Uid:" {
				return f[4] // real, effective, saved, fs
			}
		}
		t.Fatal("no Uid line in /proc/thread-self/status")
		return ""
	}
	var got string
	if err := DoAs(path, 1337, func() error { got = fsuid(); return nil }); err != nil {
		t.Fatal(err)
	}
	if got != "1337" {
		t.Errorf("fsuid inside DoAs is %s, want 1337", got)
	}
}

func TestDoMissingNamespace(t *testing.T) {
	called := false
	err := Do("/run/netns/sp-netns-does-not-exist", func() error { called = true; return nil })
	var nerr *Error
	if !errors.As(err, &nerr) || nerr.Op != "open" || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Do on a missing namespace: %v, want an open *Error wrapping ENOENT", err)
	}
	if called {
		t.Error("fn ran although the namespace could not be entered")
	}
}
