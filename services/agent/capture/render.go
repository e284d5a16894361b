package capture

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"sigs.k8s.io/knftables"
)

// chainsOf lists the chains of table t in l that have rules or are jumped to, in declaration
// order.
func chainsOf(l chains, t Table) []string {
	used := map[string]bool{}
	for k, rs := range l {
		if k.table != t || len(rs) == 0 {
			continue
		}
		used[k.chain] = true
		for _, r := range rs {
			if r.Target.Kind == Jump {
				used[r.Target.Chain] = true
			}
		}
	}
	var out []string
	for _, c := range chainOrder {
		if used[c] {
			out = append(out, c)
		}
	}
	return out
}

// Comment marks our rules in the built-in chains, which are shared with others, so a later run
// or the clean-up finds them whatever config installed them. It carries a digest of the whole
// rule set: a run whose rules are already in place changes nothing.
const commentPrefix = "sailplane-capture"

// IPTables is the iptables-restore text of one family's rules (no COMMIT-less tables: a table
// without rules is left out); "" when there are none.
func (r *Rules) IPTables(f Family) string {
	body := r.iptablesBody(f, "")
	if body == "" {
		return ""
	}
	return r.iptablesBody(f, commentPrefix+":"+digest(body))
}

func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:6])
}

func (r *Rules) iptablesBody(f Family, comment string) string {
	l := r.family(f)
	if f == V6 && !r.IPv6 {
		return ""
	}
	var b strings.Builder
	for _, t := range []Table{Nat, Mangle, Raw} {
		declared := chainsOf(l, t)
		if len(declared) == 0 {
			continue
		}
		fmt.Fprintf(&b, "*%s\n", t)
		for _, c := range declared {
			if !builtin(c) {
				fmt.Fprintf(&b, ":%s - [0:0]\n", c)
			}
		}
		for _, c := range declared {
			for _, rule := range l[chainKey{t, c}] {
				fmt.Fprintf(&b, "-A %s %s\n", c, strings.Join(iptablesArgs(rule, comment), " "))
			}
		}
		b.WriteString("COMMIT\n")
	}
	return b.String()
}

// iptablesArgs renders a rule's matches and target; comment goes on rules of built-in chains.
func iptablesArgs(r Rule, comment string) []string {
	var a []string
	neg := func(not bool) {
		if not {
			a = append(a, "!")
		}
	}
	for _, mt := range r.Match {
		switch mt.Kind {
		case Proto:
			a = append(a, "-p", mt.Value)
		case DPort:
			if len(mt.Values) > 0 {
				a = append(a, "-m", "multiport")
				neg(mt.Not)
				a = append(a, "--dports", strings.Join(mt.Values, ","))
				continue
			}
			neg(mt.Not)
			a = append(a, "--dport", mt.Value)
		case SPort:
			neg(mt.Not)
			a = append(a, "--sport", mt.Value)
		case Src:
			neg(mt.Not)
			a = append(a, "-s", mt.Value)
		case Dst:
			neg(mt.Not)
			a = append(a, "-d", mt.Value)
		case InIface:
			neg(mt.Not)
			a = append(a, "-i", mt.Value)
		case OutIface:
			neg(mt.Not)
			a = append(a, "-o", mt.Value)
		case UID, GID:
			a = append(a, "-m", "owner")
			neg(mt.Not)
			opt := "--uid-owner"
			if mt.Kind == GID {
				opt = "--gid-owner"
			}
			a = append(a, opt, mt.Value)
		case CTState:
			a = append(a, "-m", "conntrack", "--ctstate", mt.Value)
		case Mark:
			a = append(a, "-m", "mark")
			neg(mt.Not)
			a = append(a, "--mark", mt.Value)
		case ConnMark:
			a = append(a, "-m", "connmark")
			neg(mt.Not)
			a = append(a, "--mark", mt.Value)
		}
	}
	if comment != "" && builtin(r.Chain) {
		a = append(a, "-m", "comment", "--comment", comment)
	}
	t := r.Target
	switch t.Kind {
	case Return:
		a = append(a, "-j", "RETURN")
	case Jump:
		a = append(a, "-j", t.Chain)
	case RedirectTo:
		a = append(a, "-j", "REDIRECT", "--to-ports", port(t.Port))
	case TProxyTo:
		a = append(a, "-j", "TPROXY", "--tproxy-mark", fmt.Sprintf("%d/0xffffffff", t.Mark), "--on-port", port(t.Port))
	case SetMark:
		a = append(a, "-j", "MARK", "--set-mark", id(t.Mark))
	case Accept:
		a = append(a, "-j", "ACCEPT")
	case Drop:
		a = append(a, "-j", "DROP")
	case SaveMark:
		a = append(a, "-j", "CONNMARK", "--save-mark")
	case RestoreMark:
		a = append(a, "-j", "CONNMARK", "--restore-mark")
	case CTZone:
		a = append(a, "-j", "CT", "--zone", fmt.Sprint(t.Zone))
	}
	return a
}

