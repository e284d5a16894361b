// Package dnstest runs loopback DNS servers for tests: the upstream nameservers the agent's DNS
// proxy forwards to.
package dnstest

import (
	"errors"
	"net"
	"testing"

	"github.com/miekg/dns"
)

// Listen binds UDP and TCP on one loopback port: the kernel picks the UDP port, and when that
// port is taken for TCP (by any connection's source port) another one is tried.
func Listen() (net.PacketConn, net.Listener, error) {
	for range 50 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return nil, nil, err
		}
		l, err := net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			return pc, l, nil
		}
		_ = pc.Close()
	}
	return nil, nil, errors.New("dnstest: no loopback port free for both UDP and TCP")
}

// Serve answers DNS with h over UDP and TCP on one loopback port until the test ends, and
// returns the port.
func Serve(t testing.TB, h dns.Handler) string {
	t.Helper()
	pc, l, err := Listen()
	if err != nil {
		t.Fatal(err)
	}
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: l, Handler: h}} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		done := make(chan struct{})
		go func() { defer close(done); _ = srv.ActivateAndServe() }()
		<-started
		t.Cleanup(func() { _ = srv.Shutdown(); <-done })
	}
	_, port, _ := net.SplitHostPort(pc.LocalAddr().String())
	return port
}
