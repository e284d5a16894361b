package framework

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"sailplane.dev/shared/netns"

	"golang.org/x/sys/unix"
)

// Test hosts exist because the Kubernetes API server refuses loopback addresses in Pod IPs and
// EndpointSlices: a backend Kubernetes points at needs a real address. Each TestHost is a network
// namespace joined to a bridge in the root namespace:
//
//	root ns: spbr0 198.18.0.1/24 ── spv<N> ═veth═ eth0 198.18.0.N/24 (netns sp-<N>-<pid>)
//
// Only 198.18.0.0/24 (RFC 2544's benchmarking range) is ever routed, on the bridge; nothing
// else of the machine's network is touched. Several test processes may create hosts at once:
// everything that changes the shared bridge or allocates N is done under an flock.
const (
	hostBridge  = "spbr0"
	hostNetPfx  = "198.18.0."
	hostGateway = hostNetPfx + "1"
	hostLock    = "/tmp/sailplane-testhosts.lock"
	netnsDir    = "/run/netns"
	// N ranges over 2..254; 1 is the bridge.
	firstHostN, lastHostN = 2, 254
)

// TestHost is a network namespace with one address in 198.18.0.0/24, reachable from the root
// namespace (where the test, Sailplane's binaries and the API server run).
type TestHost struct {
	Name  string // the network namespace, "sp-<N>-<pid>"
	n     int
	veth  string // the root-side end, on the bridge
	ip    string
	close sync.Once
}

// hostMu serializes host set-up inside this process; the flock does it across processes.
var hostMu sync.Mutex

// NewTestHost creates a test host (name is only for logs) and deletes it when the test ends.
// It needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2's `ip`; it fails the test
// otherwise.
func NewTestHost(t testing.TB, name string) *TestHost {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("test host %s: network namespaces need root (CI runs as root)", name)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatalf("test host %s: iproute2's ip is not installed: %v", name, err)
	}
	h, err := newTestHost()
	if err != nil {
		t.Fatalf("test host %s: %v", name, err)
	}
	t.Logf("test host %s: netns %s, address %s", name, h.Name, h.ip)
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Errorf("test host %s: %v", name, err)
		}
	})
	return h
}

// IP is the host's address, 198.18.0.N.
func (h *TestHost) IP() string { return h.ip }

// Listen opens a TCP listener on the host's address inside its namespace (port 0 picks a free
// one), closed when the test ends. Serving from it serves from the host: peers in the root
// namespace reach it at IP():port.
func (h *TestHost) Listen(t testing.TB, port int) net.Listener {
	t.Helper()
	lis, err := h.listen(port)
	if err != nil {
		t.Fatalf("listen in %s: %v", h.Name, err)
	}
	t.Cleanup(func() { lis.Close() })
	return lis
}

func (h *TestHost) listen(port int) (net.Listener, error) {
	var lis net.Listener
	err := h.inside(func() (err error) {
		lis, err = net.Listen("tcp", net.JoinHostPort(h.ip, strconv.Itoa(port)))
		return err
	})
	return lis, err
}

