package capture

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// ValidationProbePort is the port the validation dials, which nothing listens on (Istio's
// iptables probe port): only the capture can take the connection to a listener.
const ValidationProbePort = 15002

// validationTarget is where the probe goes: 127.0.0.6 is loopback and not 127.0.0.1, so the
// proxy's own connection there is sent to the inbound capture port, as Envoy's connections to
// its own pod's addresses are.
var validationTarget = netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 6}), ValidationProbePort)

// Validate checks that capture is in place in this network namespace, as Istio's
// istio-validation: it listens on 127.0.0.1 at the outbound and inbound capture ports, dials
// 127.0.0.6:15002 (run as the proxy's uid, whose loopback connections go to the inbound
// capture port), and succeeds once a listener accepts a connection whose original destination
// (SO_ORIGINAL_DST) is that address. It runs where the CNI plugin installed the rules, as the
// pod's first init container, without capabilities.
func Validate(ctx context.Context, log *slog.Logger, proxyPort, inboundPort uint16, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	got := make(chan netip.AddrPort, 1)
	for _, port := range []uint16{proxyPort, inboundPort} {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port)))
		l, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
		if err != nil {
			return fmt.Errorf("validation: listen on %s: %w", addr, err)
		}
		defer l.Close()
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				dst, err := originalDst4(c)
				c.Close()
				if err != nil {
					log.Debug("validation: no original destination", "listener", addr, "error", err)
					continue
				}
				if dst == validationTarget {
					select {
					case got <- dst:
					default:
					}
					return
				}
			}
		}()
	}
	d := net.Dialer{Timeout: time.Second}
	for {
		c, err := d.DialContext(ctx, "tcp", validationTarget.String())
		if err == nil {
			c.Close()
		}
		select {
		case <-got:
			log.Info("validation passed: traffic capture is in place", "probe", validationTarget.String())
			return nil
		case <-ctx.Done():
			return fmt.Errorf("validation failed: a connection to %s (as this uid) did not reach 127.0.0.1:%d or :%d within %s: the pod's traffic is not captured (is the CNI plugin installed on this node?)", validationTarget, proxyPort, inboundPort, timeout)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// originalDst4 is a redirected IPv4 connection's destination before the redirect.
func originalDst4(c net.Conn) (netip.AddrPort, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, errors.New("not TCP")
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var ap netip.AddrPort
	var serr error
	err = raw.Control(func(fd uintptr) {
		const soOriginalDst = 80
		m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, soOriginalDst)
		if err != nil {
			serr = err
			return
		}
		// A sockaddr_in: family, port (network order), address.
		b := m.Multiaddr
		ap = netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), binary.BigEndian.Uint16(b[2:4]))
	})
	if err == nil {
		err = serr
	}
	return ap, err
}
