package capture

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// A rule set normalized for comparison: per IP family, table and chain (iptables names), the
// rules in order, each as its sorted matches and its action. Both sides' syntax variants are
// folded (`--to-port`/`--to-ports`, `meta skuid`/`skuid`, counters, comments, a protocol test
// implied by a port test), and nftables' inet rules are split by the family they can match, so
// a v4-only and a v6-only rule in either order compare equal.
type normalized map[string][]string // "v4 nat ISTIO_OUTPUT" → rules

func (n normalized) add(fam, table, chain string, pos int, rule string) {
	k := fam + " " + table + " " + chain
	l := n[k]
	if pos < 0 || pos >= len(l) {
		n[k] = append(l, rule)
		return
	}
	n[k] = slices.Insert(l, pos, rule)
}

// normalizeIPTables reads iptables-restore text for one family (v4 or v6).
func normalizeIPTables(n normalized, fam, text string) error {
	table := ""
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		f := strings.Fields(line)
		switch {
		case line == "" || line == "COMMIT" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ":") || strings.HasPrefix(line, "-N "):
		case strings.HasPrefix(line, "*"):
			table = strings.TrimSpace(line[1:])
		case f[0] == "-A" && len(f) >= 2:
			n.add(fam, table, f[1], -1, iptRule(f[2:]))
		case f[0] == "-I" && len(f) >= 3:
			pos, err := strconv.Atoi(f[2])
			if err != nil {
				return fmt.Errorf("%q: %w", line, err)
			}
			n.add(fam, table, f[1], pos-1, iptRule(f[3:]))
		default:
			return fmt.Errorf("unexpected restore line %q", line)
		}
	}
	return nil
}

func iptRule(args []string) string {
	var matches []string
	var target []string
	module := ""
	for i := 0; i < len(args); i++ {
		a := args[i]
		neg := ""
		if a == "!" {
			neg, i = "! ", i+1
			a = args[i]
		}
		switch {
		case a == "-m":
			module = args[i+1]
			i++
		case a == "--comment":
			i++
		case a == "-j":
			target = args[i+1:]
			i = len(args)
		default:
			name := a
			if a == "--mark" {
				name = module + " --mark"
			}
			matches = append(matches, neg+name+" "+args[i+1])
			i++
		}
	}
	for i, t := range target {
		if t == "--to-port" {
			target[i] = "--to-ports"
		}
	}
	slices.Sort(matches)
	return strings.Join(matches, " ; ") + " => " + strings.Join(target, " ")
}

// normalizeNFT reads nft text (add/insert rule lines; tables mapped by tableOf). Inserts are
// placed in the table as nft would (positions count both families' rules), then each family's
// view is taken.
func normalizeNFT(n normalized, text string, ipv6 bool, tableOf func(table, chain string) (string, string)) error {
	type famRule struct {
		fams []string
		rule string
	}
	combined := map[[2]string][]famRule{}
	var order [][2]string
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || f[1] != "rule" {
			continue
		}
		table, chain := tableOf(f[3], f[4])
		rest := f[5:]
		pos := -1
		if f[0] == "insert" && len(rest) >= 2 && rest[0] == "index" {
			p, err := strconv.Atoi(rest[1])
			if err != nil {
				return fmt.Errorf("%q: %w", line, err)
			}
			pos, rest = p, rest[2:]
		}
		fams, rule, err := nftRule(rest, func(c string) string { _, c = tableOf(f[3], c); return c })
		if err != nil {
			return fmt.Errorf("%q: %w", line, err)
		}
		k := [2]string{table, chain}
		if _, ok := combined[k]; !ok {
			order = append(order, k)
		}
		l := combined[k]
		if pos < 0 || pos >= len(l) {
			combined[k] = append(l, famRule{fams, rule})
		} else {
			combined[k] = slices.Insert(l, pos, famRule{fams, rule})
		}
	}
	for _, k := range order {
		for _, r := range combined[k] {
			for _, fam := range r.fams {
				if fam == "v6" && !ipv6 {
					continue
				}
				n.add(fam, k[0], k[1], -1, r.rule)
			}
		}
	}
	return nil
}

// dropEmptyJumps removes jumps to chains that hold no rule for that family: they change
// nothing (Istio's nftables jumps to its DNS chains for both families when only IPv4 servers
// have rules there; ours test the family first).
func (n normalized) dropEmptyJumps() {
	for changed := true; changed; {
		changed = false
		for k, l := range n {
			fam, rest, _ := strings.Cut(k, " ")
			table, _, _ := strings.Cut(rest, " ")
			kept := slices.DeleteFunc(slices.Clone(l), func(r string) bool {
				_, target, ok := strings.Cut(r, "=> jump ")
				if !ok {
					_, target, ok = strings.Cut(r, "=> ")
					if !ok || !strings.HasPrefix(target, "ISTIO_") {
						return false
					}
				}
				return len(n[fam+" "+table+" "+target]) == 0
			})
			if len(kept) != len(l) {
				n[k], changed = kept, true
			}
		}
	}
}

// sortReturnRuns sorts each run of consecutive rules that only return: which of them matches
// first changes nothing.
func (n normalized) sortReturnRuns() {
	for _, l := range n {
		for i := 0; i < len(l); {
			j := i
			for j < len(l) && (strings.HasSuffix(l[j], "=> RETURN") || strings.HasSuffix(l[j], "=> return")) {
				j++
			}
			if j > i {
				slices.Sort(l[i:j])
				i = j
			} else {
				i++
			}
		}
	}
}

