package xds

import (
	"cmp"
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"sailplane.dev/services/xds-server/internal/model"
)

// Options configure a Server.
type Options struct {
	Logger *slog.Logger
	// Generator picks the generator serving a proxy; nil or a nil result serves nothing.
	Generator func(*model.Proxy) Generator
	// PushConcurrency bounds how many connections are pushed at once; default 16.
	PushConcurrency int
	// CacheAssert regenerates on every use and fails (OnCacheViolation, default panic) when one
	// cache key would hold two values. For tests: it disables sharing.
	CacheAssert      bool
	OnCacheViolation func(error)
	// PeerIdentity names the client of a stream by the identity it authenticated with (the
	// SPIFFE ID of its certificate or token), "" for none; logged when the proxy connects, and
	// the node's namespace and service account must be its own. Nil: not looked at.
	PeerIdentity func(context.Context) string
	// DebugAccess decides whether the client of a stream (its context, and its identity as
	// PeerIdentity named it when the stream opened) may ask for Istio's debug types
	// (TypeSyncz, TypeConfigDump); an error, a gRPC status, refuses and ends the stream. Nil:
	// debug types are refused. It runs as the first RequestGate.
	DebugAccess func(ctx context.Context, peer string) error
	// Replica names this server in every response's control plane identifier (its pod name);
	// Version is its version.
	Replica, Version string
	// Observers learn of connections, responses, ACKs and NACKs, and pushes; they are called
	// in order, after the server's own (the proxy claims check, debug access, the NACK log,
	// the debug types' sync status). Those that are Admitters or RequestGates may refuse.
	Observers []Observer
	// Clock times the holds RequestGates ask for; nil is the wall clock. For tests.
	Clock Clock
	// Secrets, when set, answers the SDS type (Secret) per stream, never cached nor shared:
	// what a proxy may read depends on who it authenticated as. Nil: SDS requests are answered
	// by the Generator (with nothing).
	Secrets SecretSource
}

// SecretSource builds the SDS secrets named in names for proxy, whose stream authenticated as
// peer (its SPIFFE ID, "" for none), leaving out those it may not have or that cannot be built.
type SecretSource interface {
	Secrets(ctx context.Context, proxy *model.Proxy, peer string, names []string) []types.Resource
}

// Server serves ADS. Feed it snapshots with Push and run its push workers with Run. Register it
// on a gRPC server created with grpc.ForceServerCodecV2(Codec()): responses are sent
// pre-encoded.
type Server struct {
	opts  Options
	log   *slog.Logger
	cache *cache
	queue *pushQueue[*conn]
	subs  *subscriptions
	obs   chain
	clock Clock
	cp    controlPlane
	// status is what the debug types report of each stream (an observer).
	status *syncStatus

	snap    atomic.Pointer[model.Snapshot]
	stopped chan struct{}
	stop    sync.Once
	nextID  atomic.Int64

	mu    sync.Mutex
	conns map[*conn]struct{}

	// pushes counts pushes carried out, for tests.
	pushes atomic.Int64
	// pushHook runs at the start of every push, for tests.
	pushHook func()
}

var _ discoverygrpc.AggregatedDiscoveryServiceServer = (*Server)(nil)

// NewServer returns a server with no snapshot: clients wait until the first Push.
func NewServer(opts Options) *Server {
	opts.Logger = cmp.Or(opts.Logger, slog.New(slog.DiscardHandler))
	opts.PushConcurrency = cmp.Or(opts.PushConcurrency, 16)
	status := newSyncStatus()
	if opts.Clock == nil {
		opts.Clock = RealClock{}
	}
	own := []Observer{peerClaims{log: opts.Logger}, debugAccess{rule: opts.DebugAccess, log: opts.Logger},
		nackLogger{log: opts.Logger}, status}
	return &Server{
		opts:    opts,
		log:     opts.Logger,
		cache:   newCache(opts.Logger, opts.CacheAssert, opts.OnCacheViolation),
		queue:   newPushQueue[*conn](),
		subs:    newSubscriptions(),
		obs:     newChain(append(own, opts.Observers...)...),
		clock:   opts.Clock,
		cp:      newControlPlane(opts.Replica, opts.Version),
		status:  status,
		stopped: make(chan struct{}),
		conns:   map[*conn]struct{}{},
	}
}

