package xds

import (
	"context"
	"time"
)

// Clock lets tests drive time.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) Timer
}

// Timer is the part of *time.Timer the debouncer uses.
type Timer interface {
	C() <-chan time.Time
	Reset(d time.Duration)
	Stop()
}

// RealClock is the wall clock.
type RealClock struct{}

func (RealClock) Now() time.Time { return time.Now() }

func (RealClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time   { return r.t.C }
func (r realTimer) Reset(d time.Duration) { r.t.Reset(d) }
func (r realTimer) Stop()                 { r.t.Stop() }

// Debounce calls fn once signals on in stopped arriving for quiet, or maxDelay after the first
// signal of a burst, so a steady trickle of changes cannot starve pushes. It returns when ctx
// is done.
func Debounce(ctx context.Context, clock Clock, in <-chan struct{}, quiet, maxDelay time.Duration, fn func()) {
	DebounceFunc(ctx, clock, in, func() time.Duration { return quiet }, maxDelay, fn)
}

// DebounceFunc is Debounce with the quiet period asked again at every signal, so that what is
// pending can choose it (endpoint changes need less settling than config changes).
func DebounceFunc(ctx context.Context, clock Clock, in <-chan struct{}, quietFor func() time.Duration,
	maxDelay time.Duration, fn func()) {
	if clock == nil {
		clock = RealClock{}
	}
	// Go >= 1.23 timers deliver nothing stale after Stop/Reset, so no draining is needed.
	timer := clock.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var first time.Time // zero: no burst pending
	for {
		select {
		case <-ctx.Done():
			return
		case <-in:
			now := clock.Now()
			if first.IsZero() {
				first = now
			}
			quiet := quietFor()
			timer.Reset(max(min(quiet, max(maxDelay, quiet)-now.Sub(first)), 0))
		case <-timer.C():
			first = time.Time{}
			fn()
		}
	}
}
