package e2e

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"sailplane.dev/shared/netns"

	"github.com/miekg/dns"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/spiffe"
	"sailplane.dev/tools/testenv"
)

// The two namespaces of TestDNSThroughCapture, joined by a veth pair (198.18.0.0/15, RFC 2544):
// the pod's resolv.conf names the peer's nameserver, as a pod's names the cluster's.
const (
	dnsPeerIP = "198.19.53.1"
	dnsPodIP  = "198.19.53.2"
	proxyUID  = 1337
	appUID    = 1000
)

// TestDNSThroughCapture: in a pod namespace whose DNS capture rules the real `agent capture
// --redirect-dns` installed (init mode), with the real agent running as 1337 with --dns-capture,
// the app's DNS queries to resolv.conf's nameserver (the peer namespace's, port 53, as a uid
// other than 1337) reach the agent: a ServiceEntry host is answered from hyper's name table
// (the nameserver never sees it), an unknown name is forwarded, and the forwarded query, sent
// as 1337, is not captured again: the nameserver sees it, from the pod's address.
func TestDNSThroughCapture(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("network namespaces need root (CI runs as root)")
	}
	pod, peer := dnsNamespaces(t)

	// Everything the agent (uid 1337) reads or writes is under a folder it may enter: the
	// test's own temporary folders are 0700 root.
	base, err := os.MkdirTemp("", "dnscapture-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	resolv := filepath.Join(base, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("search demo.svc.cluster.local svc.cluster.local cluster.local\nnameserver "+dnsPeerIP+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	upstream := startNameserverIn(t, peer)

	// The peer's servers: the ca and hyper, reached from the pod across the veth. Their other
	// ports are on the peer's own loopback.
	caDir := filepath.Join(base, "ca")
	caCerts := filepath.Join(caDir, "etc/certs")
	caAddr := dnsPeerIP + ":15443"
	if err := os.MkdirAll(caDir, 0o755); err != nil {
		t.Fatal(err)
	}
	framework.Start(t, caDir, "ip", "netns", "exec", peer, framework.Binary(t, "ca"), "--kubernetes=false",
		"--ca-listen", caAddr, "--ca-cert-dir", caCerts, "--bus-listen", "127.0.0.1:16010", "--monitoring-listen", "127.0.0.1:16014")
	hyperDir := filepath.Join(base, "hyper")
	framework.WriteFile(t, hyperDir, "etc/sailplane/mesh.yaml", meshYAML)
	framework.WriteFile(t, hyperDir, "etc/sailplane/conf/serviceentries.yaml", dnsServiceEntries)
	xdsAddr := dnsPeerIP + ":15010"
	framework.Start(t, hyperDir, "ip", "netns", "exec", peer, framework.Binary(t, "hyper"), "--config-source", "files",
		"--xds-listen", xdsAddr, "--xds-tls-listen", "127.0.0.1:15012", "--bus-listen", "127.0.0.1:15016", "--monitoring-listen", "127.0.0.1:15014")

	// The agent's certificate and root, provisioned as for a VM, readable by 1337.
	framework.Eventually(t, 30*time.Second, func() error { _, err := os.Stat(filepath.Join(caCerts, pki.CAKeyFile)); return err })
	id := spiffe.ID{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "web"}
	prov := testenv.ProvisionCert(t, caCerts, id)
	agentDir := filepath.Join(base, "agent")
	for src, dst := range map[string]string{
		filepath.Join(prov, "cert-chain.pem"):    "prov/cert-chain.pem",
		filepath.Join(prov, "key.pem"):           "prov/key.pem",
		filepath.Join(caCerts, pki.RootCertFile): pki.RootCertFile,
	} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		framework.WriteFile(t, agentDir, dst, string(b))
	}
	if out, err := exec.Command("chown", "-R", fmt.Sprintf("%d:%d", proxyUID, proxyUID), agentDir).CombinedOutput(); err != nil {
		t.Fatalf("chown %s: %v: %s", agentDir, err, out)
	}

	// Init mode: the capture init container installs the rules, then the agent starts.
	agentBin := framework.Binary(t, "agent")
	if out, err := exec.Command("ip", "netns", "exec", pod, agentBin, "capture", "--redirect-dns", "--resolv-conf", resolv).CombinedOutput(); err != nil {
		t.Fatalf("agent capture --redirect-dns: %v\n%s", err, out)
	}
	framework.Start(t, agentDir, "ip", "netns", "exec", pod,
		"setpriv", "--reuid", fmt.Sprint(proxyUID), "--regid", fmt.Sprint(proxyUID), "--clear-groups", agentBin,
		"--ca-address", caAddr, "--root-cert", pki.RootCertFile, "--provisioned-cert-dir", "prov",
		"--token-file", "no-token", "--xds-address", xdsAddr, "--pod", "web-0", "--ip", dnsPodIP,
		"--output-dir", "creds", "--grpc-bootstrap", "grpc-bootstrap.json", "--xds-proxy-socket", "XDS", "--sds-socket", "SDS",
		"--readiness-address", "127.0.0.1:15020",
		"--dns-capture", "--dns-address", "127.0.0.1:15053", "--resolv-conf", resolv)

	// Until the agent has its name table, the ServiceEntry host is forwarded (and refused).
	framework.Eventually(t, 30*time.Second, func() error {
		got, err := lookupIn(pod, appUID, "udp", "db.corp.example.")
		if err != nil {
			return err
		}
		if len(got) != 1 || got[0].String() != "192.0.2.10" {
			return fmt.Errorf("db.corp.example = %v, want 192.0.2.10", got)
		}
		return nil
	})
	upstream.reset()
	for _, proto := range []string{"udp", "tcp"} {
		if got, err := lookupIn(pod, appUID, proto, "db.corp.example."); err != nil || len(got) != 1 || got[0].String() != "192.0.2.10" {
			t.Errorf("%s db.corp.example = %v, %v; want the agent's 192.0.2.10", proto, got, err)
		}
		if got, err := lookupIn(pod, appUID, proto, "unknown.example.org."); err != nil || len(got) != 1 || got[0].String() != "198.51.100.7" {
			t.Errorf("%s unknown.example.org = %v, %v; want the nameserver's 198.51.100.7", proto, got, err)
		}
	}
	// The nameserver saw the two forwarded queries, from the agent in the pod, and nothing else:
	// the ServiceEntry host was answered by the agent, and the app's queries never got past it.
	got := upstream.seen()
	if len(got) != 2 {
		t.Fatalf("the nameserver saw %v; want unknown.example.org twice (UDP and TCP), forwarded by the agent", got)
	}
	for _, q := range got {
		if q.name != "unknown.example.org." || q.from != dnsPodIP {
			t.Errorf("the nameserver saw %s from %s; want unknown.example.org. from the pod's %s", q.name, q.from, dnsPodIP)
		}
	}
}

