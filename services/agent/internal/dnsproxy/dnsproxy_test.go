package dnsproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"go.uber.org/goleak"

	ndsv1 "sailplane.dev/proto/istio/networking/nds/v1"
	"sailplane.dev/shared/dnstest"
	"sailplane.dev/shared/testlog"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// upstream is a real DNS server on loopback (UDP and TCP, one port) answering
// unknown.example.org with 198.51.100.7 and refusing nothing else (NXDOMAIN); asked counts
// the queries it got.
type upstream struct {
	port  string
	asked atomic.Int64
}

func startUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		u.asked.Add(1)
		m := new(dns.Msg)
		m.SetReply(req)
		if q := req.Question[0]; strings.EqualFold(q.Name, "unknown.example.org.") && q.Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
				A: net.ParseIP("198.51.100.7")})
		} else {
			m.Rcode = dns.RcodeNameError
		}
		_ = w.WriteMsg(m)
	})
	u.port = dnstest.Serve(t, h)
	return u
}

// resolvConf is a pod's resolv.conf pointing at the loopback upstream.
func resolvConf(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "resolv.conf")
	data := "search shop.svc.cluster.local svc.cluster.local cluster.local\nnameserver 127.0.0.1\noptions ndots:5\n"
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func sampleTable() *ndsv1.NameTable {
	return &ndsv1.NameTable{Table: map[string]*ndsv1.NameTable_NameInfo{
		"api.partner.example":          {Ips: []string{"240.240.0.1", "2001:2::1"}, Registry: "External"},
		"*.wild.example":               {Ips: []string{"192.0.2.20"}, Registry: "External"},
		"web.shop.svc.cluster.local":   {Ips: []string{"10.96.0.10"}, Registry: "Kubernetes", Shortname: "web", Namespace: "shop"},
		"cart.store.svc.cluster.local": {Ips: []string{"10.96.0.11"}, Registry: "Kubernetes", Shortname: "cart", Namespace: "store"},
	}}
}

