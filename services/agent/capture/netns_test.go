package capture

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"sailplane.dev/shared/testwait"
)

// testNetns is a network namespace the test creates (`ip netns add`) and deletes when it
// ends: where rules are installed, or where Istio's pilot-agent looks for the pod's address.
type testNetns struct {
	Name string
}

var netnsSeq atomic.Int32

// needRoot fails (never skips) a test that needs root and the capture tools.
func needRoot(t testing.TB, tools ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test creates network namespaces and installs rules: it needs root (CI runs as root)")
	}
	for _, tool := range append([]string{"ip"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed: apt-get install -y iproute2 iptables nftables (.ci/run does it): %v", tool, err)
		}
	}
}

// newNetns makes a namespace with lo up and a veth pair inside it, v0 holding addrs (a v4 or
// v6 address with its prefix), and, if resolv is set, that resolv.conf for `ip netns exec`.
func newNetns(t testing.TB, resolv string, addrs ...string) *testNetns {
	t.Helper()
	needRoot(t)
	ns := &testNetns{Name: fmt.Sprintf("spcap-%d-%d", os.Getpid(), netnsSeq.Add(1))}
	run(t, "ip", "netns", "add", ns.Name)
	t.Cleanup(func() {
		_ = exec.Command("ip", "netns", "del", ns.Name).Run()
		_ = os.RemoveAll(filepath.Join("/etc/netns", ns.Name))
	})
	ns.IP(t, "link", "set", "lo", "up")
	ns.IP(t, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
	for _, a := range addrs {
		args := []string{"addr", "add", a, "dev", "v0"}
		if strings.Contains(a, ":") {
			args = append(args, "nodad")
		}
		ns.IP(t, args...)
	}
	// No IPv6 link-local addresses: they are random per namespace, and their routes appear only
	// once duplicate address detection ends, so a snapshot of the namespace taken now would
	// differ from one taken later (as it did on a loaded machine) and from another namespace's.
	ns.IP(t, "link", "set", "v0", "addrgenmode", "none")
	ns.IP(t, "link", "set", "v1", "addrgenmode", "none")
	ns.IP(t, "link", "set", "v0", "up")
	ns.IP(t, "link", "set", "v1", "up")
	// What duplicate address detection is left (none with nodad) ends before the namespace is used.
	testwait.Until(t, 30*time.Second, "no tentative IPv6 address in "+ns.Name, func() bool {
		return strings.TrimSpace(ns.IP(t, "-6", "addr", "show", "tentative")) == ""
	})
	if resolv != "" {
		dir := filepath.Join("/etc/netns", ns.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "resolv.conf"), []byte(resolv), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return ns
}

// IP runs `ip -n <ns> args…`.
func (ns *testNetns) IP(t testing.TB, args ...string) string {
	t.Helper()
	return run(t, "ip", append([]string{"-n", ns.Name}, args...)...)
}

// Exec runs a program inside the namespace and returns its combined output.
func (ns *testNetns) Exec(t testing.TB, bin string, args ...string) string {
	t.Helper()
	return run(t, "ip", append([]string{"netns", "exec", ns.Name, bin}, args...)...)
}

func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}
