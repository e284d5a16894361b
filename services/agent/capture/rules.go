// Package capture installs an injected pod's traffic capture in its network namespace: the
// rules Istio's istio-init installs (tools/istio-iptables, tools/istio-nftables), built once
// as a rule model and rendered either to native nftables (one table, one knftables
// transaction) or to iptables-restore text for nodes without nft. What to capture is a
// sailplane.dev/shared/capture Config, from the flags or the pod's annotations.
package capture

import (
	"net/netip"
	"strconv"

	"sailplane.dev/shared/capture"
)

// Table is an iptables table; in nftables each becomes base chains of that type and priority
// in our one table.
type Table uint8

const (
	Nat Table = iota
	Mangle
	Raw
)

var tableNames = [...]string{"nat", "mangle", "raw"}

func (t Table) String() string { return tableNames[t] }

// Family says which IP version a rule is for; Any when it tests no address.
type Family uint8

const (
	Any Family = iota
	V4
	V6
)

// Chains, by their iptables names (Istio's, so a runbook's `iptables -t nat -L ISTIO_OUTPUT`
// still works). PREROUTING and OUTPUT are the built-in hooks.
const (
	Prerouting   = "PREROUTING"
	Output       = "OUTPUT"
	Inbound      = "ISTIO_INBOUND"
	RedirectOut  = "ISTIO_REDIRECT"
	RedirectIn   = "ISTIO_IN_REDIRECT"
	OutputChain  = "ISTIO_OUTPUT"
	OutputDNS    = "ISTIO_OUTPUT_DNS"
	Divert       = "ISTIO_DIVERT"
	TProxyChain  = "ISTIO_TPROXY"
	DropChain    = "ISTIO_DROP"
	outboundMark = 1338 // the proxy's own connections to the app over lo, in TPROXY mode
)

// chainOrder is the order chains are declared in, built-in first.
var chainOrder = []string{Prerouting, Output, Inbound, RedirectOut, RedirectIn, OutputChain, OutputDNS, Divert, TProxyChain, DropChain}

func builtin(chain string) bool { return chain == Prerouting || chain == Output }

// MatchKind is what a match tests.
type MatchKind uint8

const (
	Proto    MatchKind = iota // Value tcp or udp
	DPort                     // Value a port; Values a set (negated: none of them)
	SPort                     // Value a port
	Src                       // Value a prefix
	Dst                       // Value a prefix
	InIface                   // Value a name
	OutIface                  // Value a name
	UID                       // socket owner
	GID                       // socket group
	CTState                   // Value e.g. "RELATED,ESTABLISHED"
	Mark                      // packet mark
	ConnMark                  // connection mark
)

// Match is one test of a rule, negated with Not.
type Match struct {
	Kind   MatchKind
	Not    bool
	Value  string
	Values []string
}

// TargetKind is what a rule does with a matching packet.
type TargetKind uint8

const (
	Return     TargetKind = iota
	Jump                  // Chain
	RedirectTo            // Port
	TProxyTo              // Port, Mark
	SetMark               // Mark
	Accept
	Drop
	SaveMark    // connection mark := packet mark
	RestoreMark // packet mark := connection mark
	CTZone      // Zone
)

// Target is a rule's verdict or action.
type Target struct {
	Kind  TargetKind
	Chain string
	Port  uint16
	Mark  uint32
	Zone  int
}

// Rule is one rule of a chain.
type Rule struct {
	Family Family
	Table  Table
	Chain  string
	Match  []Match
	Target Target
}

// Rules is the whole capture: per table and chain, the rules in order, and per family the
// rules iptables gets (nftables gets their union, see Merged).
type Rules struct {
	IPv6 bool
	v4   chains
	v6   chains
}

type chainKey struct {
	table Table
	chain string
}

type chains map[chainKey][]Rule

// family is the rules of one IP version, per chain in order.
func (r *Rules) family(f Family) chains {
	if f == V6 {
		return r.v6
	}
	return r.v4
}

