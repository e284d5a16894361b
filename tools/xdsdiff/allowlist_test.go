package xdsdiff

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeAllowlist(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "allowlist.yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLoadAllowlistErrors(t *testing.T) {
	tests := []struct{ name, text, want string }{
		{"missing reason", "- type: CDS\n  reason: ok\n- type: LDS\n", `entry 2: field "reason": missing`},
		{"blank reason", "- type: CDS\n  reason: '  '\n", `entry 1: field "reason": missing`},
		{"unknown key", "- type: CDS\n  resouce: a\n  reason: ok\n", `entry 1: unknown field "resouce"`},
		{"bad glob", "- path: 'filter_chains\\'\n  reason: ok\n", `entry 1: field "path": bad glob "filter_chains\\": ends in a lone \`},
		{"not a string", "- type: [CDS]\n  reason: ok\n", `entry 1: field "type": want a string`},
		{"matches everything", "- reason: everything is fine\n", "entry 1: no case, node, type, resource or path"},
		{"not a list", "type: CDS\nreason: ok\n", "not a YAML list of entries"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeAllowlist(t, tt.text)
			_, err := LoadAllowlist(path)
			if err == nil || !strings.HasPrefix(err.Error(), path+": ") || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want %q after the file name", err, tt.want)
			}
		})
	}
	if _, err := LoadAllowlist(filepath.Join(t.TempDir(), "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("missing file: %v", err)
	}
}

func TestAllowlistFilter(t *testing.T) {
	a, err := LoadAllowlist(writeAllowlist(t, `
- type: LDS
  path: "filter_chains[*].filters[tcp_proxy].idle_timeout"
  reason: istiod sets Envoy's default explicitly
- case: gateway-*
  resource: outbound|443||*.svc.cluster.local
  reason: gateways dial another port
- type: RDS
  path: virtual_hosts[\*].routes (order)
  reason: only the catch-all virtual host, whose domain is a literal *
- node: router~*
  type: EDS
  resource: 8080
  reason: stale, nothing matches
`))
	if err != nil {
		t.Fatal(err)
	}
	diffs := []Difference{
		{Case: "sidecar", Type: "LDS", Resource: "0.0.0.0_80", Path: "filter_chains[port=80 sni=a.com].filters[tcp_proxy].idle_timeout"},
		{Case: "gateway-sni", Type: "CDS", Resource: "outbound|443||b.default.svc.cluster.local", Path: "connect_timeout"},
		{Case: "sidecar", Type: "CDS", Resource: "outbound|443||b.default.svc.cluster.local", Path: "connect_timeout"},
		{Case: "sidecar", Type: "RDS", Resource: "80", Path: "virtual_hosts[*].routes (order)"},
		{Case: "sidecar", Type: "RDS", Resource: "80", Path: "virtual_hosts[a.com].routes (order)"},
		{Case: "sidecar", Type: "LDS", Resource: "0.0.0.0_80", Path: "filter_chains[*].filters[tcp_proxy].cluster"},
	}
	unexpected, unused := a.Filter(diffs)
	want := []Difference{diffs[2], diffs[4], diffs[5]}
	if len(unexpected) != len(want) {
		t.Fatalf("unexpected %v, want %v", unexpected, want)
	}
	for i := range want {
		if unexpected[i] != want[i] {
			t.Errorf("unexpected[%d] = %v, want %v", i, unexpected[i], want[i])
		}
	}
	if len(unused) != 1 || unused[0].Index != 4 || unused[0].Reason != "stale, nothing matches" {
		t.Fatalf("unused %v, want entry 4", unused)
	}
	if got, want := unused[0].String(), "entry 4 (node=router~* type=EDS resource=8080; reason: stale, nothing matches)"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}
