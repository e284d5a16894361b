package dnsproxy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	ndsv1 "sailplane.dev/proto/istio/networking/nds/v1"
)

// DefaultAddr is where Istio's agent answers DNS (DNS_PROXY_ADDR): the capture rules send the
// pod's port 53 there.
const DefaultAddr = "127.0.0.1:15053"

// Config configures a Server.
type Config struct {
	// Addr is the UDP and TCP address served; DefaultAddr when empty.
	Addr string
	// ResolvConf is the resolver configuration whose nameservers get the queries the table
	// does not answer, and whose search domains the table answers under; /etc/resolv.conf when
	// empty. Read once, at New.
	ResolvConf string
	// UpstreamPort is the nameservers' port, 53 when empty: resolv.conf cannot name one, and
	// tests run their nameserver on a free port.
	UpstreamPort string
	// UpstreamTimeout bounds one forwarded query; 5s (Istio's) when zero.
	UpstreamTimeout time.Duration
	Logger          *slog.Logger
	// Observer, when set, learns of every query and forwarded query (the agent's metrics).
	Observer Observer
}

// Observer counts what the server does, as pilot-agent's DNS metrics.
type Observer interface {
	// Query is a query received.
	Query()
	// Forwarded is a query sent to the nameservers, taking d; failed when none answered.
	Forwarded(d time.Duration, failed bool)
}

type noObserver struct{}

func (noObserver) Query()                        {}
func (noObserver) Forwarded(time.Duration, bool) {}

// Server answers DNS from the last name table it was given.
type Server struct {
	cfg       Config
	log       *slog.Logger
	upstreams []string
	search    []string
	table     atomic.Pointer[Table]

	mu    sync.Mutex
	addrs []net.Addr // bound, UDP then TCP
	bound chan struct{}
}

// New reads the resolver configuration; nothing is bound before Run.
func New(cfg Config) (*Server, error) {
	cfg.Addr = cmp.Or(cfg.Addr, DefaultAddr)
	cfg.ResolvConf = cmp.Or(cfg.ResolvConf, "/etc/resolv.conf")
	cfg.UpstreamTimeout = cmp.Or(cfg.UpstreamTimeout, 5*time.Second)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Observer == nil {
		cfg.Observer = noObserver{}
	}
	rc, err := dns.ClientConfigFromFile(cfg.ResolvConf)
	if err != nil {
		return nil, fmt.Errorf("dns proxy: resolver configuration %s: %w", cfg.ResolvConf, err)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, search: rc.Search, bound: make(chan struct{})}
	for _, ns := range rc.Servers {
		s.upstreams = append(s.upstreams, net.JoinHostPort(ns, cmp.Or(cfg.UpstreamPort, rc.Port)))
	}
	if len(s.upstreams) == 0 {
		return nil, fmt.Errorf("dns proxy: %s names no nameserver to forward to", cfg.ResolvConf)
	}
	return s, nil
}

// Update makes nt the table answered from, for a workload of namespace ns (its services
// answer by their short name too).
func (s *Server) Update(nt *ndsv1.NameTable, ns string) {
	t := NewTable(nt, ns, s.search)
	s.table.Store(t)
	s.log.Debug("name table updated", "names", t.Hosts())
}

// HasTable reports whether a table was received.
func (s *Server) HasTable() bool { return s.table.Load() != nil }

// Addrs are the bound UDP and TCP addresses, once Run bound them (Bound is closed).
func (s *Server) Addrs() []net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addrs
}

// Bound is closed once Run listens.
func (s *Server) Bound() <-chan struct{} { return s.bound }

// listen binds UDP and TCP on addr's port. For port 0 the kernel picks the UDP port, and
// another is tried when that one is taken for TCP.
func listen(addr string) (net.PacketConn, net.Listener, error) {
	_, port, _ := net.SplitHostPort(addr)
	for attempt := 0; ; attempt++ {
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			return nil, nil, err
		}
		l, err := net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			return pc, l, nil
		}
		_ = pc.Close()
		if port != "0" || attempt == 20 {
			return nil, nil, err
		}
	}
}

