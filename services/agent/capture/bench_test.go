package capture

import (
	"testing"
)

// BenchmarkInstall measures what capture adds to a pod's start: one run of the real `agent
// capture` (init mode) in a fresh network namespace, per backend, with Istio's defaults and
// with DNS capture and IPv6 (the most rules). Namespace set-up is not timed.
//
//	go test -run '^$' -bench Install -benchtime 20x ./services/agent/capture/
func BenchmarkInstall(b *testing.B) {
	needRoot(b, "nft", "iptables-restore", "ip6tables-restore")
	bin := agentBinary(b)
	for _, backend := range []Backend{NFTables, IPTables} {
		for _, c := range []struct {
			name string
			args []string
			ipv6 bool
		}{{"defaults", nil, false}, {"dns-ipv6", []string{"--redirect-dns", "--dns-servers", "10.96.0.10,fd00::10"}, true}} {
			b.Run(string(backend)+"/"+c.name, func(b *testing.B) {
				addrs := []string{"198.18.200.2/24"}
				if c.ipv6 {
					addrs = append(addrs, "2001:2::2/64")
				}
				for b.Loop() {
					b.StopTimer()
					ns := newNetns(b, "", addrs...)
					b.StartTimer()
					ns.Exec(b, bin, append([]string{"capture", "--backend", string(backend)}, c.args...)...)
				}
			})
		}
	}
}
