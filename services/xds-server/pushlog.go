package xdsserver

import (
	"sync"

	"sailplane.dev/shared/monitoring"
)

// pushLogSize is how many recent pushes the status page's convergence chart shows.
const pushLogSize = 500

// pushLog keeps the last pushLogSize pushes to proxies, a ring overwriting the oldest.
type pushLog struct {
	mu   sync.Mutex
	ring []monitoring.PushTiming
	next int // where the next push goes once the ring is full
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
