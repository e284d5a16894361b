package bus

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	networking "istio.io/api/networking/v1alpha3"

	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/testwait"
)

// A producer whose link goes silent (a node lost, a cable pulled: no FIN, no RST) is noticed by
// the consumer's keepalive, which reconnects and receives what changed meanwhile. Without it the
// consumer waited on the dead stream forever (found by e2e's TestFaults, bus link cut).
func TestConsumerLeavesASilentLink(t *testing.T) {
	typ := schema.VirtualService.TypeURL
	vs := func(host string) *Resource {
		return &Resource{Name: "ns/vs", Version: host, Body: &networking.VirtualService{Hosts: []string{host}}}
	}
	s := NewStore()
	if err := s.Upsert(typ, vs("a")); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Second, PermitWithoutStream: true}))
	NewServer(s).Register(gs)
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()
	link := startSilencer(t, lis.Addr().String())

	h := &versionRecorder{have: map[string]string{}, synced: make(chan struct{})}
	// gRPC pings at most every 10 s; a second without an answer is enough here.
	src := Dial(link.addr, WithBackoff(5*time.Millisecond, 50*time.Millisecond),
		func(c *dialConfig) {
			c.keepalive = keepalive.ClientParameters{Time: 10 * time.Second, Timeout: time.Second}
		})
	defer subscribeSynced(t, src, typ, h)()

	link.silence()
	if err := s.Upsert(typ, vs("b")); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, time.Minute, "the change made while the link was silent", func() error {
		if have, _ := h.state(); have["ns/vs"] != "b" {
			return errors.New("the consumer still has " + have["ns/vs"])
		}
		return nil
	})
}

// silencer forwards TCP connections to a server; silence makes the open ones drop everything
// from then on without closing them, as a link that went down does. New connections work.
type silencer struct {
	addr   string
	mu     sync.Mutex
	silent []chan struct{} // closed to silence a connection
	wg     sync.WaitGroup
}

func startSilencer(t *testing.T, target string) *silencer {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &silencer{addr: lis.Addr().String()}
	var conns []net.Conn
	var connsMu sync.Mutex
	s.wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			connsMu.Lock()
			conns = append(conns, c, up)
			connsMu.Unlock()
			quiet := make(chan struct{})
			s.mu.Lock()
			s.silent = append(s.silent, quiet)
			s.mu.Unlock()
			s.wg.Go(func() { pipe(up, c, quiet) })
			s.wg.Go(func() { pipe(c, up, quiet) })
		}
	})
	t.Cleanup(func() {
		lis.Close()
		connsMu.Lock()
		for _, c := range conns {
			c.Close()
		}
		connsMu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *silencer) silence() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, q := range s.silent {
		close(q)
	}
	s.silent = nil
}

// pipe copies src to dst until quiet is closed, then reads and drops src until it closes.
func pipe(dst io.Writer, src io.Reader, quiet <-chan struct{}) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-quiet:
		default:
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