// nftRule splits an nft rule into match units and statements.
func nftRule(tok []string, chain func(string) string) ([]string, string, error) {
	var t []string
	for i := 0; i < len(tok); i++ {
		switch tok[i] {
		case "meta", "counter":
		case "comment": // and its one-word quoted text
			i++
		default:
			t = append(t, tok[i])
		}
	}
	var matches, stmts []string
	fam := ""
	protoPort := map[string]bool{}
	value := func(i int) (string, int) {
		if t[i] != "{" {
			return t[i], i + 1
		}
		j := i
		for j < len(t) && t[j] != "}" {
			j++
		}
		return strings.Join(t[i:j+1], " "), j + 1
	}
	for i := 0; i < len(t); {
		w := t[i]
		neg := func(j int) (string, int) {
			if j < len(t) && t[j] == "!=" {
				return "!= ", j + 1
			}
			return "", j
		}
		switch w {
		case "l4proto", "nfproto":
			matches = append(matches, w+" "+t[i+1])
			i += 2
		case "tcp", "udp":
			op, j := neg(i + 2)
			v, j := value(j)
			protoPort[w] = true
			matches = append(matches, w+" "+t[i+1]+" "+op+v)
			i = j
		case "ip", "ip6":
			if w == "ip" {
				fam = "v4"
			} else {
				fam = "v6"
			}
			op, j := neg(i + 2)
			matches = append(matches, w+" "+t[i+1]+" "+op+t[j])
			i = j + 1
		case "oifname", "iifname", "skuid", "skgid":
			op, j := neg(i + 1)
			matches = append(matches, w+" "+op+t[j])
			i = j + 1
		case "ct":
			switch {
			case t[i+1] == "state":
				matches = append(matches, "ct state "+t[i+2])
				i += 3
			case t[i+1] == "mark" && t[i+2] == "set":
				stmts = append(stmts, "ct mark set "+t[i+3])
				i += 4
			case t[i+1] == "mark":
				op, j := neg(i + 2)
				matches = append(matches, "ct mark "+op+t[j])
				i = j + 1
			case t[i+1] == "zone":
				stmts = append(stmts, "ct zone set "+t[i+3])
				i += 4
			default:
				return nil, "", fmt.Errorf("unknown ct expression at %q", t[i:])
			}
		case "mark":
			if t[i+1] == "set" {
				if t[i+2] == "ct" {
					stmts = append(stmts, "mark set ct mark")
					i += 4
				} else {
					stmts = append(stmts, "mark set "+t[i+2])
					i += 3
				}
				continue
			}
			op, j := neg(i + 1)
			matches = append(matches, "mark "+op+t[j])
			i = j + 1
		case "return", "accept", "drop":
			stmts = append(stmts, w)
			i++
		case "jump":
			stmts = append(stmts, "jump "+chain(t[i+1]))
			i += 2
		case "redirect":
			stmts = append(stmts, "redirect to "+t[i+2])
			i += 3
		case "tproxy":
			stmts = append(stmts, "tproxy "+t[i+1]+" to "+t[i+3])
			i += 4
		default:
			return nil, "", fmt.Errorf("unknown expression at %q", t[i:])
		}
	}
	// A port test implies its protocol; an address test its family.
	matches = slices.DeleteFunc(matches, func(m string) bool {
		return m == "l4proto tcp" && protoPort["tcp"] || m == "l4proto udp" && protoPort["udp"] ||
			strings.HasPrefix(m, "nfproto ")
	})
	if fam == "" {
		for _, x := range tok {
			if x == "ipv4" {
				fam = "v4"
			} else if x == "ipv6" {
				fam = "v6"
			}
		}
	}
	slices.Sort(matches)
	rule := strings.Join(matches, " ; ") + " => " + strings.Join(stmts, " ")
	switch fam {
	case "v4":
		return []string{"v4"}, rule, nil
	case "v6":
		return []string{"v6"}, rule, nil
	}
	return []string{"v4", "v6"}, rule, nil
}

// istioNFTTable maps Istio's tables (istio-proxy-nat…) and chains to iptables names.
func istioNFTTable(table, chain string) (string, string) {
	return strings.TrimPrefix(table, "istio-proxy-"), iptName(chain)
}

// ourNFTTable maps our one table's <table>-<chain> names.
func ourNFTTable(_, chain string) (string, string) {
	table, rest, _ := strings.Cut(chain, "-")
	return table, iptName(rest)
}

func iptName(chain string) string { return strings.ToUpper(strings.ReplaceAll(chain, "-", "_")) }

// diff describes how two normalized sets differ, "" when equal.
func diff(ours, istio normalized) string {
	var b strings.Builder
	keys := map[string]bool{}
	for k := range ours {
		keys[k] = true
	}
	for k := range istio {
		keys[k] = true
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	slices.Sort(sorted)
	for _, k := range sorted {
		if !slices.Equal(ours[k], istio[k]) {
			fmt.Fprintf(&b, "%s:\n  ours:\n    %s\n  istio:\n    %s\n", k, strings.Join(ours[k], "\n    "), strings.Join(istio[k], "\n    "))
		}
	}
	return b.String()
}
