package xdssim

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
)

// matchListener finds the listener the connection lands on: one bound to the destination
// IP and port, else a wildcard one on the port; else, as for traffic captured to a
// use_original_dst listener that finds no listener for the original destination, that one.
func (s *Simulator) matchListener(req Request) (*listenerv3.Listener, error) {
	if req.ListenerPort != 0 && req.ListenerPort != req.Port {
		for _, l := range s.listeners {
			if socketPort(l) != req.ListenerPort || l.GetApiListener() != nil || l.GetInternalListener() != nil {
				continue
			}
			if !l.GetUseOriginalDst().GetValue() {
				return l, nil
			}
			// An outbound capture listener hands the connection to the listener of its
			// original destination, if there is one.
			sub := req
			sub.ListenerPort = 0
			return s.matchListener(sub)
		}
		return nil, ErrNoListener
	}
	dst, _ := netip.ParseAddr(req.DestinationIP)
	var exact, wildcard, origDst *listenerv3.Listener
	for _, l := range s.listeners {
		if l.GetApiListener() != nil || l.GetInternalListener() != nil {
			continue
		}
		if l.GetUseOriginalDst().GetValue() && origDst == nil {
			origDst = l
		}
		for _, a := range listenerAddresses(l) {
			if a.GetPortValue() != req.Port || a.GetProtocol() == corev3.SocketAddress_UDP {
				continue
			}
			ip, err := netip.ParseAddr(a.GetAddress())
			if err != nil {
				continue
			}
			switch {
			case ip.IsUnspecified() && wildcard == nil:
				wildcard = l
			case dst.IsValid() && ip.Unmap() == dst.Unmap() && exact == nil:
				exact = l
			}
		}
	}
	switch {
	case exact != nil:
		return exact, nil
	case wildcard != nil:
		return wildcard, nil
	case origDst != nil && req.Port != socketPort(origDst):
		return origDst, nil
	}
	return nil, ErrNoListener
}

func socketPort(l *listenerv3.Listener) uint32 {
	return l.GetAddress().GetSocketAddress().GetPortValue()
}

func listenerAddresses(l *listenerv3.Listener) []*corev3.SocketAddress {
	out := []*corev3.SocketAddress{l.GetAddress().GetSocketAddress()}
	for _, a := range l.GetAdditionalAddresses() {
		out = append(out, a.GetAddress().GetSocketAddress())
	}
	return out
}

func hasListenerFilter(l *listenerv3.Listener, name string) bool {
	for _, f := range l.GetListenerFilters() {
		if f.GetName() == name || f.GetTypedConfig().GetTypeUrl() == "type.googleapis.com/"+listenerFilterTypes[name] {
			return true
		}
	}
	return false
}

var listenerFilterTypes = map[string]string{
	"envoy.filters.listener.tls_inspector":  "envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector",
	"envoy.filters.listener.http_inspector": "envoy.extensions.filters.listener.http_inspector.v3.HttpInspector",
}

// connection is what the listener filters learn about a connection.
type connection struct {
	dstPort   uint32
	dst, src  netip.Addr
	transport string
	sni       string
	appProtos []string
}

func inspect(l *listenerv3.Listener, req Request) connection {
	c := connection{dstPort: req.Port, transport: "raw_buffer"}
	c.dst, _ = netip.ParseAddr(req.DestinationIP)
	c.src, _ = netip.ParseAddr(req.SourceIP)
	if req.TLS {
		if hasListenerFilter(l, "envoy.filters.listener.tls_inspector") {
			c.transport, c.sni, c.appProtos = "tls", strings.ToLower(req.SNI), req.ALPN
		}
		return c
	}
	if hasListenerFilter(l, "envoy.filters.listener.http_inspector") {
		switch req.Protocol {
		case HTTP1:
			c.appProtos = []string{"http/1.1"}
		case HTTP2, GRPC:
			c.appProtos = []string{"h2c"}
		}
	}
	return c
}

