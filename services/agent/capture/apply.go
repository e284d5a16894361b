package capture

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"slices"
	"strings"

	"sigs.k8s.io/knftables"
)

// Backend is how the rules reach the kernel.
type Backend string

const (
	NFTables Backend = "nftables" // native nftables through knftables (nft)
	IPTables Backend = "iptables" // iptables-restore / ip6tables-restore
)

// DetectBackend is nftables when a working nft is installed, else iptables.
func DetectBackend() Backend {
	if _, err := exec.LookPath("nft"); err == nil {
		return NFTables
	}
	return IPTables
}

// available says which program a backend lacks: the image that runs capture must have them.
func (b Backend) available(ipv6 bool) error {
	need := []string{"nft"}
	if b == IPTables {
		need = []string{"iptables-restore", "iptables-save"}
		if ipv6 {
			need = append(need, "ip6tables-restore", "ip6tables-save")
		}
	}
	for _, p := range need {
		if _, err := exec.LookPath(p); err != nil {
			return fmt.Errorf("capture backend %s needs %s, which is not installed (the capture image needs nftables, or iptables, and iproute2): %w", b, p, err)
		}
	}
	return nil
}

// Installer applies rules in the current network namespace (the init container's, or the one
// the caller's thread is in).
type Installer struct {
	Backend Backend
	Log     *slog.Logger
}

// Apply installs r, replacing any rule set an earlier run installed; it changes nothing when
// the same rules are already in place (changed false). The kernel switches from the old rules
// to the new ones in one step: one nft transaction, or one iptables-restore per table.
func (in Installer) Apply(ctx context.Context, r *Rules) (changed bool, err error) {
	if err := in.Backend.available(r.IPv6); err != nil {
		return false, err
	}
	switch in.Backend {
	case NFTables:
		return in.applyNFT(ctx, r)
	case IPTables:
		for _, f := range in.families(r) {
			c, err := in.applyIPT(ctx, r, f)
			if err != nil {
				return changed, err
			}
			changed = changed || c
		}
		return changed, nil
	}
	return false, fmt.Errorf("capture backend %q: want nftables or iptables", in.Backend)
}

// Cleanup removes every rule Apply may have installed, with either backend: our nftables table
// and, for IPv4 and IPv6, our rules in the built-in chains and the ISTIO_* chains.
func (in Installer) Cleanup(ctx context.Context) error {
	var errs []error
	if _, err := exec.LookPath("nft"); err == nil {
		st, err := nftState(ctx)
		if err != nil {
			errs = append(errs, err)
		} else if st.exists {
			errs = append(errs, runNFT(ctx, func(tx *knftables.Transaction) { tx.Delete(&knftables.Table{}) }))
		}
	}
	empty := &Rules{v4: chains{}, v6: chains{}, IPv6: true}
	for _, f := range []Family{V4, V6} {
		if _, err := exec.LookPath(iptBinary(f, "restore")); err != nil {
			continue
		}
		if _, err := in.applyIPT(ctx, empty, f); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (in Installer) families(r *Rules) []Family {
	if r.IPv6 {
		return []Family{V4, V6}
	}
	return []Family{V4}
}

func runNFT(ctx context.Context, fill func(*knftables.Transaction)) error {
	nft, err := knftables.New(knftables.InetFamily, NFTable)
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	tx := nft.NewTransaction()
	fill(tx)
	if err := nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	return nil
}

type nftTableState struct {
	exists        bool
	comment       string
	chains, rules int
}

// nftState reads our table from the kernel (`nft -j list table`).
func nftState(ctx context.Context) (nftTableState, error) {
	var out, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "nft", "-j", "list", "table", "inet", NFTable)
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		if strings.Contains(stderr.String(), "No such file") {
			return nftTableState{}, nil
		}
		return nftTableState{}, fmt.Errorf("nft list table inet %s: %w: %s", NFTable, err, strings.TrimSpace(stderr.String()))
	}
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		return nftTableState{}, fmt.Errorf("nft list table inet %s: %w", NFTable, err)
	}
	st := nftTableState{exists: true}
	for _, obj := range doc.Nftables {
		switch {
		case obj["chain"] != nil:
			st.chains++
		case obj["rule"] != nil:
			st.rules++
			var r struct {
				Comment string `json:"comment"`
			}
			_ = json.Unmarshal(obj["rule"], &r)
			if strings.HasPrefix(r.Comment, commentPrefix+":") {
				st.comment = r.Comment
			}
		}
	}
	return st, nil
}