// Run pushes queued changes with PushConcurrency workers until ctx ends; then it ends every
// stream so a graceful gRPC stop can finish.
func (s *Server) Run(ctx context.Context) error {
	defer s.stop.Do(func() { close(s.stopped) })
	var wg sync.WaitGroup
	for range s.opts.PushConcurrency {
		wg.Go(func() {
			for {
				c, req, queued, ok := s.queue.Dequeue(ctx)
				if !ok {
					return
				}
				started := time.Now()
				err := c.deliver(ctx, req)
				s.queue.MarkDone(c)
				s.obs.Pushed(Push{Stream: c.info, Request: req, Queued: queued, Started: started, Done: time.Now(), Err: err})
			}
		})
	}
	wg.Wait()
	return nil
}

// Snapshot is the latest snapshot pushed, or nil.
func (s *Server) Snapshot() *model.Snapshot { return s.snap.Load() }

// Connections counts the streams whose proxy identified itself.
func (s *Server) Connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// Push makes snap current and queues a push to each connection ch can affect. tr, when not
// nil, is the push's trace (PushTracer.Start), which follows every connection queued.
func (s *Server) Push(snap *model.Snapshot, ch model.Change, tr *PushTrace) {
	first := s.snap.Swap(snap) == nil
	req := &PushRequest{Full: ch.Full, Configs: ch.Configs, Endpoints: ch.Endpoints, Hosts: ch.Hosts, Forced: first,
		Start: cmp.Or(ch.Since, time.Now())}
	if tr != nil {
		req.Traces = []*PushTrace{tr}
		defer tr.queued()
	}
	for _, c := range s.connList() {
		if c.affected(req, snap) {
			tr.await(c.id)
			s.queue.Enqueue(c, req)
		}
	}
}

// PushAll queues a push of the current snapshot to every connection that sends again all it
// holds, even unchanged (istiod's debug push, /debug/adsz?push=true), and returns how many it
// queued.
func (s *Server) PushAll() int {
	if s.snap.Load() == nil {
		return 0
	}
	req := &PushRequest{Full: true, Forced: true, Resend: true, Start: time.Now()}
	conns := s.connList()
	for _, c := range conns {
		s.queue.Enqueue(c, req)
	}
	return len(conns)
}

// PushSecrets queues an SDS push to the connections of proxies in namespace that watch
// secrets (a Secret there changed): each gets what changed of the secrets it asked for.
func (s *Server) PushSecrets(namespace string) {
	if s.snap.Load() == nil {
		return
	}
	req := &PushRequest{Secrets: true, Start: time.Now()}
	for _, c := range s.connList() {
		if c.proxy.Namespace == namespace && c.watching(resourcev3.SecretType) {
			s.queue.Enqueue(c, req)
		}
	}
}

// connList lists the connections.
func (s *Server) connList() []*conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	return conns
}

func (s *Server) addConn(c *conn) {
	s.mu.Lock()
	s.conns[c] = struct{}{}
	s.mu.Unlock()
}

func (s *Server) removeConn(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.queue.Remove(c)
}

// StreamAggregatedResources serves state-of-the-world ADS.
func (s *Server) StreamAggregatedResources(stream discoverygrpc.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	c := s.newConn(stream.Context(), false)
	c.send = stream.SendMsg
	return serve(s, c, stream.Recv, func(req *discoverygrpc.DiscoveryRequest) error {
		if isDebugType(req.GetTypeUrl()) {
			return c.handleDebugSotW(stream.Context(), req)
		}
		return c.handleSotW(req)
	})
}