// matchFilterChain applies Envoy's filter chain match: criterion by criterion (destination
// port, destination IP, server name, transport protocol, application protocols, source
// type, source IP, source port), keep the chains with the most specific value that matches
// the connection, or those that do not set the criterion when none matches; a later
// criterion never falls back to chains an earlier one discarded. The default filter chain
// takes a connection no chain matches.
func matchFilterChain(l *listenerv3.Listener, req Request) (*listenerv3.FilterChain, string, error) {
	if l.GetFilterChainMatcher() != nil {
		return nil, "", fmt.Errorf("%w: listener %s: filter_chain_matcher", ErrUnsupported, l.GetName())
	}
	c := inspect(l, req)
	idx := make([]int, len(l.GetFilterChains()))
	for i := range idx {
		idx[i] = i
	}
	chains := l.GetFilterChains()
	m := func(i int) *listenerv3.FilterChainMatch { return chains[i].GetFilterChainMatch() }
	steps := []func([]int) []int{
		func(in []int) []int {
			return narrow(in, func(i int) (bool, int) {
				p := m(i).GetDestinationPort()
				if p == nil {
					return true, 0
				}
				return p.GetValue() == c.dstPort, 1
			})
		},
		func(in []int) []int {
			return narrowCIDR(in, func(i int) []*corev3.CidrRange { return m(i).GetPrefixRanges() }, c.dst)
		},
		func(in []int) []int {
			return narrow(in, func(i int) (bool, int) {
				names := m(i).GetServerNames()
				if len(names) == 0 {
					return true, 0
				}
				best := -1
				for _, n := range names {
					if sc := serverNameScore(strings.ToLower(n), c.sni); sc > best {
						best = sc
					}
				}
				return best >= 0, best + 1
			})
		},
		func(in []int) []int {
			return narrow(in, func(i int) (bool, int) {
				t := m(i).GetTransportProtocol()
				if t == "" {
					return true, 0
				}
				return t == c.transport, 1
			})
		},
		func(in []int) []int {
			return narrow(in, func(i int) (bool, int) {
				ps := m(i).GetApplicationProtocols()
				if len(ps) == 0 {
					return true, 0
				}
				for _, p := range c.appProtos {
					if slices.Contains(ps, p) {
						return true, 1
					}
				}
				return false, 0
			})
		},
		func(in []int) []int {
			return narrowCIDR(in, func(i int) []*corev3.CidrRange { return m(i).GetDirectSourcePrefixRanges() }, c.src)
		},
		func(in []int) []int {
			return narrow(in, func(i int) (bool, int) {
				switch m(i).GetSourceType() {
				case listenerv3.FilterChainMatch_ANY:
					return true, 0
				case listenerv3.FilterChainMatch_SAME_IP_OR_LOOPBACK:
					return c.src.IsValid() && (c.src.IsLoopback() || c.src == c.dst), 1
				default: // EXTERNAL
					return !c.src.IsValid() || !(c.src.IsLoopback() || c.src == c.dst), 1
				}
			})
		},
		func(in []int) []int {
			return narrowCIDR(in, func(i int) []*corev3.CidrRange { return m(i).GetSourcePrefixRanges() }, c.src)
		},
		func(in []int) []int {
			return narrow(in, func(i int) (bool, int) {
				if len(m(i).GetSourcePorts()) == 0 {
					return true, 0
				}
				return false, 0 // the simulated client has no source port
			})
		},
	}
	for _, step := range steps {
		idx = step(idx)
	}
	switch {
	case len(idx) == 1:
		fc := chains[idx[0]]
		return fc, chainName(fc, idx[0]), nil
	case len(idx) > 1:
		return nil, "", fmt.Errorf("%w: listener %s: filter chains %v match alike", ErrInvalid, l.GetName(), idx)
	case l.GetDefaultFilterChain() != nil:
		return l.GetDefaultFilterChain(), "default", nil
	}
	return nil, "", ErrNoFilterChain
}

func chainName(fc *listenerv3.FilterChain, i int) string {
	if fc.GetName() != "" {
		return fc.GetName()
	}
	return fmt.Sprintf("#%d", i)
}

// narrow keeps the chains whose criterion matches with the highest score (0: the chain does
// not set the criterion).
func narrow(in []int, match func(int) (bool, int)) []int {
	best := -1
	var out []int
	for _, i := range in {
		ok, score := match(i)
		if !ok {
			continue
		}
		switch {
		case score > best:
			best, out = score, []int{i}
		case score == best:
			out = append(out, i)
		}
	}
	return out
}

// narrowCIDR keeps the chains whose range containing addr is the longest; chains without
// ranges when none contains it.
func narrowCIDR(in []int, ranges func(int) []*corev3.CidrRange, addr netip.Addr) []int {
	return narrow(in, func(i int) (bool, int) {
		rs := ranges(i)
		if len(rs) == 0 {
			return true, 0
		}
		best := -1
		for _, r := range rs {
			ip, err := netip.ParseAddr(r.GetAddressPrefix())
			if err != nil || !addr.IsValid() {
				continue
			}
			bits := int(r.GetPrefixLen().GetValue())
			if r.GetPrefixLen() == nil {
				bits = ip.BitLen()
			}
			p, err := ip.Prefix(bits)
			if err == nil && p.Contains(addr.Unmap()) && bits > best {
				best = bits
			}
		}
		return best >= 0, best + 1
	})
}

// serverNameScore: -1 no match; a higher score for a more specific name (an exact name beats
// any wildcard; a longer wildcard suffix beats a shorter one).
func serverNameScore(pattern, sni string) int {
	if sni == "" {
		return -1
	}
	if pattern == sni {
		return 1 << 20
	}
	if suffix, ok := strings.CutPrefix(pattern, "*"); ok && strings.HasPrefix(suffix, ".") &&
		strings.HasSuffix(sni, suffix) && len(sni) > len(suffix) {
		return len(suffix)
	}
	return -1
}