func (in Installer) applyNFT(ctx context.Context, r *Rules) (bool, error) {
	st, err := nftState(ctx)
	if err != nil {
		return false, err
	}
	want := r.NFTDigest()
	if want == "" {
		if !st.exists {
			return false, nil
		}
		return true, runNFT(ctx, func(tx *knftables.Transaction) { tx.Delete(&knftables.Table{}) })
	}
	chains, rules := r.nftCounts()
	if st.exists && st.comment == want && st.chains == chains && st.rules == rules {
		in.Log.Info("capture rules already in place", "backend", NFTables, "table", "inet "+NFTable)
		return false, nil
	}
	if err := runNFT(ctx, r.NFTables); err != nil {
		return false, err
	}
	in.Log.Info("capture rules installed", "backend", NFTables, "table", "inet "+NFTable, "chains", chains, "rules", rules)
	return true, nil
}

func iptBinary(f Family, verb string) string {
	if f == V6 {
		return "ip6tables-" + verb
	}
	return "iptables-" + verb
}

// iptTableState is what iptables-save shows of ours in one table.
type iptTableState struct {
	istioChains map[string]int // ISTIO_* chain → its rule count
	marked      []string       // our rules in built-in chains, as iptables-save prints them ("-A OUTPUT …")
}

// iptState parses iptables-save's output for the nat, mangle and raw tables.
func iptState(save string) map[string]*iptTableState {
	out := map[string]*iptTableState{}
	var cur *iptTableState
	for _, line := range strings.Split(save, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "*"):
			name := line[1:]
			cur = nil
			if name == "nat" || name == "mangle" || name == "raw" {
				cur = &iptTableState{istioChains: map[string]int{}}
				out[name] = cur
			}
		case cur == nil:
		case strings.HasPrefix(line, ":ISTIO_"):
			cur.istioChains[strings.Fields(line[1:])[0]] += 0
		case strings.HasPrefix(line, "-A "):
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			if strings.HasPrefix(f[1], "ISTIO_") {
				cur.istioChains[f[1]]++
			} else if strings.Contains(line, commentPrefix+":") {
				cur.marked = append(cur.marked, line)
			}
		}
	}
	return out
}

func runCmd(ctx context.Context, stdin string, name string, args ...string) (string, error) {
	var out, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out.String(), nil
}

// applyIPT makes one family's iptables state r's: our rules in the built-in chains are
// deleted and the ISTIO_* chains flushed, emptied ones removed and r's rules added, per table
// in one iptables-restore --noflush (atomic per table), leaving others' rules alone.
func (in Installer) applyIPT(ctx context.Context, r *Rules, f Family) (bool, error) {
	save, err := runCmd(ctx, "", iptBinary(f, "save"))
	if err != nil {
		return false, err
	}
	cur := iptState(save)
	want := iptState(r.IPTables(f))
	if iptEqual(cur, want) {
		if len(want) > 0 {
			in.Log.Info("capture rules already in place", "backend", IPTables, "family", famName(f))
		}
		return false, nil
	}
	desired := r.IPTables(f)
	var b strings.Builder
	for _, t := range []string{"nat", "mangle", "raw"} {
		c, w := cur[t], want[t]
		if (c == nil || len(c.istioChains) == 0 && len(c.marked) == 0) && w == nil {
			continue
		}
		fmt.Fprintf(&b, "*%s\n", t)
		var chains []string
		if c != nil {
			for ch := range c.istioChains {
				chains = append(chains, ch)
			}
		}
		if w != nil {
			for ch := range w.istioChains {
				if c == nil || !hasKey(c.istioChains, ch) {
					chains = append(chains, ch)
				}
			}
		}
		slices.Sort(chains)
		// Declaring a chain in --noflush mode creates it or empties it.
		for _, ch := range chains {
			fmt.Fprintf(&b, ":%s - [0:0]\n", ch)
		}
		if c != nil {
			for _, rule := range c.marked {
				b.WriteString("-D" + strings.TrimPrefix(rule, "-A") + "\n")
			}
			for _, ch := range chains {
				if w == nil || !hasKey(w.istioChains, ch) {
					fmt.Fprintf(&b, "-X %s\n", ch)
				}
			}
		}
		b.WriteString(tableRules(desired, t))
		b.WriteString("COMMIT\n")
	}
	if b.Len() == 0 {
		return false, nil
	}
	if _, err := runCmd(ctx, b.String(), iptBinary(f, "restore"), "--noflush"); err != nil {
		return false, err
	}
	if err := dropEmptyXtables(ctx, f); err != nil {
		return true, err
	}
	if len(want) > 0 {
		in.Log.Info("capture rules installed", "backend", IPTables, "family", famName(f))
	}
	return true, nil
}

