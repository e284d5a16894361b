package capture

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
)

var (
	agentOnce sync.Once
	agentBin  string
	agentErr  error
	agentOut  []byte
)

// agentBinary builds the agent command once per test process: the kernel tests install rules
// with the real binary, as the init container does.
func agentBinary(t testing.TB) string {
	t.Helper()
	agentOnce.Do(func() {
		dir, err := exec.Command("mktemp", "-d").Output()
		if err != nil {
			agentErr = err
			return
		}
		agentBin = filepath.Join(strings.TrimSpace(string(dir)), "agent")
		agentOut, agentErr = exec.Command("go", "build", "-o", agentBin, "sailplane.dev/services/agent/cmd").CombinedOutput()
	})
	if agentErr != nil {
		t.Fatalf("go build the agent: %v\n%s", agentErr, agentOut)
	}
	return agentBin
}

var (
	generated = regexp.MustCompile(`(?m)^#.*\n`)
	// Counters move with the namespace's own IPv6 chatter (neighbour discovery): not state.
	counters = regexp.MustCompile(`packets \d+ bytes \d+`)
)

// kernelState is everything capture may change in the namespace: nftables (with handles, so a
// table replaced by an identical one shows), iptables and ip6tables, policy routing, lo's
// addresses.
func kernelState(t *testing.T, ns *testNetns, handles bool) string {
	t.Helper()
	nft := []string{"list", "ruleset"}
	if handles {
		nft = []string{"-a", "list", "ruleset"}
	}
	var b strings.Builder
	b.WriteString("## nft\n" + counters.ReplaceAllString(ns.Exec(t, "nft", nft...), ""))
	b.WriteString("## iptables\n" + generated.ReplaceAllString(ns.Exec(t, "iptables-save"), ""))
	b.WriteString("## ip6tables\n" + generated.ReplaceAllString(ns.Exec(t, "ip6tables-save"), ""))
	b.WriteString("## ip rule\n" + ns.IP(t, "-4", "rule") + ns.IP(t, "-6", "rule"))
	b.WriteString("## routes\n" + ns.IP(t, "-4", "route", "show", "table", "all") + ns.IP(t, "-6", "route", "show", "table", "all"))
	b.WriteString("## lo\n" + ns.IP(t, "addr", "show", "dev", "lo"))
	return b.String()
}

// TestKernel installs the rules with the real `agent capture` in namespaces the test creates,
// with both backends: they are in the kernel, a second run changes nothing, a run with other
// flags leaves exactly what a fresh run of those flags does, and the clean-up leaves the tables
// as they were.
func TestKernel(t *testing.T) {
	needRoot(t, "nft", "iptables-restore", "ip6tables-restore", "iptables-save", "ip6tables-save")
	bin := agentBinary(t)
	cases := []struct {
		name        string
		args, other []string
		want        map[Backend][]string // in the installed state
	}{
		{
			name:  "defaults",
			other: []string{"-b", "8080", "-x", "10.0.0.0/8", "-c", "eth1"},
			want: map[Backend][]string{
				NFTables: {"table inet sailplane-capture", "redirect to :15001", "redirect to :15006", "tcp dport 15008 counter  return", "meta skuid 1337 counter  return", "ip saddr 127.0.0.6"},
				IPTables: {"-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001", "-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006", "-A ISTIO_INBOUND -p tcp -m tcp --dport 15008 -j RETURN", "--uid-owner 1337 -j RETURN", "-A OUTPUT -m comment --comment \"sailplane-capture:"},
			},
		},
		{
			name:  "tproxy-ipv6-dns",
			args:  []string{"-m", "TPROXY", "--redirect-dns", "-k", "net1"},
			other: []string{"--redirect-dns", "--capture-all-dns"},
			want: map[Backend][]string{
				NFTables: {"tproxy ip to :15006", "tproxy ip6 to :15006", "ct zone set 1", "udp dport 53 ip daddr 10.96.0.10 counter  redirect to :15053", "udp dport 53 ip6 daddr fd00::10 counter  redirect to :15053", "fwmark 0x539 lookup 133", "inet6 ::6/128", "local default dev lo table 133"},
				IPTables: {"-j TPROXY --on-port 15006", "-j CT --zone 1", "-d 10.96.0.10/32 -p udp -m udp --dport 53 -j REDIRECT --to-ports 15053", "-d fd00::10/128 -p udp -m udp --dport 53 -j REDIRECT --to-ports 15053", "fwmark 0x539 lookup 133", "inet6 ::6/128"},
			},
		},
	}
	for _, backend := range []Backend{NFTables, IPTables} {
		for _, tc := range cases {
			t.Run(string(backend)+"/"+tc.name, func(t *testing.T) {
				resolv := "nameserver 10.96.0.10\nnameserver fd00::10\n"
				capture := func(ns *testNetns, args ...string) string {
					return ns.Exec(t, bin, append([]string{"capture", "--backend", string(backend)}, args...)...)
				}
				ns := newNetns(t, resolv, "198.18.200.2/24", "2001:2::2/64")
				before := kernelState(t, ns, true)

				out := capture(ns, tc.args...)
				installed := kernelState(t, ns, true)
				for _, w := range tc.want[backend] {
					if !strings.Contains(installed, w) {
						t.Errorf("after `agent capture %s`, %q is not in the kernel:\n%s\n%s", strings.Join(tc.args, " "), w, out, installed)
					}
				}
				if installed == before {
					t.Fatal("agent capture changed nothing")
				}

				out = capture(ns, tc.args...)
				if again := kernelState(t, ns, true); again != installed {
					t.Errorf("a second run changed the kernel's state:\n%s\nbefore:\n%s\nafter:\n%s", out, installed, again)
				}
				if !strings.Contains(out, "already in place") {
					t.Errorf("the second run did not find its rules in place:\n%s", out)
				}

				// Other flags over the first: what a fresh namespace gets with them, nothing of the first left.
				capture(ns, tc.other...)
				replaced := kernelState(t, ns, false)
				fresh := newNetns(t, resolv, "198.18.200.2/24", "2001:2::2/64")
				capture(fresh, tc.other...)
				if want := kernelState(t, fresh, false); replaced != want {
					t.Errorf("rules replaced by `agent capture %s` differ from a fresh run's:\n%s\nfresh:\n%s", strings.Join(tc.other, " "), replaced, want)
				}

				capture(ns, "--cleanup-only")
				if after := kernelState(t, ns, true); after != before {
					t.Errorf("clean-up left the kernel's state changed:\nbefore:\n%s\nafter:\n%s", before, after)
				}
			})
		}
	}
}
