package xdsserver

import (
	"net"
	"sync"
)

// connTracker remembers the client connections its listeners accepted, by the client's address
// (what peer.FromContext reports for a stream), so that a stream's whole connection can be
// closed: gRPC offers no way to end one connection, and a stream that a client stopped reading
// cannot end on its own, nor does a client whose stream ends pick another replica (it reopens
// the stream on the same connection).
type connTracker struct {
	mu    sync.Mutex
	conns map[string]net.Conn
}

func newConnTracker() *connTracker { return &connTracker{conns: map[string]net.Conn{}} }

// listener wraps lis so that the connections it accepts are tracked until closed.
func (t *connTracker) listener(lis net.Listener) net.Listener { return &trackingListener{lis, t} }

// close closes the connection of the client at addr; false if there is none.
func (t *connTracker) close(addr string) bool {
	t.mu.Lock()
	c := t.conns[addr]
	t.mu.Unlock()
	if c == nil {
		return false
	}
	_ = c.Close()
	return true
}

type trackingListener struct {
	net.Listener
	t *connTracker
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, t: l.t, addr: c.RemoteAddr().String()}
	l.t.mu.Lock()
	l.t.conns[tc.addr] = tc
	l.t.mu.Unlock()
	return tc, nil
}

type trackedConn struct {
	net.Conn
	t    *connTracker
	addr string
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.t.mu.Lock()
		if c.t.conns[c.addr] == net.Conn(c) {
			delete(c.t.conns, c.addr)
		}
		c.t.mu.Unlock()
	})
	return c.Conn.Close()
}