// DeltaAggregatedResources serves delta ADS.
func (s *Server) DeltaAggregatedResources(stream discoverygrpc.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	c := s.newConn(stream.Context(), true)
	c.send = stream.SendMsg
	return serve(s, c, stream.Recv, func(req *discoverygrpc.DeltaDiscoveryRequest) error {
		if isDebugType(req.GetTypeUrl()) {
			return c.handleDebugDelta(stream.Context(), req)
		}
		return c.handleDelta(req)
	})
}

// serve runs one stream: requests and pushes are handled by this goroutine only, so a
// connection's state needs no lock except for what Push reads.
func serve[Req any](s *Server, c *conn, recv func() (Req, error), handle func(Req) error) error {
	defer func() {
		close(c.done)
		if c.holdTimer != nil {
			c.holdTimer.Stop()
		}
		s.removeConn(c)
		if c.proxy != nil {
			c.log.Debug("proxy disconnected")
			s.obs.Disconnected(c.info)
		}
	}()
	reqs := make(chan Req)
	errc := make(chan error, 1)
	go func() {
		for {
			req, err := recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case reqs <- req:
			case <-c.done:
				return
			}
		}
	}()
	for {
		select {
		case <-s.stopped:
			return status.Error(codes.Unavailable, "server stopping")
		case err := <-errc:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case req := <-reqs:
			if err := handle(req); err != nil {
				return err
			}
		case item := <-c.pushes:
			item.err = c.push(item.req)
			close(item.done)
			if item.err != nil {
				return item.err
			}
		case q := <-c.queries:
			q()
		case <-c.resume:
			c.holdEnded()
		}
	}
}

type pushItem struct {
	req  *PushRequest
	err  error // set before done is closed
	done chan struct{}
}

// errStreamClosed is a push's error when its stream ended before it was carried out.
var errStreamClosed = status.Error(codes.Canceled, "stream closed")

func (s *Server) peerIdentity(ctx context.Context) string {
	if s.opts.PeerIdentity == nil {
		return ""
	}
	return s.opts.PeerIdentity(ctx)
}

func (s *Server) newConn(ctx context.Context, delta bool) *conn {
	c := &conn{
		s: s, id: s.nextID.Add(1), delta: delta, connectedAt: time.Now(),
		ctx: ctx, peer: s.peerIdentity(ctx), address: peerAddress(ctx),
		watches: map[string]*watch{},
		pushes:  make(chan *pushItem),
		queries: make(chan func()),
		done:    make(chan struct{}),
		log:     s.log,
	}
	c.info = StreamInfo{ID: c.id, Delta: delta, Peer: c.peer}
	return c
}

// deliver hands req to the connection's goroutine and waits until it was pushed, so workers
// bound the number of pushes in flight. It gives up when ctx ends: a stream stuck sending to a
// client that stopped reading must not keep Run from returning.
func (c *conn) deliver(ctx context.Context, req *PushRequest) error {
	item := &pushItem{req: req, done: make(chan struct{})}
	select {
	case c.pushes <- item:
	case <-c.done:
		return errStreamClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-item.done:
	case <-ctx.Done():
		return ctx.Err()
	case <-c.done:
		// The stream closes item.done before it ends, if it took the push.
		select {
		case <-item.done:
		default:
			return errStreamClosed
		}
	}
	return item.err
}

// affected reports whether req can change anything c watches.
func (c *conn) affected(req *PushRequest, snap *model.Snapshot) bool {
	types := affectedTypes(c.proxy, req, snap)
	c.mu.Lock()
	defer c.mu.Unlock()
	for t := range types {
		w := c.watches[t]
		if w == nil {
			continue
		}
		if t != resourcev3.EndpointType || req.Full || req.Forced || w.wildcard {
			return true
		}
		for h := range req.Endpoints {
			if w.sub.hosts[h] > 0 {
				return true
			}
		}
	}
	return false
}