// Options are facts of the pod's network namespace that are not in the Config.
type Options struct {
	// IPv6 adds the IPv6 rules (the pod has an IPv6 address).
	IPv6 bool
}

// Build is the rule model for c, in Istio's rule order: within a chain the order matters
// (first match wins), so it is kept as istio-iptables writes it.
func Build(c capture.Config, o Options) *Rules {
	b := &builder{r: &Rules{IPv6: o.IPv6, v4: chains{}, v6: chains{}}, cfg: c}
	if c.Mode != capture.None {
		b.build()
	}
	return b.r
}

type builder struct {
	r   *Rules
	cfg capture.Config
}

func (b *builder) families(f Family) []Family {
	switch f {
	case V4:
		return []Family{V4}
	case V6:
		if b.r.IPv6 {
			return []Family{V6}
		}
		return nil
	}
	if b.r.IPv6 {
		return []Family{V4, V6}
	}
	return []Family{V4}
}

func (b *builder) list(f Family) chains {
	if f == V6 {
		return b.r.v6
	}
	return b.r.v4
}

// add appends a rule for family f (Any: both).
func (b *builder) add(f Family, t Table, chain string, target Target, m ...Match) {
	b.insert(f, t, chain, 0, target, m...)
}

// insert puts a rule at 1-based position pos of the chain (0 appends), as `iptables -I`.
func (b *builder) insert(f Family, t Table, chain string, pos int, target Target, m ...Match) {
	rule := Rule{Family: f, Table: t, Chain: chain, Match: m, Target: target}
	for _, fam := range b.families(f) {
		l := b.list(fam)
		k := chainKey{t, chain}
		rs := l[k]
		if pos <= 0 || pos > len(rs) {
			l[k] = append(rs, rule)
			continue
		}
		rs = append(rs[:pos-1], append([]Rule{rule}, rs[pos-1:]...)...)
		l[k] = rs
	}
}

// versioned adds a rule per family, testing that family's address (v4 or v6 prefix).
func (b *builder) versioned(v4, v6 string, add func(f Family, addr string)) {
	add(V4, v4)
	if b.r.IPv6 {
		add(V6, v6)
	}
}

func m(k MatchKind, v string) Match   { return Match{Kind: k, Value: v} }
func not(k MatchKind, v string) Match { return Match{Kind: k, Not: true, Value: v} }
func port(p uint16) string            { return strconv.Itoa(int(p)) }
func id(i uint32) string              { return strconv.FormatUint(uint64(i), 10) }
func jump(chain string) Target        { return Target{Kind: Jump, Chain: chain} }
func famOf(p netip.Prefix) Family {
	if p.Addr().Is4() {
		return V4
	}
	return V6
}

var (
	tcp = m(Proto, "tcp")
	udp = m(Proto, "udp")
	ret = Target{Kind: Return}
)

const (
	loopback4 = "127.0.0.1/32"
	loopback6 = "::1/128"
	// Envoy's inbound passthrough binds its connections to the app to this source.
	passthrough4 = "127.0.0.6/32"
	passthrough6 = "::6/128"
)

func (b *builder) build() {
	c := b.cfg
	tproxy := c.Mode == capture.TProxy

	// Interfaces never captured, then those whose inbound traffic is outbound (inserted first).
	for _, i := range c.ExcludeInterfaces {
		b.add(Any, Nat, Prerouting, ret, m(InIface, i))
		b.add(Any, Nat, Output, ret, m(OutIface, i))
	}
	if tproxy {
		for _, i := range c.ExcludeInterfaces {
			b.add(Any, Mangle, Prerouting, ret, m(InIface, i))
			b.add(Any, Mangle, Output, ret, m(OutIface, i))
		}
	}
	for _, i := range c.KubeVirtInterfaces {
		b.insert(Any, Nat, Prerouting, 1, ret, m(InIface, i))
	}
	if c.DropInvalid {
		b.add(Any, Mangle, Prerouting, jump(DropChain), m(CTState, "INVALID"))
		b.add(Any, Mangle, DropChain, Target{Kind: Drop})
	}

	b.add(Any, Nat, Inbound, ret, tcp, m(DPort, port(c.InboundTunnelPort)))
	b.add(Any, Nat, RedirectOut, Target{Kind: RedirectTo, Port: c.ProxyPort}, tcp)
	b.add(Any, Nat, RedirectIn, Target{Kind: RedirectTo, Port: c.InboundCapturePort}, tcp)

	b.inbound()
	b.outbound()

	if tproxy {
		b.tproxyMarks()
	}
}

