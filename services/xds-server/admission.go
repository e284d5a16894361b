package xdsserver

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"

	"sailplane.dev/shared/grpcserver"
)

// Admission control for ADS streams. istiod lets PILOT_MAX_REQUESTS_PER_SECOND (25/s on two
// cores) new streams in and refuses the rest after a second, however fast it could serve them.
// Here the bound is the work itself: at most MaxInitializing streams are in their initial push
// at once, so the server admits as fast as it finishes initial pushes; a stream that finds no
// free place waits up to AdmissionWait in line, and past that (or when the line is full) it is
// refused with Unavailable and a retry delay. The delays are handed out in turn, spaced at the
// rate places free up (measured by how long initial pushes take): the refused come back one
// after the other about when there is room for them, not all at once, and not long after the
// server went idle. A token bucket (AdmissionRate) bounds how fast streams may open at all,
// against floods of short streams.

// The two ADS methods; other methods (health, load reports, certificates) are not admitted.
const (
	sotwMethod  = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
	deltaMethod = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
)

// Admission defaults; see Config.
const (
	defaultAdmissionWait      = 5 * time.Second
	defaultInitialPushTimeout = 10 * time.Second
	defaultSendTimeout        = 30 * time.Second
	// A refused stream is told to wait between these: at most a few seconds, so that turns
	// handed out on a pessimistic measurement cannot leave the server idle for long.
	minRetryHint = 20 * time.Millisecond
	maxRetryHint = 5 * time.Second
)

// defaultMaxInitializing is per core: the initial push is CPU work (generating, encoding and
// framing the config), so more at once only makes each slower. 200 on two cores is about half
// a second of initial pushes at Istio's load-test size (docs/benchmarks.md).
func defaultMaxInitializing() int { return 100 * runtime.GOMAXPROCS(0) }

// defaultAdmissionRate (streams/s) is well above what initial pushes allow (about 400/s on two
// cores at Istio's load-test size, docs/benchmarks.md): it stops floods of streams that end at
// once, never a connect storm the server can serve.
func defaultAdmissionRate() float64 { return 500 * float64(runtime.GOMAXPROCS(0)) }

// admission decides which ADS streams start now, tracks them, and closes those stuck sending.
type admission struct {
	log                *slog.Logger
	maxInitializing    int
	maxWaiting         int
	wait               time.Duration
	initialPushTimeout time.Duration
	sendTimeout        time.Duration
	limiter            *rate.Limiter // nil: no rate limit
	conns              *connTracker

	mu           sync.Mutex
	initializing int
	waiting      []chan struct{} // FIFO; closed when handed a place
	streams      map[*admittedStream]struct{}
	// pushTime is how long an initial push takes, smoothed: with maxInitializing at once,
	// places free up at maxInitializing/pushTime per second (measured this way, the rate does
	// not drop when few streams arrive, as a count of pushes finished would).
	pushTime time.Duration
	// oldest is the age of the oldest initial push in progress, at the last tick: until one
	// finished, pushes take at least that long.
	oldest time.Duration
	// nextTurn is the retry time handed to the last stream refused: each refused stream gets
	// the next turn, spaced at the rate places free up, so that they come back one by one.
	nextTurn time.Time
	refused  atomic.Int64
	metrics  *overloadMetrics
	peak     int // most streams in their initial push at once, for tests
}

func newAdmission(o Overload, log *slog.Logger, conns *connTracker) *admission {
	a := &admission{
		log:                log,
		maxInitializing:    o.MaxInitializing,
		maxWaiting:         10 * o.MaxInitializing,
		wait:               o.AdmissionWait,
		initialPushTimeout: o.InitialPushTimeout,
		sendTimeout:        o.SendTimeout,
		conns:              conns,
		streams:            map[*admittedStream]struct{}{},
	}
	if o.AdmissionRate > 0 {
		a.limiter = rate.NewLimiter(rate.Limit(o.AdmissionRate), max(int(o.AdmissionRate), 1))
	}
	return a
}

