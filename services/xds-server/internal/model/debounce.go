package model

import (
	"context"
	"time"
)

// Debounce calls fn after signals on in stopped arriving for quiet, or after maxDelay since the
// first signal of a burst so a constant trickle of changes cannot starve rebuilds. It returns
// when ctx is done.
func Debounce(ctx context.Context, in <-chan struct{}, quiet, maxDelay time.Duration, fn func()) {
	if maxDelay <= 0 {
		maxDelay = quiet
	}
	// Go >= 1.23 timers deliver nothing stale after Stop/Reset, so no draining is needed.
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var first time.Time // zero: no burst pending
	for {
		select {
		case <-ctx.Done():
			return
		case <-in:
			now := time.Now()
			if first.IsZero() {
				first = now
			}
			wait := min(quiet, maxDelay-now.Sub(first))
			timer.Reset(max(wait, 0))
		case <-timer.C:
			first = time.Time{}
			fn()
		}
	}
}
