package agent

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/miekg/dns"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"

	ndsv1 "sailplane.dev/proto/istio/networking/nds/v1"
	ca "sailplane.dev/services/ca"
	"sailplane.dev/shared/dnstest"
	"sailplane.dev/shared/workloadcert"
	"sailplane.dev/shared/xdstype"
	"sailplane.dev/tools/testenv"
)

// ndsServer is an ADS server serving one name table to whoever asks, recording the nodes.
type ndsServer struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	table *ndsv1.NameTable
	addr  string
	stop  func()
	mu    sync.Mutex
	nodes []map[string]string // node metadata strings of each stream
}

func (s *ndsServer) StreamAggregatedResources(stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	req, err := stream.Recv()
	if err != nil {
		return err
	}
	md := map[string]string{"id": req.GetNode().GetId()}
	for k, v := range req.GetNode().GetMetadata().GetFields() {
		md[k] = v.GetStringValue()
	}
	s.mu.Lock()
	s.nodes = append(s.nodes, md)
	s.mu.Unlock()
	if req.GetTypeUrl() != xdstype.NameTable {
		return nil
	}
	res, err := anypb.New(s.table)
	if err != nil {
		return err
	}
	if err := stream.Send(&discoveryv3.DiscoveryResponse{TypeUrl: xdstype.NameTable, VersionInfo: "1", Nonce: "1", Resources: []*anypb.Any{res}}); err != nil {
		return err
	}
	for {
		if _, err := stream.Recv(); err != nil { // ACKs
			return nil
		}
	}
}

func (s *ndsServer) seen() []map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]map[string]string(nil), s.nodes...)
}

// startNDSServer serves table on addr ("127.0.0.1:0" for any port).
func startNDSServer(t *testing.T, addr string, table *ndsv1.NameTable) *ndsServer {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s := &ndsServer{table: table, addr: lis.Addr().String()}
	gs := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, s)
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(lis) }()
	var once sync.Once
	s.stop = func() { once.Do(func() { gs.Stop(); <-done }) }
	t.Cleanup(s.stop)
	return s
}

// startUpstreamDNS is a nameserver on loopback (UDP and TCP) answering unknown.example.org; it returns its port.
func startUpstreamDNS(t *testing.T) string {
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

// lookupA asks addr over proto and returns the A answers as text, "" for none.
func lookupA(t *testing.T, proto string, addr net.Addr, name string) string {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	resp, _, err := (&dns.Client{Net: proto, Timeout: 5 * time.Second}).Exchange(m, addr.String())
	if err != nil {
		t.Fatalf("%s %s: %v", proto, name, err)
	}
	var out []string
	for _, rr := range resp.Answer {
		if a, ok := rr.(*dns.A); ok {
			out = append(out, a.A.String())
		}
	}
	return strings.Join(out, ",")
}

// TestDNSProxy: with DNS capture the agent asks the xDS server for the name table with
// DNS_CAPTURE in its node, answers its hosts (a ServiceEntry host, a Kubernetes short name via
// the search domains) over UDP and TCP, forwards other names to resolv.conf's nameserver, keeps
// answering from the table while the xDS server is gone, and takes the next server's table.
func TestDNSProxy(t *testing.T) {
	caDir := t.TempDir()
	c := startCA(t, ca.Config{CertDir: caDir})
	nds := startNDSServer(t, "127.0.0.1:0", &ndsv1.NameTable{Table: map[string]*ndsv1.NameTable_NameInfo{
		"api.partner.example":            {Ips: []string{"240.240.0.1"}, Registry: "External"},
		"reviews.demo.svc.cluster.local": {Ips: []string{"10.96.0.9"}, Registry: "Kubernetes", Shortname: "reviews", Namespace: "demo"},
	}})
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, []byte("search demo.svc.cluster.local svc.cluster.local cluster.local\nnameserver 127.0.0.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		Config:     workloadcert.Config{CAAddress: c.Addr(), RootCertFile: c.RootFile, ProvisionedCertDir: testenv.ProvisionCert(t, caDir, web)},
		XDSAddress: nds.addr, Pod: "web-0", IP: "10.0.0.1",
		DNSCapture: true, DNSAddr: "127.0.0.1:0", ResolvConf: resolv, DNSUpstreamPort: startUpstreamDNS(t),
	}
	a := startAgent(t, cfg)
	eventually(t, "the DNS proxy listening", func() bool { return a.DNSAddr() != nil })
	addr := a.DNSAddr()
	eventually(t, "the name table answered", func() bool { return lookupA(t, "udp", addr, "api.partner.example.") == "240.240.0.1" })

	nodes := nds.seen()
	if len(nodes) == 0 || nodes[0]["DNS_CAPTURE"] != "true" || nodes[0]["id"] != "sidecar~10.0.0.1~web-0.demo~demo.svc.cluster.local" {
		t.Errorf("the xDS server saw nodes %v, want the workload's with DNS_CAPTURE=true", nodes)
	}
	check := func(when string) {
		t.Helper()
		for _, proto := range []string{"udp", "tcp"} {
			for name, want := range map[string]string{
				"api.partner.example.":                        "240.240.0.1",
				"api.partner.example.demo.svc.cluster.local.": "240.240.0.1", // the resolver's first try
				"reviews.demo.svc.cluster.local.":             "10.96.0.9",
				"reviews.":                                    "10.96.0.9",
				"unknown.example.org.":                        "198.51.100.7", // forwarded
			} {
				if got := lookupA(t, proto, addr, name); got != want {
					t.Errorf("%s: %s %s = %q, want %q", when, proto, name, got, want)
				}
			}
		}
	}
	check("with the xDS server")
	// pilot-agent's DNS metrics: every query counted, the forwarded ones apart.
	queries, forwarded := a.metrics.Value("dns_requests_total"), a.metrics.Value("dns_upstream_requests_total")
	if queries < 10 || forwarded < 2 || forwarded >= queries {
		t.Errorf("dns_requests_total %v, dns_upstream_requests_total %v: want every query counted and the 2+ forwarded apart", queries, forwarded)
	}

	nds.stop()
	check("without the xDS server")

	// Another server on the same address: the agent reconnects and takes its table.
	next := startNDSServer(t, nds.addr, &ndsv1.NameTable{Table: map[string]*ndsv1.NameTable_NameInfo{
		"api.partner.example": {Ips: []string{"240.240.0.2"}, Registry: "External"},
	}})
	eventually(t, "the next server's table answered", func() bool { return lookupA(t, "udp", addr, "api.partner.example.") == "240.240.0.2" })
	if got := lookupA(t, "tcp", addr, "reviews.demo.svc.cluster.local."); got != "" {
		t.Errorf("a host gone from the table still answers %q", got)
	}
	_ = next
}