// intercept admits ADS streams and passes every other stream through.
func (a *admission) intercept(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if info.FullMethod != sotwMethod && info.FullMethod != deltaMethod {
		return handler(srv, ss)
	}
	if hint, err := a.admit(ss.Context()); err != nil {
		if hint > 0 {
			grpcserver.PushbackTrailer(ss, hint)
		}
		return err
	}
	s := &admittedStream{ServerStream: ss, a: a, opened: time.Now()}
	if p, ok := peer.FromContext(ss.Context()); ok && p.Addr != nil {
		s.peer = p.Addr.String()
	}
	a.mu.Lock()
	a.streams[s] = struct{}{}
	a.mu.Unlock()
	defer func() {
		s.initialized(false)
		a.mu.Lock()
		delete(a.streams, s)
		a.mu.Unlock()
	}()
	return handler(srv, s)
}

// admit waits for a place among the streams in their initial push; it returns the retry delay
// and the error to refuse with when none came in time.
func (a *admission) admit(ctx context.Context) (time.Duration, error) {
	if a.limiter != nil {
		// Like istiod's limiter, but it fails at once when the token is further away than the
		// wait instead of sleeping first.
		wctx, cancel := context.WithTimeout(ctx, a.wait)
		err := a.limiter.Wait(wctx)
		cancel()
		if err != nil {
			return a.refuse(reasonRate, "new ADS streams arrive faster than --xds-admission-rate")
		}
	}
	a.mu.Lock()
	if a.initializing < a.maxInitializing && len(a.waiting) == 0 {
		a.enterLocked()
		a.mu.Unlock()
		return 0, nil
	}
	// Only as many wait as the measured rate lets in within the wait: the others would wait
	// in vain, then be refused behind those who came later.
	if n := len(a.waiting); n >= min(a.maxWaiting, int(a.placesPerSecond()*a.wait.Seconds())) {
		a.mu.Unlock()
		return a.refuse(reasonLineFull, fmt.Sprintf("%d ADS streams in their initial push and %d waiting", a.maxInitializing, n))
	}
	turn := make(chan struct{})
	a.waiting = append(a.waiting, turn)
	a.mu.Unlock()

	t := time.NewTimer(a.wait)
	defer t.Stop()
	select {
	case <-turn:
		return 0, nil
	case <-t.C:
	case <-ctx.Done():
	}
	a.mu.Lock()
	i := slices.Index(a.waiting, turn)
	if i < 0 {
		// Handed a place just as the wait ended: take it.
		a.mu.Unlock()
		return 0, nil
	}
	a.waiting = slices.Delete(a.waiting, i, i+1)
	a.mu.Unlock()
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	return a.refuse(reasonWaited, fmt.Sprintf("%d ADS streams in their initial push, none finished within %s", a.maxInitializing, a.wait))
}

// refuse answers Unavailable with the stream's turn to retry.
func (a *admission) refuse(reason, why string) (time.Duration, error) {
	a.metrics.refuse(reason)
	a.mu.Lock()
	// Optimistic, three times the measured rate: a turn too early costs the stream one more
	// refusal (little), a turn too late leaves places empty, and the rate measured in the
	// middle of a storm (the server busy taking and refusing streams) is lower than the rate
	// by the time the turns come. The line ahead is half gone by the first turn.
	interval := time.Duration(float64(time.Second) / (3 * a.placesPerSecond()))
	now := time.Now()
	after := max(a.nextTurn.Sub(now), time.Duration(len(a.waiting)/2)*interval) + interval
	hint := min(max(after, minRetryHint), maxRetryHint)
	a.nextTurn = now.Add(hint)
	a.mu.Unlock()
	if n := a.refused.Add(1); n%1000 == 1 {
		a.log.Warn("refusing ADS streams: overloaded", "why", why, "retry_after", hint, "refused", n)
	}
	return hint, grpcserver.Overloaded("xds-server: overloaded: "+why, hint)
}

// placesPerSecond is how fast places free up: maxInitializing per initial push time. Until
// one was measured, pushes take as long as the oldest one in progress, and at least 10ms (a
// guess too short costs refused streams one more refusal, by when it is measured).
func (a *admission) placesPerSecond() float64 {
	took := a.pushTime
	if took <= 0 {
		took = max(a.oldest, 10*time.Millisecond)
	}
	return float64(a.maxInitializing) / took.Seconds()
}

func (a *admission) enterLocked() {
	a.initializing++
	a.peak = max(a.peak, a.initializing)
}

