package capture

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"sailplane.dev/shared/netns"

	"golang.org/x/sys/unix"
)

// originalDst is the destination a connection had before the kernel redirected it
// (SO_ORIGINAL_DST, what Envoy's original_dst listener filter reads).
func originalDst(c net.Conn) (netip.AddrPort, error) {
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var ap netip.AddrPort
	var serr error
	const soOriginalDst = 80 // SO_ORIGINAL_DST, IP6T_SO_ORIGINAL_DST
	err = raw.Control(func(fd uintptr) {
		if la := c.LocalAddr().(*net.TCPAddr); la.IP.To4() != nil {
			m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, soOriginalDst)
			if err != nil {
				serr = err
				return
			}
			// A sockaddr_in: family, port (network order), address.
			b := m.Multiaddr
			ap = netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), binary.BigEndian.Uint16(b[2:4]))
			return
		}
		info, err := unix.GetsockoptIPv6MTUInfo(int(fd), unix.SOL_IPV6, soOriginalDst)
		if err != nil {
			serr = err
			return
		}
		// The port is stored in network order.
		var p [2]byte
		binary.NativeEndian.PutUint16(p[:], info.Addr.Port)
		ap = netip.AddrPortFrom(netip.AddrFrom16(info.Addr.Addr), binary.BigEndian.Uint16(p[:]))
	})
	if err == nil {
		err = serr
	}
	return ap, err
}

// serve answers each connection on l with one line from reply.
func serve(t *testing.T, l net.Listener, reply func(net.Conn) string) {
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				fmt.Fprintln(c, reply(c))
			}()
		}
	}()
}

func listenIn(t *testing.T, ns, network, addr string) net.Listener {
	t.Helper()
	return listenTransparentIn(t, ns, network, addr, false)
}

// listenTransparentIn listens in ns; transparent sets IP_TRANSPARENT, as Envoy's inbound
// listener in TPROXY mode, so it accepts connections addressed to any address.
func listenTransparentIn(t *testing.T, ns, network, addr string, transparent bool) net.Listener {
	t.Helper()
	var l net.Listener
	lc := net.ListenConfig{}
	if transparent {
		lc.Control = func(network, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				if network == "tcp6" {
					serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_TRANSPARENT, 1)
				} else {
					serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1)
				}
			})
			return errors.Join(err, serr)
		}
	}
	if err := netns.Do("/run/netns/"+ns, func() (err error) {
		l, err = lc.Listen(context.Background(), network, addr)
		return err
	}); err != nil {
		t.Fatalf("listen %s %s in %s: %v", network, addr, ns, err)
	}
	return l
}

