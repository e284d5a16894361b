package xds

import (
	"context"
	"sync"
	"time"
)

// pushQueue holds at most one pending request per connection, in arrival order; a request for a
// connection already queued merges into it.
type pushQueue[K comparable] struct {
	mu      sync.Mutex
	cond    chan struct{} // closed and replaced when something is enqueued
	order   []K
	pending map[K]queued
}

// queued is a pending request and when it entered the queue.
type queued struct {
	req *PushRequest
	at  time.Time
}

func newPushQueue[K comparable]() *pushQueue[K] {
	return &pushQueue[K]{cond: make(chan struct{}), pending: map[K]queued{}}
}

// Enqueue adds or merges req for k.
func (q *pushQueue[K]) Enqueue(k K, req *PushRequest) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if old, ok := q.pending[k]; ok {
		q.pending[k] = queued{old.req.Merge(req), old.at}
		return
	}
	q.pending[k] = queued{req, time.Now()}
	q.order = append(q.order, k)
	close(q.cond)
	q.cond = make(chan struct{})
}

// Dequeue waits for the oldest pending connection and returns its request and when it was
// queued; ok is false when ctx ended.
func (q *pushQueue[K]) Dequeue(ctx context.Context) (k K, req *PushRequest, at time.Time, ok bool) {
	for {
		q.mu.Lock()
		if len(q.order) > 0 {
			k = q.order[0]
			var zero K
			q.order[0] = zero
			q.order = q.order[1:]
			p := q.pending[k]
			delete(q.pending, k)
			q.mu.Unlock()
			return k, p.req, p.at, true
		}
		wait := q.cond
		q.mu.Unlock()
		select {
		case <-ctx.Done():
			return k, nil, time.Time{}, false
		case <-wait:
		}
	}
}

// Remove forgets k (its connection closed).
func (q *pushQueue[K]) Remove(k K) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, ok := q.pending[k]; !ok {
		return
	}
	delete(q.pending, k)
	for i, o := range q.order {
		if o == k {
			q.order = append(q.order[:i], q.order[i+1:]...)
			break
		}
	}
}

// Len is the number of connections waiting.
func (q *pushQueue[K]) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.order)
}