// Run serves UDP and TCP until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	pc, l, err := listen(s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("dns proxy: %w", err)
	}
	udpClient := &dns.Client{Net: "udp", Timeout: s.cfg.UpstreamTimeout}
	tcpClient := &dns.Client{Net: "tcp", Timeout: s.cfg.UpstreamTimeout}
	var started sync.WaitGroup
	started.Add(2)
	servers := []*dns.Server{
		{PacketConn: pc, Handler: s.handler("udp", udpClient, tcpClient), NotifyStartedFunc: started.Done},
		{Listener: l, Handler: s.handler("tcp", tcpClient, nil), NotifyStartedFunc: started.Done},
	}
	errs := make(chan error, len(servers))
	for _, srv := range servers {
		go func() { errs <- srv.ActivateAndServe() }()
	}
	// Shutdown refuses a server not started yet, which would then serve forever.
	started.Wait()
	s.mu.Lock()
	s.addrs = []net.Addr{pc.LocalAddr(), l.Addr()}
	s.mu.Unlock()
	close(s.bound)
	s.log.Info("serving DNS", "addr", pc.LocalAddr().String(), "upstreams", s.upstreams, "search", s.search)

	var err1 error
	pending := len(servers)
	select {
	case <-ctx.Done():
	case err1 = <-errs:
		pending--
	}
	for _, srv := range servers {
		_ = srv.Shutdown()
	}
	for range pending {
		<-errs
	}
	if err1 != nil {
		return fmt.Errorf("dns proxy: %w", err1)
	}
	return nil
}

// handler answers one transport's queries; retry, for UDP, re-asks over TCP an upstream whose
// answer was truncated.
func (s *Server) handler(proto string, client, retry *dns.Client) dns.Handler {
	return dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		s.cfg.Observer.Query()
		resp := s.answer(req)
		if resp == nil {
			resp = s.forward(req, client, retry)
		}
		// Fit what the client can take over UDP (512 bytes, or its EDNS0 size).
		size := dns.MinMsgSize
		if proto == "tcp" {
			size = dns.MaxMsgSize
		} else if o := req.IsEdns0(); o != nil && int(o.UDPSize()) > size {
			size = int(o.UDPSize())
		}
		resp.Truncate(size)
		if err := w.WriteMsg(resp); err != nil {
			s.log.Debug("writing a DNS answer", "err", err)
		}
	})
}

// answer answers from the table; nil means forward. Before the first table every query gets
// SERVFAIL, as in Istio: a client retries, where a name forwarded too early could be cached as
// nonexistent.
func (s *Server) answer(req *dns.Msg) *dns.Msg {
	if len(req.Question) == 0 {
		return reply(req, dns.RcodeFormatError)
	}
	t := s.table.Load()
	if t == nil {
		return reply(req, dns.RcodeServerFailure)
	}
	q := req.Question[0]
	if q.Qclass != dns.ClassINET || (q.Qtype != dns.TypeA && q.Qtype != dns.TypeAAAA) {
		return nil
	}
	rec, target, ok := t.lookup(strings.ToLower(q.Name))
	if !ok {
		return nil
	}
	resp := reply(req, dns.RcodeSuccess)
	resp.Authoritative = true
	// A known name without records of the type asked is NOERROR with no answer, not NXDOMAIN:
	// clients asking A and AAAA together would otherwise fail on the family it lacks.
	resp.Answer = answer(rec, q.Name, target, q.Qtype)
	return resp
}

// forward asks the nameservers in order and returns the first answer; SERVFAIL if none
// answers.
func (s *Server) forward(req *dns.Msg, client, retry *dns.Client) *dns.Msg {
	start := time.Now()
	var errs []error
	for _, up := range s.upstreams {
		resp, _, err := client.Exchange(req, up)
		if err == nil && resp.Truncated && retry != nil {
			resp, _, err = retry.Exchange(req, up)
		}
		if err == nil {
			s.cfg.Observer.Forwarded(time.Since(start), false)
			return resp
		}
		errs = append(errs, err)
	}
	s.cfg.Observer.Forwarded(time.Since(start), true)
	s.log.Debug("no upstream answered", "name", req.Question[0].Name, "err", errors.Join(errs...))
	return reply(req, dns.RcodeServerFailure)
}

func reply(req *dns.Msg, rcode int) *dns.Msg {
	m := new(dns.Msg)
	m.SetRcode(req, rcode)
	m.RecursionAvailable = true
	return m
}