// NFTable is our one nftables table (inet: both IP versions). Each iptables table becomes
// base chains of its type and priority in it, and the chains are named <table>-<chain>
// (nat-istio-output), so clean-up is deleting one table.
const NFTable = "sailplane-capture"

// nftChain is the nftables name of an iptables-named chain.
func nftChain(t Table, chain string) string {
	return t.String() + "-" + strings.ReplaceAll(strings.ToLower(chain), "_", "-")
}

type baseChain struct {
	typ  knftables.BaseChainType
	hook knftables.BaseChainHook
	prio knftables.BaseChainPriority
}

// The hooks and priorities of iptables' tables, as Istio's nftables rules use them.
var baseChains = map[chainKey]baseChain{
	{Nat, Prerouting}:    {knftables.NATType, knftables.PreroutingHook, knftables.DNATPriority},
	{Nat, Output}:        {knftables.NATType, knftables.OutputHook, knftables.DNATPriority},
	{Mangle, Prerouting}: {knftables.FilterType, knftables.PreroutingHook, knftables.ManglePriority},
	{Mangle, Output}:     {knftables.RouteType, knftables.OutputHook, knftables.ManglePriority},
	{Raw, Prerouting}:    {knftables.FilterType, knftables.PreroutingHook, knftables.RawPriority},
	{Raw, Output}:        {knftables.FilterType, knftables.OutputHook, knftables.RawPriority},
}

// Merged is the rules of both families in one list per chain, as nftables' inet table holds
// them: a rule for both appears once, a family's own rules in their place.
func (r *Rules) Merged() chains {
	out := chains{}
	keys := map[chainKey]bool{}
	for k := range r.v4 {
		keys[k] = true
	}
	for k := range r.v6 {
		keys[k] = true
	}
	for k := range keys {
		a, b := r.v4[k], r.v6[k]
		var merged []Rule
		j := 0
		for _, rule := range a {
			if rule.Family == Any {
				// Emit b's own rules that precede this shared one.
				for j < len(b) && b[j].Family != Any {
					merged = append(merged, b[j])
					j++
				}
				j++ // the shared rule itself, also in b
			}
			merged = append(merged, rule)
		}
		merged = append(merged, b[min(j, len(b)):]...)
		out[k] = merged
	}
	return out
}

// NFTables is the transaction that installs the rules: one table, replaced whole (delete and
// re-add in the same transaction, so the kernel switches atomically and nothing of an older
// rule set stays). The first rule's comment carries the rule set's digest.
func (r *Rules) NFTables(tx *knftables.Transaction) {
	rules := r.nftRules()
	if len(rules) == 0 {
		return
	}
	// The digest goes on the first rule: nft lists rule comments in JSON, not table ones.
	rules[0].Comment = knftables.PtrTo(commentPrefix + ":" + digest(nftBody(rules)))
	tx.Add(&knftables.Table{})
	tx.Delete(&knftables.Table{})
	tx.Add(&knftables.Table{})
	for _, c := range r.nftChains() {
		tx.Add(c)
	}
	for _, rule := range rules {
		tx.Add(rule)
	}
}

// NFTDigest is the digest NFTables writes in the first rule's comment ("" without rules).
func (r *Rules) NFTDigest() string {
	rules := r.nftRules()
	if len(rules) == 0 {
		return ""
	}
	return commentPrefix + ":" + digest(nftBody(rules))
}

func nftBody(rules []*knftables.Rule) string {
	var b strings.Builder
	for _, r := range rules {
		fmt.Fprintf(&b, "%s %s\n", r.Chain, r.Rule)
	}
	return b.String()
}

func (r *Rules) nftChains() []*knftables.Chain {
	l := r.Merged()
	var out []*knftables.Chain
	for _, t := range []Table{Nat, Mangle, Raw} {
		for _, c := range chainsOf(l, t) {
			ch := &knftables.Chain{Name: nftChain(t, c)}
			if bc, ok := baseChains[chainKey{t, c}]; ok {
				ch.Type, ch.Hook, ch.Priority = knftables.PtrTo(bc.typ), knftables.PtrTo(bc.hook), knftables.PtrTo(bc.prio)
			}
			out = append(out, ch)
		}
	}
	return out
}

