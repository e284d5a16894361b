// Package fakebus is an in-memory bus.Source for tests: it delivers its current state, then
// Synced, then every change pushed later, until the subscriber's context ends.
package fakebus

import (
	"context"
	"slices"
	"sync"

	"sailplane.dev/shared/bus"
)

// Source holds resources by type and fans pushed changes out to its subscribers.
type Source struct {
	mu    sync.Mutex
	state map[string]map[string]*bus.Resource
	subs  map[*subscriber]struct{}
}

var _ bus.Source = (*Source)(nil)

// New returns a source whose initial state is the given changes.
func New(initial ...bus.Change) *Source {
	s := &Source{state: map[string]map[string]*bus.Resource{}, subs: map[*subscriber]struct{}{}}
	for _, c := range initial {
		s.record(c)
	}
	return s
}

type subscriber struct {
	types  []string
	mu     sync.Mutex
	queue  []bus.Change
	wakeup chan struct{}
}

// Push applies a change and delivers it to every subscriber of its type. It never blocks on a
// slow subscriber.
func (s *Source) Push(c bus.Change) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.record(c)
	for sub := range s.subs {
		if !slices.Contains(sub.types, c.TypeURL) {
			continue
		}
		sub.mu.Lock()
		sub.queue = append(sub.queue, c)
		sub.mu.Unlock()
		select {
		case sub.wakeup <- struct{}{}:
		default:
		}
	}
}

func (s *Source) record(c bus.Change) {
	m := s.state[c.TypeURL]
	if m == nil {
		m = map[string]*bus.Resource{}
		s.state[c.TypeURL] = m
	}
	for _, n := range c.Removed {
		delete(m, n)
	}
	for _, r := range c.Updated {
		m[r.Name] = r
	}
}

// Subscribe implements bus.Source.
func (s *Source) Subscribe(ctx context.Context, typeURLs []string, h bus.Handler) error {
	sub := &subscriber{types: slices.Clone(typeURLs), wakeup: make(chan struct{}, 1)}
	s.mu.Lock()
	var initial []bus.Change
	for _, t := range typeURLs {
		c := bus.Change{TypeURL: t}
		for _, r := range s.state[t] {
			c.Updated = append(c.Updated, r)
		}
		initial = append(initial, c)
	}
	// Registered under the same lock as the snapshot above, so no push falls in between.
	s.subs[sub] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.subs, sub)
		s.mu.Unlock()
	}()

	for _, c := range initial {
		// Errors are the handler's NACK; a real producer would not resend, so neither do we.
		_ = h.Apply(c)
	}
	h.Synced()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-sub.wakeup:
		}
		sub.mu.Lock()
		queue := sub.queue
		sub.queue = nil
		sub.mu.Unlock()
		for _, c := range queue {
			_ = h.Apply(c)
		}
	}
}
