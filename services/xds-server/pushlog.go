package xdsserver

import (
	"sync"

	"sailplane.dev/services/xds-server/internal/xds"
	"sailplane.dev/shared/monitoring"
)

// pushLogSize is how many recent pushes the status page's convergence chart shows.
const pushLogSize = 500

// pushLog is the observer keeping the last pushLogSize pushes to proxies, a ring overwriting
// the oldest.
type pushLog struct {
	xds.NopObserver
	mu   sync.Mutex
	ring []monitoring.PushTiming
	next int // where the next push goes once the ring is full
}

var _ xds.Observer = (*pushLog)(nil)

// Pushed records a push: its convergence time runs from the change first seen to its last
// response sent.
func (l *pushLog) Pushed(p xds.Push) {
	l.add(monitoring.PushTiming{Proxy: p.Stream.Proxy.ID, Done: p.Done, Convergence: p.Done.Sub(p.Request.Start), Failed: p.Err != nil})
}

func (l *pushLog) add(p monitoring.PushTiming) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.ring) < pushLogSize {
		l.ring = append(l.ring, p)
		return
	}
	l.ring[l.next] = p
	l.next = (l.next + 1) % pushLogSize
}

// list is the kept pushes, oldest first.
func (l *pushLog) list() []monitoring.PushTiming {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]monitoring.PushTiming, 0, len(l.ring))
	out = append(out, l.ring[l.next:]...)
	return append(out, l.ring[:l.next]...)
}