// startProxy runs a DNS proxy for namespace shop on a free loopback port until the test ends.
func startProxy(t *testing.T, u *upstream) *Server {
	t.Helper()
	s, err := New(Config{Addr: "127.0.0.1:0", ResolvConf: resolvConf(t), UpstreamPort: u.port,
		UpstreamTimeout: 2 * time.Second, Logger: testlog.New(t, slog.LevelDebug)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	select {
	case <-s.Bound():
	case err := <-done:
		t.Fatal(err)
	}
	return s
}

func query(t *testing.T, s *Server, proto, name string, qtype uint16) *dns.Msg {
	t.Helper()
	addr := s.Addrs()[0].String()
	if proto == "tcp" {
		addr = s.Addrs()[1].String()
	}
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	resp, _, err := (&dns.Client{Net: proto, Timeout: 5 * time.Second}).Exchange(m, addr)
	if err != nil {
		t.Fatalf("%s %s %s: %v", proto, name, dns.TypeToString[qtype], err)
	}
	return resp
}

// render is an answer as "rcode: name type value, ...", sorted, for comparisons.
func render(m *dns.Msg) string {
	var rrs []string
	for _, rr := range m.Answer {
		switch r := rr.(type) {
		case *dns.A:
			rrs = append(rrs, r.Hdr.Name+" A "+r.A.String())
		case *dns.AAAA:
			rrs = append(rrs, r.Hdr.Name+" AAAA "+r.AAAA.String())
		case *dns.CNAME:
			rrs = append(rrs, r.Hdr.Name+" CNAME "+r.Target)
		}
	}
	sort.Strings(rrs)
	return dns.RcodeToString[m.Rcode] + ": " + strings.Join(rrs, ", ")
}

func TestAnswers(t *testing.T) {
	u := startUpstream(t)
	s := startProxy(t, u)
	if got := render(query(t, s, "udp", "api.partner.example.", dns.TypeA)); got != "SERVFAIL: " {
		t.Errorf("before the first table: %s, want SERVFAIL", got)
	}
	s.Update(sampleTable(), "shop")
	for _, proto := range []string{"udp", "tcp"} {
		for _, tc := range []struct {
			name  string
			qtype uint16
			want  string
		}{
			// A ServiceEntry host, both families.
			{"api.partner.example.", dns.TypeA, "NOERROR: api.partner.example. A 240.240.0.1"},
			{"API.Partner.Example.", dns.TypeAAAA, "NOERROR: API.Partner.Example. AAAA 2001:2::1"},
			// The resolver's first try, with the first search domain: a CNAME to the host.
			{"api.partner.example.shop.svc.cluster.local.", dns.TypeA,
				"NOERROR: api.partner.example. A 240.240.0.1, api.partner.example.shop.svc.cluster.local. CNAME api.partner.example."},
			// Kubernetes short names as the resolver expands them, and as sent bare.
			{"web.shop.svc.cluster.local.", dns.TypeA, "NOERROR: web.shop.svc.cluster.local. A 10.96.0.10"},
			{"web.", dns.TypeA, "NOERROR: web. A 10.96.0.10"},
			{"cart.store.", dns.TypeA, "NOERROR: cart.store. A 10.96.0.11"},
			{"cart.store.svc.cluster.local.", dns.TypeA, "NOERROR: cart.store.svc.cluster.local. A 10.96.0.11"},
			{"cart.store.shop.svc.cluster.local.", dns.TypeA,
				"NOERROR: cart.store. A 10.96.0.11, cart.store.shop.svc.cluster.local. CNAME cart.store."},
			// Another namespace's service has no bare short name: forwarded.
			{"cart.", dns.TypeA, "NXDOMAIN: "},
			// A wildcard host answers under the name asked.
			{"a.b.wild.example.", dns.TypeA, "NOERROR: a.b.wild.example. A 192.0.2.20"},
			// A known name without an address of that family: NOERROR, no answer.
			{"web.shop.svc.cluster.local.", dns.TypeAAAA, "NOERROR: "},
			// Unknown: forwarded and answered by the upstream.
			{"unknown.example.org.", dns.TypeA, "NOERROR: unknown.example.org. A 198.51.100.7"},
			{"missing.example.org.", dns.TypeA, "NXDOMAIN: "},
		} {
			if got := render(query(t, s, proto, tc.name, tc.qtype)); got != tc.want {
				t.Errorf("%s %s %s: %s, want %s", proto, tc.name, dns.TypeToString[tc.qtype], got, tc.want)
			}
		}
	}
}

// TestForwardsUnknownOnly: names of the table never reach the upstream; others do.
func TestForwardsUnknownOnly(t *testing.T) {
	u := startUpstream(t)
	s := startProxy(t, u)
	s.Update(sampleTable(), "shop")
	query(t, s, "udp", "api.partner.example.", dns.TypeA)
	query(t, s, "udp", "web.shop.svc.cluster.local.", dns.TypeA)
	if n := u.asked.Load(); n != 0 {
		t.Errorf("upstream asked %d times for names of the table", n)
	}
	query(t, s, "udp", "unknown.example.org.", dns.TypeA)
	query(t, s, "udp", "web.shop.svc.cluster.local.", dns.TypeMX) // a type the table does not answer
	if n := u.asked.Load(); n != 2 {
		t.Errorf("upstream asked %d times, want 2", n)
	}
}

// TestUpstreamDown: with no nameserver answering, unknown names get SERVFAIL and table names
// are still answered.
func TestUpstreamDown(t *testing.T) {
	// A port nothing listens on: bind one and close it.
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(pc.LocalAddr().String())
	_ = pc.Close()
	s := startProxy(t, &upstream{port: port})
	s.Update(sampleTable(), "shop")
	if got := render(query(t, s, "udp", "unknown.example.org.", dns.TypeA)); got != "SERVFAIL: " {
		t.Errorf("unknown name without upstream: %s", got)
	}
	if got := render(query(t, s, "tcp", "api.partner.example.", dns.TypeA)); got != "NOERROR: api.partner.example. A 240.240.0.1" {
		t.Errorf("table name without upstream: %s", got)
	}
}

func TestBadResolvConf(t *testing.T) {
	p := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(p, []byte("search svc.cluster.local\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := New(Config{ResolvConf: p})
	if err == nil || !strings.Contains(err.Error(), p) {
		t.Errorf("resolv.conf without nameserver: %v, want an error naming it", err)
	}
	_, err = New(Config{ResolvConf: filepath.Join(t.TempDir(), "missing")})
	if err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing resolv.conf: %v, want an error naming it", err)
	}
}

// bigTable is a name table of n ServiceEntry hosts and Kubernetes services, half each.
func bigTable(n int) *ndsv1.NameTable {
	nt := &ndsv1.NameTable{Table: make(map[string]*ndsv1.NameTable_NameInfo, n)}
	for i := range n {
		if i%2 == 0 {
			nt.Table[fmt.Sprintf("host-%d.partner.example", i)] = &ndsv1.NameTable_NameInfo{
				Ips: []string{fmt.Sprintf("240.240.%d.%d", i>>8&0xff, i&0xff)}, Registry: "External"}
		} else {
			nt.Table[fmt.Sprintf("svc-%d.ns-%d.svc.cluster.local", i, i%50)] = &ndsv1.NameTable_NameInfo{
				Ips: []string{fmt.Sprintf("10.96.%d.%d", i>>8&0xff, i&0xff)}, Registry: "Kubernetes",
				Shortname: fmt.Sprintf("svc-%d", i), Namespace: fmt.Sprintf("ns-%d", i%50)}
		}
	}
	return nt
}

// TestMemory10k reports the heap a 10,000-host table takes in the agent once loaded, which
// keeps the index and drops the message (go test -v -run TestMemory10k).
func TestMemory10k(t *testing.T) {
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	s := Server{log: slog.New(slog.DiscardHandler)}
	s.Update(bigTable(10000), "ns-1")
	after := heap()
	tbl := s.table.Load()
	t.Logf("10,000-host name table: %d names answered, %.1f MiB of heap once loaded", tbl.Hosts(), float64(after-before)/(1<<20))
	if tbl.Hosts() < 10000 {
		t.Errorf("%d names, want at least 10000", tbl.Hosts())
	}
	runtime.KeepAlive(&s)
}

// BenchmarkAnswerFromTable measures answers from a 10,000-host table over UDP on loopback,
// reporting the p99 latency.
func BenchmarkAnswerFromTable(b *testing.B) {
	p := filepath.Join(b.TempDir(), "resolv.conf")
	if err := os.WriteFile(p, []byte("search ns-1.svc.cluster.local svc.cluster.local\nnameserver 127.0.0.1\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	s, err := New(Config{Addr: "127.0.0.1:0", ResolvConf: p})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	<-s.Bound()
	s.Update(bigTable(10000), "ns-1")
	conn, err := dns.Dial("udp", s.Addrs()[0].String())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	names := []string{"host-42.partner.example.", "svc-43.ns-43.svc.cluster.local.", "svc-51.", "host-9998.partner.example.ns-1.svc.cluster.local."}
	lat := make([]time.Duration, 0, b.N)
	lost := 0
	m := new(dns.Msg)
	b.ResetTimer()
	for i := range b.N {
		m.SetQuestion(names[i%len(names)], dns.TypeA)
		var resp *dns.Msg
		start := time.Now()
		for resp == nil {
			if err := conn.WriteMsg(m); err != nil {
				b.Fatal(err)
			}
			// A datagram lost on a loaded machine is asked again, and not counted.
			_ = conn.SetReadDeadline(time.Now().Add(time.Second))
			r, err := conn.ReadMsg()
			var ne net.Error
			switch {
			case errors.As(err, &ne) && ne.Timeout():
				lost++
				start = time.Now()
			case err != nil:
				b.Fatal(err)
			case r.Id == m.Id:
				resp = r
			}
		}
		lat = append(lat, time.Since(start))
		if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) == 0 {
			b.Fatalf("%s: %s", names[i%len(names)], render(resp))
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lost), "lost")
}
