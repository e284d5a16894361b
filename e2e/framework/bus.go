package framework

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"

	"sailplane.dev/shared/bus"
)

// BusRecorder is a real bus consumer (delta ADS over gRPC) that keeps the latest state of the
// types it subscribed to, for tests to assert on.
type BusRecorder struct {
	mu     sync.Mutex
	state  map[string]map[string]*bus.Resource // type URL -> name -> resource
	synced bool
}

var _ bus.Handler = (*BusRecorder)(nil)

// RecordBus subscribes to typeURLs on the plaintext bus at addr until the test ends.
func RecordBus(t testing.TB, addr string, typeURLs ...string) *BusRecorder {
	t.Helper()
	return RecordSecureBus(t, addr, bus.Security{}, typeURLs...)
}

// RecordSecureBus is RecordBus over the bus's protection sec (mTLS with an identity the bus
// allows, or plaintext when sec is zero).
func RecordSecureBus(t testing.TB, addr string, sec bus.Security, typeURLs ...string) *BusRecorder {
	t.Helper()
	r := &BusRecorder{state: map[string]map[string]*bus.Resource{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := bus.Dial(addr, bus.WithSecurity(sec)).Subscribe(ctx, typeURLs, r); err != nil && ctx.Err() == nil {
			t.Errorf("bus subscription to %s: %v", addr, err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return r
}

// Apply records a change.
func (r *BusRecorder) Apply(c bus.Change) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.state[c.TypeURL]
	if m == nil {
		m = map[string]*bus.Resource{}
		r.state[c.TypeURL] = m
	}
	for _, res := range c.Updated {
		m[res.Name] = res
	}
	for _, name := range c.Removed {
		delete(m, name)
	}
	return nil
}

// Synced records that the first full state arrived.
func (r *BusRecorder) Synced() {
	r.mu.Lock()
	r.synced = true
	r.mu.Unlock()
}

// Get returns the current resource of a type by name.
func (r *BusRecorder) Get(typeURL, name string) (*bus.Resource, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	res, ok := r.state[typeURL][name]
	return res, ok
}

// Names lists the current resource names of a type, sorted.
func (r *BusRecorder) Names(typeURL string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.state[typeURL]))
}

// HasAll returns nil when the bus carries every name of the type, else an error listing what
// is missing.
func (r *BusRecorder) HasAll(typeURL string, names ...string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.synced {
		return fmt.Errorf("bus consumer not synced yet")
	}
	var missing []string
	for _, n := range names {
		if _, ok := r.state[typeURL][n]; !ok {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s missing on the bus: %v (have %v)", typeURL, missing, slices.Sorted(maps.Keys(r.state[typeURL])))
	}
	return nil
}