// DialContext opens a TCP connection from the host: its socket is made inside the host's
// namespace, so the peer sees the host's address (a gRPC client's grpc.WithContextDialer).
func (h *TestHost) DialContext(ctx context.Context, addr string) (net.Conn, error) {
	var conn net.Conn
	err := h.inside(func() (err error) {
		var d net.Dialer
		conn, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial %s from %s: %w", addr, h.Name, err)
	}
	return conn, nil
}

// inside runs f on a thread in the host's namespace: sockets f creates belong to the host.
func (h *TestHost) inside(f func() error) error {
	return netns.Do(filepath.Join(netnsDir, h.Name), f)
}

// Close deletes the host's namespace and veth, and the bridge when no other host uses it.
// Listeners opened in the host should be closed first (Listen's cleanup does it, running
// before NewTestHost's).
func (h *TestHost) Close() error {
	var err error
	h.close.Do(func() {
		err = withHostLock(func() error {
			var errs []error
			// Deleting one end of a veth deletes both, at once, even if sockets still hold the
			// namespace.
			if linkExists(h.veth) {
				errs = append(errs, ipCmd("link", "del", h.veth))
			}
			errs = append(errs, ipCmd("netns", "del", h.Name))
			errs = append(errs, removeIdleBridge())
			return errors.Join(errs...)
		})
	})
	return err
}

func newTestHost() (*TestHost, error) {
	var h *TestHost
	err := withHostLock(func() error {
		reapStaleHosts()
		n, err := freeHostN()
		if err != nil {
			return err
		}
		h = &TestHost{
			Name: fmt.Sprintf("sp-%d-%d", n, os.Getpid()),
			n:    n,
			veth: fmt.Sprintf("spv%d", n),
			ip:   hostNetPfx + strconv.Itoa(n),
		}
		if err := ensureBridge(); err != nil {
			return err
		}
		if err := h.create(); err != nil {
			// Leave nothing half-made behind.
			_ = ipCmd("link", "del", h.veth)
			_ = ipCmd("netns", "del", h.Name)
			_ = removeIdleBridge()
			return err
		}
		return nil
	})
	return h, err
}

func (h *TestHost) create() error {
	peer := fmt.Sprintf("spp%d", h.n)
	in := func(args ...string) []string { return append([]string{"-n", h.Name}, args...) }
	steps := [][]string{
		{"netns", "add", h.Name},
		{"link", "add", h.veth, "type", "veth", "peer", "name", peer},
		{"link", "set", peer, "netns", h.Name},
		in("link", "set", peer, "name", "eth0"),
		in("addr", "add", h.ip+"/24", "dev", "eth0"),
		in("link", "set", "lo", "up"),
		in("link", "set", "eth0", "up"),
		in("route", "add", "default", "via", hostGateway),
		{"link", "set", h.veth, "master", hostBridge},
		{"link", "set", h.veth, "up"},
		// A host deleted earlier may have had this address: the root namespace would keep sending
		// to its MAC address until the stale neighbour entry expires (tens of seconds).
		{"neigh", "flush", "to", h.ip},
	}
	for _, s := range steps {
		if err := ipCmd(s...); err != nil {
			return err
		}
	}
	return nil
}

// ensureBridge creates spbr0 with 198.18.0.1/24 unless it exists; the kernel adds the one
// route it implies, 198.18.0.0/24 dev spbr0.
func ensureBridge() error {
	if linkExists(hostBridge) {
		return nil
	}
	for _, s := range [][]string{
		{"link", "add", hostBridge, "type", "bridge"},
		{"addr", "add", hostGateway + "/24", "dev", hostBridge},
		{"link", "set", hostBridge, "up"},
	} {
		if err := ipCmd(s...); err != nil {
			return err
		}
	}
	return nil
}

// removeIdleBridge deletes spbr0 when no veth is attached to it any more.
func removeIdleBridge() error {
	if !linkExists(hostBridge) {
		return nil
	}
	out, err := ipOut("-o", "link", "show", "master", hostBridge)
	if err != nil {
		return err
	}
	if strings.TrimSpace(out) != "" {
		return nil
	}
	return ipCmd("link", "del", hostBridge)
}

// freeHostN picks the lowest N whose root-side veth does not exist.
func freeHostN() (int, error) {
	for n := firstHostN; n <= lastHostN; n++ {
		if !linkExists(fmt.Sprintf("spv%d", n)) {
			return n, nil
		}
	}
	return 0, fmt.Errorf("all %d test host addresses are in use", lastHostN-firstHostN+1)
}

// reapStaleHosts deletes the hosts of test processes that died without cleaning up (killed by
// a timeout, say), so their numbers and the bridge are freed.
func reapStaleHosts() {
	entries, _ := os.ReadDir(netnsDir)
	for _, e := range entries {
		var n, pid int
		if _, err := fmt.Sscanf(e.Name(), "sp-%d-%d", &n, &pid); err != nil || e.Name() != fmt.Sprintf("sp-%d-%d", n, pid) {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			continue
		}
		veth := fmt.Sprintf("spv%d", n)
		if linkExists(veth) {
			_ = ipCmd("link", "del", veth)
		}
		_ = ipCmd("netns", "del", e.Name())
	}
}

func withHostLock(f func() error) error {
	hostMu.Lock()
	defer hostMu.Unlock()
	fd, err := unix.Open(hostLock, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o666)
	if err != nil {
		return fmt.Errorf("open %s: %w", hostLock, err)
	}
	defer unix.Close(fd)
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", hostLock, err)
	}
	defer unix.Flock(fd, unix.LOCK_UN)
	return f()
}

func linkExists(name string) bool {
	_, err := net.InterfaceByName(name)
	return err == nil
}

func ipCmd(args ...string) error {
	_, err := ipOut(args...)
	return err
}

func ipOut(args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("ip", args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// GatewayAddr is a free port on the bridge's address (198.18.0.1), where the root namespace's
// servers are reachable from test hosts; a TestHost must exist, since it creates the bridge.
func GatewayAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(hostGateway, "0"))
	if err != nil {
		t.Fatalf("a port on the test hosts' bridge (create a TestHost first): %v", err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Command runs bin with args inside the host's network namespace (`ip netns exec` execs it, so
// the process is bin itself): for a program whose servers cannot be bound to loopback.
func (h *TestHost) Command(bin string, args ...string) (string, []string) {
	return "ip", append([]string{"netns", "exec", h.Name, bin}, args...)
}

// SetLinkUp brings the host's link up or down (its veth on the bridge): down cuts the host off
// as a pulled cable would, its sockets left open, so connections resume if it comes back soon.
func (h *TestHost) SetLinkUp(up bool) error {
	state := "down"
	if up {
		state = "up"
	}
	return ipCmd("link", "set", h.veth, state)
}

// OpenTestHost creates a test host that the caller closes: for hosts made and removed while a
// test runs, from goroutines that must not fail the test themselves (a stand-in kubelet).
func OpenTestHost() (*TestHost, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("network namespaces need root (CI runs as root)")
	}
	return newTestHost()
}