// dropEmptyXtables deletes the nat, mangle and raw tables iptables-nft leaves behind once
// their last rule is gone (empty built-in chains, policy accept): a table we emptied, or did
// not need, is then as absent as before we ran. Legacy iptables' tables are the kernel's.
func dropEmptyXtables(ctx context.Context, f Family) error {
	ver, err := runCmd(ctx, "", strings.TrimSuffix(iptBinary(f, ""), "-"), "--version")
	if err != nil || !strings.Contains(ver, "nf_tables") {
		return nil
	}
	fam := "ip"
	if f == V6 {
		fam = "ip6"
	}
	for _, t := range []string{"nat", "mangle", "raw"} {
		out, err := runCmd(ctx, "", "nft", "-j", "list", "table", fam, t)
		if err != nil {
			continue // no such table
		}
		var doc struct {
			Nftables []map[string]json.RawMessage `json:"nftables"`
		}
		if json.Unmarshal([]byte(out), &doc) != nil {
			continue
		}
		empty := true
		for _, obj := range doc.Nftables {
			for kind, body := range obj {
				switch kind {
				case "metainfo", "table":
				case "chain":
					var c struct {
						Policy string `json:"policy"`
					}
					_ = json.Unmarshal(body, &c)
					empty = empty && (c.Policy == "" || c.Policy == "accept")
				default: // a rule, set, map…
					empty = false
				}
			}
		}
		if empty {
			if _, err := runCmd(ctx, "", "nft", "delete", "table", fam, t); err != nil {
				return err
			}
		}
	}
	return nil
}

func hasKey(m map[string]int, k string) bool { _, ok := m[k]; return ok }

func famName(f Family) string {
	if f == V6 {
		return "IPv6"
	}
	return "IPv4"
}

// tableRules are the -A lines of table t in restore text.
func tableRules(restore, t string) string {
	var b strings.Builder
	in := false
	for _, line := range strings.Split(restore, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			in = line[1:] == t
		case in && strings.HasPrefix(line, "-A "):
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// iptEqual: the same ISTIO_* chains with as many rules, and our built-in chains' rules carry
// the same digest (iptables-save rewrites rule text, so the digest is what is compared).
func iptEqual(cur, want map[string]*iptTableState) bool {
	for _, t := range []string{"nat", "mangle", "raw"} {
		c, w := cur[t], want[t]
		if c == nil {
			c = &iptTableState{istioChains: map[string]int{}}
		}
		if w == nil {
			w = &iptTableState{istioChains: map[string]int{}}
		}
		if len(c.istioChains) != len(w.istioChains) || len(c.marked) != len(w.marked) {
			return false
		}
		for ch, n := range w.istioChains {
			if cn, ok := c.istioChains[ch]; !ok || cn != n {
				return false
			}
		}
		for i := range w.marked {
			if markOf(c.marked[i]) != markOf(w.marked[i]) {
				return false
			}
		}
	}
	return true
}

func markOf(rule string) string {
	i := strings.Index(rule, commentPrefix+":")
	if i < 0 {
		return ""
	}
	return strings.Trim(strings.Fields(rule[i:])[0], `"`)
}