// nftCounts is how many chains and rules the table holds once installed.
func (r *Rules) nftCounts() (chains, rules int) {
	return len(r.nftChains()), len(r.nftRules())
}

func (r *Rules) nftRules() []*knftables.Rule {
	l := r.Merged()
	var out []*knftables.Rule
	for _, t := range []Table{Nat, Mangle, Raw} {
		for _, c := range chainsOf(l, t) {
			for _, rule := range l[chainKey{t, c}] {
				out = append(out, &knftables.Rule{Chain: nftChain(t, c), Rule: nftExpr(rule)})
			}
		}
	}
	return out
}

func nftExpr(r Rule) string {
	var a []string
	op := func(not bool) {
		if not {
			a = append(a, "!=")
		}
	}
	ipOf := func(prefix string) string {
		if strings.Contains(prefix, ":") {
			return "ip6"
		}
		return "ip"
	}
	proto := "tcp"
	hasAddr := false
	for _, mt := range r.Match {
		if mt.Kind == Proto {
			proto = mt.Value
		}
		if mt.Kind == Src || mt.Kind == Dst {
			hasAddr = true
		}
	}
	// An inet table sees both families: a family's rule that tests no address says which.
	if !hasAddr && r.Family != Any {
		fam := "ipv4"
		if r.Family == V6 {
			fam = "ipv6"
		}
		a = append(a, "meta", "nfproto", fam)
	}
	for _, mt := range r.Match {
		switch mt.Kind {
		case Proto:
			a = append(a, "meta", "l4proto", mt.Value)
		case DPort, SPort:
			field := "dport"
			if mt.Kind == SPort {
				field = "sport"
			}
			a = append(a, proto, field)
			op(mt.Not)
			if len(mt.Values) > 0 {
				a = append(a, "{ "+strings.Join(mt.Values, ", ")+" }")
			} else {
				a = append(a, mt.Value)
			}
		case Src, Dst:
			field := "saddr"
			if mt.Kind == Dst {
				field = "daddr"
			}
			a = append(a, ipOf(mt.Value), field)
			op(mt.Not)
			a = append(a, mt.Value)
		case InIface, OutIface:
			name := "iifname"
			if mt.Kind == OutIface {
				name = "oifname"
			}
			a = append(a, name)
			op(mt.Not)
			a = append(a, mt.Value)
		case UID, GID:
			name := "skuid"
			if mt.Kind == GID {
				name = "skgid"
			}
			a = append(a, "meta", name)
			op(mt.Not)
			a = append(a, mt.Value)
		case CTState:
			a = append(a, "ct", "state", strings.ToLower(mt.Value))
		case Mark:
			a = append(a, "meta", "mark")
			op(mt.Not)
			a = append(a, mt.Value)
		case ConnMark:
			a = append(a, "ct", "mark")
			op(mt.Not)
			a = append(a, mt.Value)
		}
	}
	a = append(a, "counter")
	t := r.Target
	switch t.Kind {
	case Return:
		a = append(a, "return")
	case Jump:
		a = append(a, "jump", nftChain(r.Table, t.Chain))
	case RedirectTo:
		a = append(a, "redirect", "to", ":"+port(t.Port))
	case TProxyTo:
		fam := "ip"
		if r.Family == V6 {
			fam = "ip6"
		}
		a = append(a, "tproxy", fam, "to", ":"+port(t.Port), "meta", "mark", "set", id(t.Mark), "accept")
	case SetMark:
		a = append(a, "meta", "mark", "set", id(t.Mark))
	case Accept:
		a = append(a, "accept")
	case Drop:
		a = append(a, "drop")
	case SaveMark:
		a = append(a, "ct", "mark", "set", "mark")
	case RestoreMark:
		a = append(a, "meta", "mark", "set", "ct", "mark")
	case CTZone:
		a = append(a, "ct", "zone", "set", fmt.Sprint(t.Zone))
	}
	return strings.Join(a, " ")
}

// Text is the nftables transaction as `nft -f` text, for --dry-run and the golden files.
func (r *Rules) NFTText() string {
	nft := knftables.NewFake(knftables.InetFamily, NFTable)
	tx := nft.NewTransaction()
	r.NFTables(tx)
	return tx.String()
}
