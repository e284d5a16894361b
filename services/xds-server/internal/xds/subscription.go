package xds

import (
	"hash/maphash"
	"runtime"
	"slices"
	"sync"
	"weak"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// subscription is the immutable set of resource names a watch asked for. Watches asking for
// the same names share one: every sidecar of a scope asks for the same thousand EDS clusters,
// and per-connection copies of those sets were, after the client states, the largest part of
// the server's memory. A change derives a new subscription.
type subscription struct {
	typeURL string // hosts depend on it: equal names of two types are two subscriptions
	names   map[string]struct{}
	hosts   map[string]int // endpoints only: hostname -> watched clusters of it
	sorted  []string
}

var emptySubscription = &subscription{names: map[string]struct{}{}, hosts: map[string]int{}}

func (s *subscription) has(name string) bool {
	_, ok := s.names[name]
	return ok
}

// subscriptions interns subscriptions by content. Entries are weak: a subscription no watch
// uses any more is collected and its entry removed.
type subscriptions struct {
	seed  maphash.Seed
	mu    sync.Mutex
	table map[uint64][]weak.Pointer[subscription]
}

func newSubscriptions() *subscriptions {
	return &subscriptions{seed: maphash.MakeSeed(), table: map[uint64][]weak.Pointer[subscription]{}}
}

// derive returns cur with add and remove applied, shared with any watch holding the same names.
func (t *subscriptions) derive(cur *subscription, typeURL string, add, remove []string) *subscription {
	var gone map[string]bool
	for _, n := range remove {
		if cur.has(n) {
			if gone == nil {
				gone = map[string]bool{}
			}
			gone[n] = true
		}
	}
	var fresh []string
	for _, n := range add {
		if !cur.has(n) || gone[n] {
			fresh = append(fresh, n)
		}
	}
	if len(gone) == 0 && len(fresh) == 0 {
		return cur
	}
	sorted := make([]string, 0, len(cur.sorted)+len(fresh))
	for _, n := range cur.sorted {
		if !gone[n] {
			sorted = append(sorted, n)
		}
	}
	sorted = append(sorted, fresh...)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	if len(sorted) == 0 {
		return emptySubscription
	}

	var h maphash.Hash
	h.SetSeed(t.seed)
	h.WriteString(typeURL)
	h.WriteByte(0)
	for _, n := range sorted {
		h.WriteString(n)
		h.WriteByte(0)
	}
	key := h.Sum64()
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, wp := range t.table[key] {
		if s := wp.Value(); s != nil && s.typeURL == typeURL && slices.Equal(s.sorted, sorted) {
			return s
		}
	}
	s := &subscription{typeURL: typeURL, names: make(map[string]struct{}, len(sorted)), hosts: map[string]int{}, sorted: sorted}
	for _, n := range sorted {
		s.names[n] = struct{}{}
		if h := hostOfCluster(n); h != "" && typeURL == resourcev3.EndpointType {
			s.hosts[h]++
		}
	}
	t.table[key] = append(t.table[key], weak.Make(s))
	runtime.AddCleanup(s, t.forget, key)
	return s
}

// forget drops the collected entries under key.
func (t *subscriptions) forget(key uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	live := slices.DeleteFunc(t.table[key], func(wp weak.Pointer[subscription]) bool { return wp.Value() == nil })
	if len(live) == 0 {
		delete(t.table, key)
	} else {
		t.table[key] = live
	}
}