func (b *builder) inbound() {
	c := b.cfg
	if !c.InboundPorts.All && len(c.InboundPorts.List) == 0 {
		return
	}
	table := Nat
	if c.Mode == capture.TProxy {
		table = Mangle
		mark := Target{Kind: SetMark, Mark: c.TProxyMark}
		b.add(Any, Mangle, Divert, mark)
		b.add(Any, Mangle, Divert, Target{Kind: Accept})
		b.versioned(loopback4, loopback6, func(f Family, lo string) {
			b.add(f, Mangle, TProxyChain, Target{Kind: TProxyTo, Port: c.InboundCapturePort, Mark: c.TProxyMark}, not(Dst, lo), tcp)
		})
	}
	b.add(Any, table, Prerouting, jump(Inbound), tcp)
	established := m(CTState, "RELATED,ESTABLISHED")
	if c.InboundPorts.All {
		for _, p := range c.ExcludeInboundPorts {
			b.add(Any, table, Inbound, ret, tcp, m(DPort, port(p)))
		}
		if c.Mode == capture.TProxy {
			b.add(Any, Mangle, Inbound, jump(Divert), tcp, established)
			b.add(Any, Mangle, Inbound, jump(TProxyChain), tcp)
		} else {
			b.add(Any, Nat, Inbound, jump(RedirectIn), tcp)
		}
		return
	}
	for _, p := range c.InboundPorts.List {
		if c.Mode == capture.TProxy {
			b.add(Any, Mangle, Inbound, jump(Divert), tcp, m(DPort, port(p)), established)
			b.add(Any, Mangle, Inbound, jump(TProxyChain), tcp, m(DPort, port(p)))
		} else {
			b.add(Any, Nat, Inbound, jump(RedirectIn), tcp, m(DPort, port(p)))
		}
	}
}

// dnsEnabled is whether DNS capture has anything to capture: with neither capture-all nor a
// server, Istio turns it off (and so do we, with the same warning from the command).
func (b *builder) dnsEnabled() bool {
	c := b.cfg
	return c.DNS && (c.CaptureAllDNS || len(c.DNSServers) > 0)
}

