package capture

import (
	"path/filepath"
	"strings"
	"testing"

	"sailplane.dev/shared/golden"
	"sailplane.dev/tools/testenv"
)

// templateArgs are what Istio's injection template passes istio-init for a pod without
// annotations; our flags default to them.
var templateArgs = []string{"-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT", "-i", "*", "-x", "", "-b", "*", "-d", "15090,15021,15020"}

// TestSameAsIstio runs each golden case's flags through Istio's own rule builder (`pilot-agent
// istio-iptables --dry-run`, iptables and --native-nftables) and fails when its rule set differs
// from ours, after normalizing syntax, the order of rules whose order changes nothing (runs of
// RETURNs) and jumps that change nothing (to a chain without rules for that family). Istio
// reads the pod's address (IPv6 or not) and resolv.conf from its network namespace, so it runs
// in one the test makes with the case's address and DNS servers.
//
// Differences on purpose, not visible here: our nftables rules are in one table
// (inet sailplane-capture, chains <table>-<chain>) where Istio uses three (istio-proxy-nat,
// -mangle, -raw), so clean-up deletes one table and a run replaces the rules in one
// transaction; our iptables rules in the built-in chains carry a comment, so a run or the
// clean-up finds them whatever config installed them; 15090, 15021 and the status port are
// excluded from inbound capture even when -d omits them (the excludeInboundPorts case).
func TestSameAsIstio(t *testing.T) {
	needRoot(t)
	agent := testenv.PilotAgentForTest(t)
	for _, dir := range golden.Cases(t, "testdata") {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			gc, cfg := loadCase(t, dir)
			args := gc.IstioArgs
			if args == nil {
				args = append(append([]string{}, templateArgs...), gc.Args...)
			}
			addr := "198.18.200.2/24"
			if gc.IPv6 {
				addr = "2001:2::2/64" // RFC 5180's benchmarking range; Istio enables IPv6 for an IPv6 pod
			}
			resolv := ""
			for _, s := range gc.ResolvConf {
				resolv += "nameserver " + s + "\n"
			}
			ns := newNetns(t, resolv, addr)
			r := Build(cfg, Options{IPv6: gc.IPv6})

			istioIPT := ns.Exec(t, agent, append([]string{"istio-iptables", "--dry-run"}, args...)...)
			ours, istio := normalized{}, normalized{}
			for _, f := range []struct {
				fam  Family
				name string
				bin  string
			}{{V4, "v4", "iptables-restore"}, {V6, "v6", "ip6tables-restore"}} {
				if err := normalizeIPTables(ours, f.name, r.IPTables(f.fam)); err != nil {
					t.Fatal(err)
				}
				if err := normalizeIPTables(istio, f.name, restoreInput(istioIPT, f.bin)); err != nil {
					t.Fatal(err)
				}
			}
			for _, n := range []normalized{ours, istio} {
				n.dropEmptyJumps()
				n.sortReturnRuns()
			}
			if d := diff(ours, istio); d != "" {
				t.Errorf("iptables rules differ from Istio's (pilot-agent istio-iptables --dry-run %s):\n%s", strings.Join(args, " "), d)
			}

			istioNFT := ns.Exec(t, agent, append([]string{"istio-iptables", "--dry-run", "--native-nftables"}, args...)...)
			ours, istio = normalized{}, normalized{}
			if err := normalizeNFT(ours, r.NFTText(), gc.IPv6, ourNFTTable); err != nil {
				t.Fatal(err)
			}
			_, programmed, ok := strings.Cut(istioNFT, "nftables rules programmed:")
			if !ok && cfg.Mode != "NONE" {
				t.Fatalf("pilot-agent printed no nftables rules:\n%s", istioNFT)
			}
			if err := normalizeNFT(istio, programmed, gc.IPv6, istioNFTTable); err != nil {
				t.Fatal(err)
			}
			for _, n := range []normalized{ours, istio} {
				n.dropEmptyJumps()
				n.sortReturnRuns()
			}
			if d := diff(ours, istio); gc.IstioNFTDiffers != "" {
				if d == "" {
					t.Errorf("the case says our nftables rules differ from Istio's (%s), but they are the same now", gc.IstioNFTDiffers)
				}
				t.Logf("differs from Istio's nftables rules on purpose: %s\n%s", gc.IstioNFTDiffers, d)
			} else if d != "" {
				t.Errorf("nftables rules differ from Istio's (pilot-agent istio-iptables --dry-run --native-nftables %s):\n%s", strings.Join(args, " "), d)
			}
			if len(ours) == 0 && cfg.Mode != "NONE" {
				t.Error("no rules compared")
			}
		})
	}
}

// restoreInput is the iptables-restore input pilot-agent logs for bin (iptables-restore or
// ip6tables-restore): the lines after "Running iptables restore with: <bin> …" up to the next
// log line.
func restoreInput(out, bin string) string {
	marker := "Running iptables restore with: " + bin + " and the following input:"
	_, rest, ok := strings.Cut(out, marker)
	if !ok {
		return ""
	}
	var b strings.Builder
	for _, line := range strings.Split(rest, "\n")[1:] {
		if strings.HasPrefix(line, "20") { // the next log line's timestamp
			break
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}
