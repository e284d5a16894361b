package consul

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"sailplane.dev/shared/telemetry"
)

// watch runs one blocking query until ctx is done, calling deliver with every result whose index
// changed (and with the first one); deliver returns false to stop. Failures are retried with
// backoff and never delivered, so the caller keeps its last state. quiet logs repeated failures
// at Debug: the per-service watches fail together with the list's, which already warns.
func watch[T any](ctx context.Context, s *Source, what string, quiet bool,
	fetch func(*api.QueryOptions) (T, *api.QueryMeta, error), deliver func(T) bool) {
	var (
		index    uint64
		fresh    = true // the next result must be delivered whatever its index
		failures int
		last     time.Time
	)
	for {
		// Rate limit between query starts, as Consul recommends: a key that changes constantly
		// would otherwise make the blocking query spin.
		if !last.IsZero() && s.cfg.MinWait > 0 {
			if !sleep(ctx, s.cfg.MinWait-time.Since(last)) {
				return
			}
		}
		last = time.Now()
		// Taken before the query: a watch that reaches Consul while this one fails wakes it.
		woken := s.reachable.wait()
		q := (&api.QueryOptions{
			Datacenter: s.cfg.Datacenter,
			WaitIndex:  index,
			WaitTime:   s.cfg.WaitTime,
		}).WithContext(ctx)
		v, meta, err := fetch(q)
		if ctx.Err() != nil {
			return
		}
		if err == nil && meta == nil {
			err = errors.New("no query metadata in the answer")
		}
		if err != nil {
			s.watchFailed(what)
			failures++
			delay := backoff(s.cfg.Backoff, failures)
			level := s.log.Warn
			if quiet && failures > 1 {
				level = s.log.Debug
			}
			level("consul query failed, keeping the last known state and retrying",
				"query", what, "attempt", failures, "retry_in", delay.Round(time.Millisecond), "err", redact(err, s.token))
			// The agent may be another one when it answers again (restarted, failed over):
			// start over with a non-blocking query, which is a full resync.
			index, fresh = 0, true
			if !sleepOrWoken(ctx, delay, woken) {
				return
			}
			continue
		}
		if failures > 0 {
			s.log.Info("consul query succeeded again", "query", what, "after_failures", failures)
			failures = 0
			s.reachable.wake()
		}
		s.log.Debug("consul query answered", "query", what, "wait_index", index, "index", meta.LastIndex)
		changed := fresh || meta.LastIndex != index
		switch {
		case meta.LastIndex < index:
			// The index went backwards (snapshot restore, new cluster): Consul says reset to 0.
			index = 0
		case meta.LastIndex == 0:
			// Never valid after a query; waiting on 0 would return at once, so wait on 1.
			index = 1
		default:
			index = meta.LastIndex
		}
		fresh = false
		if changed && !deliver(v) {
			return
		}
	}
}

// newWatchErrors is sailplane_consul_watch_errors_total{query}.
func newWatchErrors(provider metric.MeterProvider) metric.Int64Counter {
	c, err := telemetry.Meter(provider, "sailplane.dev/consul").Int64Counter("sailplane_consul_watch_errors_total",
		metric.WithDescription("Consul blocking queries that failed, by query: the service list (services) or one service's instances (service)."))
	telemetry.Handle(err)
	return c
}

// watchFailed counts a failed query in sailplane_consul_watch_errors_total: "services" for the
// service list, "service" for one service's instances (a label per service would grow with the
// catalog).
func (s *Source) watchFailed(what string) {
	query := "service"
	if what == serviceListQuery {
		query = "services"
	}
	s.watchErrors.Add(context.Background(), 1, metric.WithAttributes(attribute.String("query", query)))
}

// backoff is the delay before retry number failures (1-based): Initial doubling up to Max,
// then jittered into [d/2, d) so that many watches failing together do not retry in step.
func backoff(b Backoff, failures int) time.Duration {
	d := b.Initial
	for i := 1; i < failures && d < b.Max; i++ {
		d *= 2
	}
	d = min(d, b.Max)
	half := d / 2
	if half <= 0 {
		return d
	}
	return half + rand.N(half)
}

// sleep waits for d or until ctx is done; it reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	return sleepOrWoken(ctx, d, nil)
}

// sleepOrWoken is sleep cut short when woken is closed.
func sleepOrWoken(ctx context.Context, d time.Duration, woken <-chan struct{}) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-woken:
	case <-ctx.Done():
		return false
	}
	return true
}

// wakeup wakes every waiter at once. A nil *wakeup never wakes anyone.
type wakeup struct {
	mu sync.Mutex
	ch chan struct{}
}

// wait returns a channel closed at the next wake.
func (w *wakeup) wait() <-chan struct{} {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch == nil {
		w.ch = make(chan struct{})
	}
	return w.ch
}

func (w *wakeup) wake() {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch != nil {
		close(w.ch)
		w.ch = nil
	}
}

// redactedError is an error whose text had the ACL token removed. It deliberately has no
// Unwrap: the wrapped error's text still holds the token.
type redactedError struct{ msg string }

func (e *redactedError) Error() string { return e.msg }

// redact removes token from err's text. The api client sends the token in a header, so it
// should never be there; this is the guarantee that it is not.
func redact(err error, token string) error {
	if err == nil || token == "" || !strings.Contains(err.Error(), token) {
		return err
	}
	return &redactedError{msg: strings.ReplaceAll(err.Error(), token, "[redacted]")}
}
