package e2e

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/miekg/dns"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/shared/dnstest"
	"sailplane.dev/shared/spiffe"
)

// dnsServiceEntries: a ServiceEntry with an address, and one without (resolution DNS), which
// gets an auto-allocated address for a proxy capturing DNS, as istiod allocates them.
const dnsServiceEntries = `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: db, namespace: demo}
spec:
  hosts: [db.corp.example]
  addresses: [192.0.2.10]
  resolution: STATIC
  ports: [{name: pg, number: 5432, protocol: TCP}]
  endpoints: [{address: 192.0.2.11}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: partner, namespace: demo}
spec:
  hosts: [api.partner.example]
  resolution: DNS
  location: MESH_EXTERNAL
  ports: [{name: tls, number: 443, protocol: TLS}]
`

// TestAgentDNSProxy: a real agent with --dns-capture gets its name table from a real hyper
// over xDS and answers the workload's DNS: ServiceEntry hosts from the table (the one without
// address at an auto-allocated 240.240.0.0/16 address), other names forwarded to the
// resolv.conf nameserver.
func TestAgentDNSProxy(t *testing.T) {
	dir := t.TempDir()
	framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", meshYAML)
	framework.WriteFile(t, dir, "etc/sailplane/conf/serviceentries.yaml", dnsServiceEntries)
	xds := framework.FreeAddr(t)
	hyper := framework.Start(t, dir, framework.Binary(t, "hyper"), "--config-source", "files",
		"--xds-listen", xds, "--xds-tls-listen", framework.FreeAddr(t), "--bus-listen", framework.FreeAddr(t))
	framework.WaitReady(t, hyper)

	upstream := startNameserver(t)
	resolvDir := t.TempDir()
	framework.WriteFile(t, resolvDir, "resolv.conf", "search demo.svc.cluster.local svc.cluster.local cluster.local\nnameserver 127.0.0.1\n")
	resolv := filepath.Join(resolvDir, "resolv.conf")
	dnsAddr := freeUDPAddr(t)
	ca := framework.StartCA(t, t.TempDir())
	framework.StartAgent(t, ca, framework.Agent{
		ID: spiffe.ID{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "web"}, XDSAddr: xds, IP: "198.18.0.5",
		Args: []string{"--dns-capture", "--dns-address", dnsAddr, "--resolv-conf", resolv, "--dns-upstream-port", upstream},
	})

	framework.Eventually(t, 30*time.Second, func() error {
		got, err := lookup(dnsAddr, "udp", "db.corp.example.")
		if err != nil {
			return err
		}
		if len(got) != 1 || got[0] != netip.MustParseAddr("192.0.2.10") {
			return fmt.Errorf("db.corp.example = %v, want 192.0.2.10", got)
		}
		return nil
	})
	for _, proto := range []string{"udp", "tcp"} {
		got, err := lookup(dnsAddr, proto, "api.partner.example.")
		if err != nil || len(got) != 1 || !netip.MustParsePrefix("240.240.0.0/16").Contains(got[0]) {
			t.Errorf("%s api.partner.example = %v, %v; want one auto-allocated 240.240.0.0/16 address", proto, got, err)
		}
		// The resolver's first try, with the pod's first search domain, resolves too.
		if got, err := lookup(dnsAddr, proto, "db.corp.example.demo.svc.cluster.local."); err != nil || len(got) != 1 || got[0].String() != "192.0.2.10" {
			t.Errorf("%s db.corp.example.demo.svc.cluster.local = %v, %v; want 192.0.2.10", proto, got, err)
		}
		if got, err := lookup(dnsAddr, proto, "unknown.example.org."); err != nil || len(got) != 1 || got[0].String() != "198.51.100.7" {
			t.Errorf("%s unknown.example.org = %v, %v; want the nameserver's 198.51.100.7", proto, got, err)
		}
	}
}

// lookup asks addr for name's A records over proto.
func lookup(addr, proto, name string) ([]netip.Addr, error) {
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	resp, _, err := (&dns.Client{Net: proto, Timeout: 5 * time.Second}).Exchange(m, addr)
	if err != nil {
		return nil, err
	}
	if resp.Rcode != dns.RcodeSuccess {
		return nil, fmt.Errorf("%s: %s", name, dns.RcodeToString[resp.Rcode])
	}
	var out []netip.Addr
	for _, rr := range resp.Answer {
		if a, ok := rr.(*dns.A); ok {
			ip, _ := netip.AddrFromSlice(a.A.To4())
			out = append(out, ip)
		}
	}
	return out, nil
}

// startNameserver runs a nameserver on loopback (UDP and TCP) answering unknown.example.org
// with 198.51.100.7 until the test ends; it returns its port.
func startNameserver(t *testing.T) string {
	t.Helper()
	h := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(req)
		if q := req.Question[0]; q.Name == "unknown.example.org." && q.Qtype == dns.TypeA {
			m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.ParseIP("198.51.100.7")}}
		} else {
			m.Rcode = dns.RcodeNameError
		}
		_ = w.WriteMsg(m)
	})
	return dnstest.Serve(t, h)
}

// freeUDPAddr is a loopback address free for both UDP and TCP when chosen.
func freeUDPAddr(t *testing.T) string {
	t.Helper()
	pc, l, err := dnstest.Listen()
	if err != nil {
		t.Fatal(err)
	}
	addr := pc.LocalAddr().String()
	_, _ = pc.Close(), l.Close()
	return addr
}
