package xds

import (
	"context"
	"sync"
	"time"
)

// pushQueue holds at most one pending request per connection, in arrival order; a request for a
// connection already queued merges into it. As istiod's, it knows which connections a worker is
// pushing: a request for one of them waits, merging with any later, until MarkDone, so that a
// slow proxy holds one worker, never two.
type pushQueue[K comparable] struct {
	mu      sync.Mutex
	cond    chan struct{} // closed and replaced when something is enqueued
	order   []K           // the pending keys not in progress, oldest first
	pending map[K]queued
	// inProgress are the keys dequeued and not yet marked done.
	inProgress map[K]struct{}
}

// queued is a pending request and when it entered the queue.
type queued struct {
	req *PushRequest
	at  time.Time
}

func newPushQueue[K comparable]() *pushQueue[K] {
	return &pushQueue[K]{cond: make(chan struct{}), pending: map[K]queued{}, inProgress: map[K]struct{}{}}
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
	if _, busy := q.inProgress[k]; !busy {
		q.ready(k)
	}
}

// ready appends k to the keys workers take; q.mu is held.
func (q *pushQueue[K]) ready(k K) {
	q.order = append(q.order, k)
	close(q.cond)
	q.cond = make(chan struct{})
}

// Dequeue waits for the oldest pending connection not in progress, marks it in progress, and
// returns its request and when it was queued; ok is false when ctx ended.
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
			q.inProgress[k] = struct{}{}
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

// MarkDone ends k's push; a request that came meanwhile is handed to the workers now.
func (q *pushQueue[K]) MarkDone(k K) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.inProgress, k)
	if _, ok := q.pending[k]; ok {
		q.ready(k)
	}
}

// Remove forgets k's pending request (its connection closed); its push in progress, if any,
// is still marked done.
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

// Len is the number of connections waiting for a worker.
func (q *pushQueue[K]) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.order)
}
