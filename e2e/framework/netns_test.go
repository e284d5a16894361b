package framework

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Two test hosts, an Echo server inside each, reached from the root namespace by address.
func TestTestHosts(t *testing.T) {
	hosts := []*TestHost{NewTestHost(t, "a"), NewTestHost(t, "b")}
	if hosts[0].IP() == hosts[1].IP() {
		t.Fatalf("both hosts have %s", hosts[0].IP())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, h := range hosts {
		id := []string{"a", "b"}[i]
		e := StartEchoOn(t, id, h.Listen(t, 0))
		if host, _, _ := net.SplitHostPort(e.Addr); host != h.IP() {
			t.Fatalf("echo %s listens on %s, want %s", id, e.Addr, h.IP())
		}
		got, err := Call(ctx, DialEcho(t, e.Addr))
		if err != nil {
			t.Fatalf("RPC to %s at %s: %v", id, e.Addr, err)
		}
		if got != id {
			t.Fatalf("RPC to %s answered by %q", id, got)
		}
	}
}

// The listener really is inside the namespace: nothing in the root namespace listens on the
// host's address, so the root namespace cannot bind it.
func TestTestHostListenerIsInNamespace(t *testing.T) {
	h := NewTestHost(t, "ns")
	lis := h.Listen(t, 0)
	if l, err := net.Listen("tcp", lis.Addr().String()); err == nil {
		l.Close()
		t.Fatalf("root namespace could bind %s: the listener is not in the test host", lis.Addr())
	}
}

// Closing the last host removes its namespace, its veth and the bridge.
func TestTestHostCleanup(t *testing.T) {
	h, err := newTestHost()
	if err != nil {
		t.Fatal(err)
	}
	lis, err := h.listen(0)
	if err != nil {
		t.Fatal(err)
	}
	lis.Close()
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if linkExists(h.veth) {
		t.Errorf("veth %s still exists", h.veth)
	}
	if _, err := os.Stat(filepath.Join(netnsDir, h.Name)); err == nil {
		t.Errorf("netns %s still exists", h.Name)
	}
}

// A connection dialled from a host comes from the host's address, and reaches another host.
func TestTestHostDialsFromItsAddress(t *testing.T) {
	from, to := NewTestHost(t, "from"), NewTestHost(t, "to")
	lis := to.Listen(t, 0)
	accepted := make(chan net.Addr, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			accepted <- nil
			return
		}
		accepted <- c.RemoteAddr()
		c.Close()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := from.DialContext(ctx, lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	remote := <-accepted
	if remote == nil {
		t.Fatal("accept failed")
	}
	if host, _, _ := net.SplitHostPort(remote.String()); host != from.IP() {
		t.Fatalf("the connection came from %s, want %s", host, from.IP())
	}
}