// leave frees a place: the oldest waiting stream takes it.
func (a *admission) leave(took time.Duration, measured bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if measured {
		if a.pushTime == 0 {
			a.pushTime = took
		}
		a.pushTime = (7*a.pushTime + took) / 8
	}
	if len(a.waiting) > 0 {
		close(a.waiting[0])
		a.waiting = slices.Delete(a.waiting, 0, 1)
		return
	}
	a.initializing--
}

// Run ends initial pushes that take too long (a client that never answers), and closes the
// connections of streams stuck sending (a client that stopped reading), until ctx ends.
func (a *admission) Run(ctx context.Context) error {
	const tick = 250 * time.Millisecond
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		now := time.Now()
		var stuck, slow []*admittedStream
		a.mu.Lock()
		a.oldest = 0
		for s := range a.streams {
			if since := s.sendingSince.Load(); since != 0 && a.sendTimeout > 0 && now.Sub(time.Unix(0, since)) > a.sendTimeout {
				stuck = append(stuck, s)
			}
			if age := now.Sub(s.opened); !s.done.Load() {
				a.oldest = max(a.oldest, age)
				if age > a.initialPushTimeout {
					slow = append(slow, s)
				}
			}
		}
		a.mu.Unlock()
		for _, s := range slow {
			// Not measured: a client that never answers says nothing of the server's speed.
			s.initialized(false)
		}
		for _, s := range stuck {
			// The client's flow-control window stays shut: its stream cannot end cleanly, its
			// connection can. It reconnects, as after any connection loss.
			if a.conns.close(s.peer) {
				a.metrics.close(reasonSendTimeout)
				a.log.Warn("closing connection: an xDS response could not be sent within the send timeout (the client does not read)",
					"peer", s.peer, "timeout", a.sendTimeout)
			}
		}
	}
}

// newest returns up to n streams that finished their initial push, newest first.
func (a *admission) newest(n int) []*admittedStream {
	a.mu.Lock()
	var done []*admittedStream
	for s := range a.streams {
		if s.done.Load() {
			done = append(done, s)
		}
	}
	a.mu.Unlock()
	slices.SortFunc(done, func(x, y *admittedStream) int { return y.opened.Compare(x.opened) })
	return done[:min(n, len(done))]
}

// Streams counts the ADS streams admitted and open.
func (a *admission) Streams() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.streams)
}

// admittedStream watches an admitted ADS stream: its initial push is over once every response
// sent was answered and every request that asks for something new was answered (or after
// InitialPushTimeout); a SendMsg still blocked after SendTimeout closes its connection. This is
// read from the messages, so it is approximate: a client that ACKs one type before it asks for
// the next ends its initial push early, which only lets the next stream in sooner.
type admittedStream struct {
	grpc.ServerStream
	a      *admission
	peer   string
	opened time.Time

	sendingSince atomic.Int64 // unix ns when the SendMsg in progress started; 0: none
	done         atomic.Bool  // initial push over, place given back

	mu          sync.Mutex
	asked, sent int // requests without a nonce (asking anew), responses sent
	answered    int // requests carrying a nonce (ACK or NACK)
}

func (s *admittedStream) SendMsg(m any) error {
	// Counted first: the answer may come before SendMsg returns.
	s.mu.Lock()
	s.sent++
	s.mu.Unlock()
	s.sendingSince.Store(time.Now().UnixNano())
	err := s.ServerStream.SendMsg(m)
	s.sendingSince.Store(0)
	return err
}

func (s *admittedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if s.done.Load() {
		return nil
	}
	req, ok := m.(interface{ GetResponseNonce() string })
	if !ok {
		return nil
	}
	s.mu.Lock()
	if req.GetResponseNonce() == "" {
		s.asked++
	} else {
		s.answered++
	}
	settled := s.sent > 0 && s.answered >= s.sent && s.sent >= s.asked
	s.mu.Unlock()
	if settled {
		s.initialized(true)
	}
	return nil
}

// initialized gives the stream's place back, once; measured says the client answered its
// initial push, whose duration then counts in the server's measured speed.
func (s *admittedStream) initialized(measured bool) {
	if s.done.CompareAndSwap(false, true) {
		s.a.leave(time.Since(s.opened), measured)
	}
}