// dialIn connects from namespace ns (as uid, or -1 for ours) and returns the line it reads.
func dialIn(ns string, uid int, addr string) (string, error) {
	var conn net.Conn
	err := netns.DoAs("/run/netns/"+ns, uid, func() (err error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var d net.Dialer
		conn, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	return strings.TrimSpace(line), err
}

// TestPackets proves the capture with connections, in a "pod" namespace joined to a "peer"
// namespace by a veth pair, with the rules installed by the real binary (both backends, IPv4
// and IPv6). A helper stands where Envoy's listeners are: on 15001 and 15006 it answers with
// the listener's port and the connection's original destination.
func TestPackets(t *testing.T) {
	needRoot(t, "nft", "iptables-restore", "ip6tables-restore")
	bin := agentBinary(t)
	for _, tc := range []struct {
		backend Backend
		mode    string
	}{{NFTables, "REDIRECT"}, {IPTables, "REDIRECT"}, {NFTables, "TPROXY"}, {IPTables, "TPROXY"}} {
		backend := tc.backend
		tproxy := tc.mode == "TPROXY"
		t.Run(string(backend)+"/"+tc.mode, func(t *testing.T) {
			const resolv = "nameserver 198.18.201.1\nnameserver 2001:2:1::1\n"
			pod := newNetns(t, resolv)
			peer := newNetns(t, "")
			run(t, "ip", "-n", pod.Name, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", peer.Name)
			const podIP, peerIP, podIP6, peerIP6 = "198.18.201.2", "198.18.201.1", "2001:2:1::2", "2001:2:1::1"
			pod.IP(t, "addr", "add", podIP+"/24", "dev", "eth0")
			peer.IP(t, "addr", "add", peerIP+"/24", "dev", "eth0")
			pod.IP(t, "addr", "add", podIP6+"/64", "dev", "eth0", "nodad")
			peer.IP(t, "addr", "add", peerIP6+"/64", "dev", "eth0", "nodad")
			pod.IP(t, "link", "set", "eth0", "up")
			peer.IP(t, "link", "set", "eth0", "up")

			// Envoy's stand-in and the app, in the pod; a server in the peer.
			for _, p := range []string{"15001", "15006", "15053"} {
				for _, n := range []struct{ network, host string }{{"tcp4", "0.0.0.0"}, {"tcp6", "::"}} {
					port := p
					// TPROXY delivers inbound connections unchanged: the listener must be
					// transparent, and the connection's own address is the original one.
					transparent := tproxy && p == "15006"
					serve(t, listenTransparentIn(t, pod.Name, n.network, net.JoinHostPort(n.host, p), transparent), func(c net.Conn) string {
						if transparent {
							return "proxy " + port + " " + c.LocalAddr().String()
						}
						od, err := originalDst(c)
						if err != nil {
							return "proxy " + port + " error " + err.Error()
						}
						return "proxy " + port + " " + od.String()
					})
				}
			}
			for _, p := range []string{"8080", "8081", "15021"} {
				port := p
				serve(t, listenIn(t, pod.Name, "tcp", ":"+p), func(net.Conn) string { return "app " + port })
			}
			for _, p := range []string{"9000", "9001", "53"} {
				port := p
				serve(t, listenIn(t, peer.Name, "tcp", ":"+p), func(net.Conn) string { return "peer " + port })
			}
			// DNS over UDP: the agent's DNS proxy in the pod, the resolv.conf server in the peer.
			// The proxy runs as the agent does, uid 1337: its answers must be in the conntrack zone
			// the rules put them in to be un-NATed back to the app.
			// It listens on localhost, as the agent does: a reply from another address would not
			// be the NATed flow's.
			serveUDP(t, pod.Name, 1337, "127.0.0.1:15053", "proxy 15053")
			serveUDP(t, pod.Name, 1337, "[::1]:15053", "proxy 15053")
			serveUDP(t, peer.Name, -1, ":53", "peer 53")

			// Before capture, everything reaches its destination.
			expect(t, peer.Name, -1, podIP+":8080", "app 8080")

			pod.Exec(t, bin, "capture", "--backend", string(backend), "-m", tc.mode, "-d", "8081", "-o", "9001", "--redirect-dns")

			for _, v := range []struct{ pod, peer string }{{podIP, peerIP}, {podIP6, peerIP6}} {
				// Inbound: captured to 15006 with the original port; excluded and 15021 reach the app.
				expect(t, peer.Name, -1, net.JoinHostPort(v.pod, "8080"), "proxy 15006 "+net.JoinHostPort(v.pod, "8080"))
				expect(t, peer.Name, -1, net.JoinHostPort(v.pod, "8081"), "app 8081")
				expect(t, peer.Name, -1, net.JoinHostPort(v.pod, "15021"), "app 15021")
				// Outbound: the app (uid 0 here) is captured to 15001 with the original destination;
				// the proxy's uid 1337 and excluded ports go straight to the peer.
				expect(t, pod.Name, -1, net.JoinHostPort(v.peer, "9000"), "proxy 15001 "+net.JoinHostPort(v.peer, "9000"))
				expect(t, pod.Name, 1337, net.JoinHostPort(v.peer, "9000"), "peer 9000")
				expect(t, pod.Name, -1, net.JoinHostPort(v.peer, "9001"), "peer 9001")
				// DNS to resolv.conf's server goes to the agent's proxy, over UDP and TCP; the
				// agent's own queries (uid 1337) reach the server.
				dns := net.JoinHostPort(v.peer, "53")
				expectUDP(t, pod.Name, -1, dns, "proxy 15053")
				expectUDP(t, pod.Name, 1337, dns, "peer 53")
				expect(t, pod.Name, -1, dns, "proxy 15053 "+dns)
				expect(t, pod.Name, 1337, dns, "peer 53")
				// The app calling itself on localhost is not captured.
				loop := "127.0.0.1"
				if strings.Contains(v.pod, ":") {
					loop = "::1"
				}
				expect(t, pod.Name, -1, net.JoinHostPort(loop, "8080"), "app 8080")
			}

			pod.Exec(t, bin, "capture", "--cleanup-only")
			expect(t, peer.Name, -1, podIP+":8080", "app 8080")
			expect(t, pod.Name, -1, peerIP+":9000", "peer 9000")
		})
	}
}

// serveUDP answers each datagram on addr in ns with reply, from a socket of uid's.
func serveUDP(t *testing.T, ns string, uid int, addr, reply string) {
	t.Helper()
	var pc net.PacketConn
	if err := netns.DoAs("/run/netns/"+ns, uid, func() (err error) {
		pc, err = net.ListenPacket("udp", addr)
		return err
	}); err != nil {
		t.Fatalf("listen udp %s in %s: %v", addr, ns, err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte(reply), from)
		}
	}()
}

// expectUDP sends one datagram from ns (as uid) to addr and checks the answer.
func expectUDP(t *testing.T, ns string, uid int, addr, want string) {
	t.Helper()
	var conn net.Conn
	if err := netns.DoAs("/run/netns/"+ns, uid, func() (err error) {
		conn, err = net.Dial("udp", addr)
		return err
	}); err != nil {
		t.Errorf("udp %s from %s: %v", addr, ns, err)
		return
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 512)
	_, _ = conn.Write([]byte("query"))
	n, err := conn.Read(buf)
	if err != nil || string(buf[:n]) != want {
		t.Errorf("udp %s from %s as uid %d: answered %q (%v), want %q", addr, ns, uid, buf[:n], err, want)
	}
}

func expect(t *testing.T, ns string, uid int, addr, want string) {
	t.Helper()
	got, err := dialIn(ns, uid, addr)
	who := "from " + ns
	if uid >= 0 {
		who += fmt.Sprintf(" as uid %d", uid)
	}
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("dial %s %s: %v", addr, who, err)
		return
	}
	if got != want {
		t.Errorf("dial %s %s: answered %q, want %q", addr, who, got, want)
	}
}
