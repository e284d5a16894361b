package e2e

import (
	"context"
	"testing"
	"time"
)

// pacedCalls makes calls one after the other, one each interval at most, from its own goroutine
// until stop or the end of the test: the steady traffic a workload sends through a fault.
type pacedCalls struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// startPaced starts calling call; call gets a context ended by stop, and a call it cuts short
// is the caller's to ignore (ctx.Err() != nil), not a failure.
func startPaced(t *testing.T, every time.Duration, call func(ctx context.Context)) *pacedCalls {
	ctx, cancel := context.WithCancel(context.Background())
	p := &pacedCalls{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			call(ctx)
		}
	}()
	t.Cleanup(p.stop)
	return p
}

// stop ends the calls and waits for the last one.
func (p *pacedCalls) stop() {
	p.cancel()
	<-p.done
}
