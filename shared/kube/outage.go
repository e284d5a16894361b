package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"k8s.io/client-go/rest"
)

// ErrUnreachable marks an API server that does not answer.
var ErrUnreachable = errors.New("kubernetes API server unreachable")

// Probe backoff while the API server is down: short, so that it is seen back within about a
// second.
const (
	probeInitial = 100 * time.Millisecond
	probeMax     = time.Second
)

// Outages notices when an API server stops answering and, once it answers again, has the
// caller resync at once.
//
// Without it, each informer's reflector retries on client-go's own backoff (800 ms doubling to
// a 30 s cap, with full jitter), so after an outage of half a minute changes take 30–90 s to
// arrive. client-go v0.37 has ReflectorOptions.Backoff but shared informers do not expose it
// (kubernetes#136943), so the caller restarts its informers instead: Run probes the server
// with a short backoff while it is down and calls resync when it answers.
type Outages struct {
	host string
	log  *slog.Logger
	// failed holds one token once a request failed at the network level.
	failed chan struct{}

	mu    sync.Mutex
	err   error     // the last failure; nil while the server answers
	since time.Time // when the current outage was first seen
}

// NewOutages tracks the API server at host; log names it.
func NewOutages(host string, log *slog.Logger) *Outages {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Outages{host: host, log: log, failed: make(chan struct{}, 1)}
}

// Wrap is a rest.Config WrapTransport: the requests of every client built from that config
// report their network failures (informers retry a refused watch quietly, without calling
// their watch error handler, so the transport is where an outage shows first).
func (o *Outages) Wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		if err != nil && req.Context().Err() == nil { // a canceled request is ours, not the server's
			o.fail(err)
		}
		return resp, err
	})
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

func (o *Outages) fail(err error) {
	o.mu.Lock()
	if o.err == nil {
		o.since = time.Now()
		o.log.Warn("kubernetes API server unreachable; probing until it answers", "host", o.host, "error", err)
	}
	o.err = fmt.Errorf("%w: %s: %w", ErrUnreachable, o.host, err)
	o.mu.Unlock()
	o.signal()
}

func (o *Outages) signal() {
	select {
	case o.failed <- struct{}{}:
	default:
	}
}

// Err says why the API server is taken as unreachable (wrapping ErrUnreachable), nil when it
// answers and everything was resynced since it last failed.
func (o *Outages) Err() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.err
}

// Run waits for a failed request, then probes the server's /readyz through probe (a client of
// the same server, e.g. its discovery REST client) with a short backoff until it answers, and
// calls resync. A request failing while resync runs cancels it and the probing starts over.
// It returns when ctx is done.
func (o *Outages) Run(ctx context.Context, probe rest.Interface, resync func(context.Context) error) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-o.failed:
		}
		if !o.probe(ctx, probe) {
			return
		}
		// Failures seen before the server answered are the outage's.
		select {
		case <-o.failed:
		default:
		}
		start := time.Now()
		rctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Go(func() {
			select {
			case <-rctx.Done():
			case <-o.failed:
				o.signal() // down again: the loop probes again
				cancel()
			}
		})
		err := resync(rctx)
		cancel()
		wg.Wait()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			o.log.Warn("resync after an API server outage interrupted; probing again", "host", o.host, "error", err)
			o.signal()
			continue
		}
		o.mu.Lock()
		down := start.Sub(o.since)
		o.err = nil
		o.mu.Unlock()
		o.log.Info(fmt.Sprintf("API server reachable again, resynced in %v", time.Since(start).Round(time.Millisecond)),
			"host", o.host, "unreachable_for", down.Round(time.Millisecond))
	}
}

// probe returns true once the server's /readyz answers, false when ctx is done first.
func (o *Outages) probe(ctx context.Context, probe rest.Interface) bool {
	delay := probeInitial
	for {
		pctx, cancel := context.WithTimeout(ctx, probeMax)
		var code int
		err := probe.Get().AbsPath("/readyz").Do(pctx).StatusCode(&code).Error()
		cancel()
		// A refusal (e.g. RBAC's 403) is an answer too; 5xx means not ready yet.
		if err == nil || (code != 0 && code < http.StatusInternalServerError && code != http.StatusTooManyRequests) {
			return true
		}
		o.log.Debug("API server probe failed", "host", o.host, "error", err)
		// Jitter spreads many control plane replicas' probes.
		t := time.NewTimer(delay/2 + rand.N(delay/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
		delay = min(2*delay, probeMax)
	}
}