func (b *builder) outbound() {
	c := b.cfg
	dns := b.dnsEnabled()
	b.add(Any, Nat, Output, jump(OutputChain))
	for _, p := range c.ExcludeOutboundPorts {
		b.add(Any, Nat, OutputChain, ret, tcp, m(DPort, port(p)))
		b.add(Any, Nat, OutputChain, ret, udp, m(DPort, port(p)))
	}
	b.versioned(passthrough4, passthrough6, func(f Family, src string) {
		b.add(f, Nat, OutputChain, ret, m(OutIface, "lo"), m(Src, src))
	})
	// Loopback traffic is the app talking to itself unless the user captures loopback ranges.
	loInclude := false
	for _, p := range c.OutboundIPRanges.List {
		loInclude = loInclude || p.Addr().IsLoopback()
	}
	tunnel := port(c.InboundTunnelPort)
	for _, uid := range c.ProxyUIDs {
		// The proxy calling its own pod's address over lo (a service VIP that resolved to this
		// pod) goes to the inbound listener, as from any other client.
		b.versioned(loopback4, loopback6, func(f Family, lo string) {
			dport := not(DPort, tunnel)
			if dns {
				// The agent's DNS queries to a server on lo must not go through Envoy.
				dport = Match{Kind: DPort, Not: true, Values: []string{"53", tunnel}}
			}
			b.add(f, Nat, OutputChain, jump(RedirectIn), m(OutIface, "lo"), not(Dst, lo), tcp, dport, m(UID, id(uid)))
		})
		if !loInclude {
			if dns {
				// A DNS server on localhost is still captured.
				b.add(Any, Nat, OutputChain, ret, m(OutIface, "lo"), tcp, not(DPort, "53"), not(UID, id(uid)))
			} else {
				b.add(Any, Nat, OutputChain, ret, m(OutIface, "lo"), not(UID, id(uid)))
			}
		}
		// The proxy's own traffic, TCP or UDP, is never captured.
		b.add(Any, Nat, OutputChain, ret, m(UID, id(uid)))
	}
	for _, gid := range c.ProxyGIDs {
		b.versioned(loopback4, loopback6, func(f Family, lo string) {
			b.add(f, Nat, OutputChain, jump(RedirectIn), m(OutIface, "lo"), not(Dst, lo), tcp, not(DPort, tunnel), m(GID, id(gid)))
		})
		if !loInclude {
			if dns {
				b.add(Any, Nat, OutputChain, ret, m(OutIface, "lo"), tcp, not(DPort, "53"), not(GID, id(gid)))
			} else {
				b.add(Any, Nat, OutputChain, ret, m(OutIface, "lo"), not(GID, id(gid)))
			}
		}
		b.add(Any, Nat, OutputChain, ret, m(GID, id(gid)))
	}
	if dns {
		b.dnsRules()
	}
	b.versioned(loopback4, loopback6, func(f Family, lo string) {
		b.add(f, Nat, OutputChain, ret, m(Dst, lo))
	})
	for _, p := range c.ExcludeOutboundIPRanges {
		b.add(famOf(p), Nat, OutputChain, ret, m(Dst, p.String()))
	}
	for _, p := range c.OutboundPorts {
		b.add(Any, Nat, OutputChain, jump(RedirectOut), tcp, m(DPort, port(p)))
	}
	if c.OutboundIPRanges.All {
		b.add(Any, Nat, OutputChain, jump(RedirectOut))
		for _, i := range c.KubeVirtInterfaces {
			b.insert(Any, Nat, Prerouting, 1, jump(RedirectOut), m(InIface, i))
		}
		return
	}
	// Per family, v4 first, as Istio.
	for _, fam := range []Family{V4, V6} {
		for _, p := range c.OutboundIPRanges.List {
			if famOf(p) != fam {
				continue
			}
			for _, i := range c.KubeVirtInterfaces {
				b.insert(fam, Nat, Prerouting, 1, jump(RedirectOut), m(InIface, i), m(Dst, p.String()))
			}
			b.add(fam, Nat, OutputChain, jump(RedirectOut), m(Dst, p.String()))
		}
	}
}