// dnsNamespaces creates the pod and peer namespaces, veth-joined, deleted when the test ends.
func dnsNamespaces(t *testing.T) (pod, peer string) {
	t.Helper()
	pod, peer = fmt.Sprintf("spdns-pod-%d", os.Getpid()), fmt.Sprintf("spdns-peer-%d", os.Getpid())
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	for _, ns := range []string{pod, peer} {
		ip("netns", "add", ns)
		t.Cleanup(func() {
			// Deleting the namespace deletes its end of the veth, and with it the other.
			if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
				t.Errorf("ip netns del %s: %v: %s", ns, err, out)
			}
		})
	}
	// Made inside the pod, so that no link ever appears in the machine's namespace.
	ip("-n", pod, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", peer)
	for ns, addr := range map[string]string{pod: dnsPodIP, peer: dnsPeerIP} {
		ip("-n", ns, "addr", "add", addr+"/24", "dev", "eth0")
		ip("-n", ns, "link", "set", "lo", "up")
		ip("-n", ns, "link", "set", "eth0", "up")
	}
	return pod, peer
}

// lookupIn is lookup from inside namespace ns as uid, to resolv.conf's nameserver.
func lookupIn(ns string, uid int, proto, name string) (got []netip.Addr, err error) {
	ierr := netns.DoAs("/run/netns/"+ns, uid, func() error {
		got, err = lookup(net.JoinHostPort(dnsPeerIP, "53"), proto, name)
		return nil
	})
	if ierr != nil {
		return nil, ierr
	}
	return got, err
}

// seenQuery is a query a nameserver got.
type seenQuery struct{ name, from string }

// recordingNameserver is startNameserver's nameserver, recording what it is asked.
type recordingNameserver struct {
	mu      sync.Mutex
	queries []seenQuery
}

func (r *recordingNameserver) reset() { r.mu.Lock(); r.queries = nil; r.mu.Unlock() }

func (r *recordingNameserver) seen() []seenQuery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]seenQuery(nil), r.queries...)
}

// startNameserverIn runs a nameserver on port 53 of the peer's address inside namespace ns
// (UDP and TCP), answering unknown.example.org with 198.51.100.7 and refusing other names,
// until the test ends.
func startNameserverIn(t *testing.T, ns string) *recordingNameserver {
	t.Helper()
	r := &recordingNameserver{}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		from, _, _ := net.SplitHostPort(w.RemoteAddr().String())
		r.mu.Lock()
		r.queries = append(r.queries, seenQuery{name: req.Question[0].Name, from: from})
		r.mu.Unlock()
		m := new(dns.Msg)
		m.SetReply(req)
		if q := req.Question[0]; q.Name == "unknown.example.org." && q.Qtype == dns.TypeA {
			m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.ParseIP("198.51.100.7")}}
		} else {
			m.Rcode = dns.RcodeNameError
		}
		_ = w.WriteMsg(m)
	})
	var pc net.PacketConn
	var l net.Listener
	addr := net.JoinHostPort(dnsPeerIP, "53")
	if err := netns.Do("/run/netns/"+ns, func() (err error) {
		if pc, err = net.ListenPacket("udp", addr); err != nil {
			return err
		}
		l, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		t.Fatalf("nameserver in %s: %v", ns, err)
	}
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: l, Handler: h}} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		done := make(chan struct{})
		go func() { defer close(done); _ = srv.ActivateAndServe() }()
		<-started
		t.Cleanup(func() { _ = srv.Shutdown(); <-done })
	}
	return r
}