// dnsRules capture port 53 to the agent's DNS proxy. Conntrack zones keep the two legs of a
// proxied UDP query apart — app↔agent in zone 2, agent↔upstream in zone 1 — so that the
// agent's upstream query, from the same 5-tuple space, is never matched to the app's NATed
// flow (the conntrack race that made queries loop or get lost).
func (b *builder) dnsRules() {
	c := b.cfg
	var v4, v6 []netip.Addr
	for _, a := range c.DNSServers {
		if a.Is4() {
			v4 = append(v4, a)
		} else {
			v6 = append(v6, a)
		}
	}
	dnsPort := Target{Kind: RedirectTo, Port: capture.DNSPort}
	b.add(Any, Raw, Output, jump(OutputDNS))
	switch {
	case c.CaptureAllDNS || len(v4) > 0 && len(v6) > 0:
		b.add(Any, Nat, OutputChain, jump(OutputDNS))
	case len(v4) > 0:
		b.add(V4, Nat, OutputChain, jump(OutputDNS))
	case len(v6) > 0:
		b.add(V6, Nat, OutputChain, jump(OutputDNS))
	}
	for _, proto := range []Match{tcp, udp} {
		if c.CaptureAllDNS {
			b.add(Any, Nat, OutputDNS, dnsPort, proto, m(DPort, "53"))
			continue
		}
		for _, a := range c.DNSServers {
			b.add(addrFam(a), Nat, OutputDNS, dnsPort, proto, m(DPort, "53"), m(Dst, host(a)))
		}
	}
	zone := func(z int) Target { return Target{Kind: CTZone, Zone: z} }
	for _, uid := range c.ProxyUIDs {
		b.add(Any, Raw, OutputDNS, zone(1), udp, m(DPort, "53"), m(UID, id(uid)))
		b.add(Any, Raw, OutputDNS, zone(2), udp, m(SPort, port(capture.DNSPort)), m(UID, id(uid)))
	}
	for _, gid := range c.ProxyGIDs {
		b.add(Any, Raw, OutputDNS, zone(1), udp, m(DPort, "53"), m(GID, id(gid)))
		b.add(Any, Raw, OutputDNS, zone(2), udp, m(SPort, port(capture.DNSPort)), m(GID, id(gid)))
	}
	if c.CaptureAllDNS {
		b.add(Any, Raw, Prerouting, jump(Inbound))
		b.add(Any, Raw, OutputDNS, zone(2), udp, m(DPort, "53"))
		b.add(Any, Raw, Inbound, zone(1), udp, m(SPort, "53"))
		return
	}
	for _, fam := range []Family{V4, V6} {
		servers := v4
		if fam == V6 {
			servers = v6
		}
		if len(servers) == 0 {
			continue
		}
		b.add(fam, Raw, Prerouting, jump(Inbound))
		for _, a := range servers {
			b.add(fam, Raw, OutputDNS, zone(2), udp, m(DPort, "53"), m(Dst, host(a)))
			b.add(fam, Raw, Inbound, zone(1), udp, m(SPort, "53"), m(Src, host(a)))
		}
	}
}

func addrFam(a netip.Addr) Family {
	if a.Is4() {
		return V4
	}
	return V6
}

func host(a netip.Addr) string { return netip.PrefixFrom(a, a.BitLen()).String() }

// tproxyMarks keep TPROXY's marks straight: a connection the proxy accepted keeps the mark on
// its replies (so they route back through lo), and the proxy's own connections to the app are
// told apart from the app's with the outbound mark.
func (b *builder) tproxyMarks() {
	c := b.cfg
	mark := id(c.TProxyMark)
	b.add(Any, Mangle, Prerouting, Target{Kind: SaveMark}, tcp, m(Mark, mark))
	b.add(Any, Mangle, Output, ret, tcp, m(OutIface, "lo"), m(Mark, mark))
	for _, ids := range []struct {
		kind MatchKind
		ids  []uint32
	}{{UID, c.ProxyUIDs}, {GID, c.ProxyGIDs}} {
		for _, i := range ids.ids {
			b.versioned(loopback4, loopback6, func(f Family, lo string) {
				b.add(f, Mangle, Output, Target{Kind: SetMark, Mark: outboundMark}, not(Dst, lo), tcp, m(OutIface, "lo"), m(ids.kind, id(i)))
			})
		}
	}
	b.add(Any, Mangle, Output, Target{Kind: RestoreMark}, tcp, m(ConnMark, mark))
	// Inserted at the head of ISTIO_INBOUND: what the proxy itself sends is never diverted.
	b.insert(Any, Mangle, Inbound, 1, ret, tcp, m(Mark, mark))
	b.insert(V4, Mangle, Inbound, 2, ret, tcp, m(Src, passthrough4), m(InIface, "lo"))
	b.insert(V6, Mangle, Inbound, 2, ret, tcp, m(Src, passthrough6), m(InIface, "lo"))
	b.insert(Any, Mangle, Inbound, 3, ret, tcp, m(InIface, "lo"), not(Mark, id(outboundMark)))
}
