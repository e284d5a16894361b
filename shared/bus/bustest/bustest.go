// Package bustest is the conformance suite every bus transport passes: run it from a transport's
// tests with a function that returns a Source reading a given Store.
package bustest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	networking "istio.io/api/networking/v1alpha3"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
)

// Reconnector is implemented by the Source of a transport that can lose its producer.
// Disconnect cuts every consumer off while the Store keeps changing; Reconnect lets them back.
// Transports without a peer (in-process) do not implement it, and the suite runs the
// in-process equivalent instead: a new Subscribe, which delivers the full state.
type Reconnector interface {
	Disconnect(t *testing.T)
	Reconnect(t *testing.T)
}

// Timeout bounds every wait of the suite.
const Timeout = 10 * time.Second

var (
	vsType = schema.VirtualService.TypeURL
	drType = schema.DestinationRule.TypeURL
	// unknownType is a type no producer has: it must still sync, empty.
	unknownType = "example.com/v1/Unknown"
	allTypes    = []string{vsType, drType, unknownType}
)

// Run runs the conformance suite. newTransport is called once per case, with a fresh Store.
func Run(t *testing.T, newTransport func(t *testing.T, s *bus.Store) bus.Source) {
	t.Run("initial_sync", func(t *testing.T) { testInitialSync(t, newTransport) })
	t.Run("updates_and_deletions", func(t *testing.T) { testUpdates(t, newTransport) })
	t.Run("replace", func(t *testing.T) { testReplace(t, newTransport) })
	t.Run("sync_after_producer_ready", func(t *testing.T) { testSyncAfter(t, newTransport) })
	t.Run("reconnect", func(t *testing.T) { testReconnect(t, newTransport) })
	t.Run("nack", func(t *testing.T) { testNACK(t, newTransport) })
	t.Run("stuck_consumer", func(t *testing.T) { testStuckConsumer(t, newTransport) })
	t.Run("100_consumers", func(t *testing.T) { testManyConsumers(t, newTransport) })
}

func testInitialSync(t *testing.T, newTransport func(*testing.T, *bus.Store) bus.Source) {
	s := bus.NewStore()
	publish(s, 0, 200, 20, "a")
	src := newTransport(t, s)
	h := NewRecorder()
	Subscribe(t, src, allTypes, h)
	WaitFor(t, "synced", func() bool { return h.SyncedCount() == 1 })
	if got := h.SizeAtSynced(); got != 220 {
		t.Errorf("resources applied before Synced = %d, want 220", got)
	}
	WaitConverged(t, s, h, allTypes...)
	if !h.SawType(unknownType) {
		t.Errorf("no Apply for the unknown type %s before Synced", unknownType)
	}
	if n := h.SyncedCount(); n != 1 {
		t.Errorf("Synced called %d times", n)
	}
}

// testSyncAfter: a consumer subscribed while its producer is still loading must not see a
// partial state as "synced".
func testSyncAfter(t *testing.T, newTransport func(*testing.T, *bus.Store) bus.Source) {
	s := bus.NewStore()
	ready := make(chan struct{})
	s.SyncAfter(ready, vsType)
	publish(s, 0, 50, 10, "a")
	src := newTransport(t, s)
	h := NewRecorder()
	// DestinationRules are not held, so seeing them proves the consumer is subscribed and
	// would have had the (partial) VirtualServices too if the hold did not work.
	Subscribe(t, src, []string{drType, vsType}, h)
	WaitFor(t, "DestinationRules delivered", func() bool { return h.SawType(drType) })
	publish(s, 50, 100, 0, "a")
	if n := h.SyncedCount(); n != 0 || h.SawType(vsType) {
		t.Fatalf("VirtualServices delivered before their producer was ready")
	}
	close(ready)
	WaitFor(t, "synced", func() bool { return h.SyncedCount() == 1 })
	if got := h.SizeAtSynced(); got != 110 {
		t.Errorf("resources applied before Synced = %d, want 110", got)
	}
}

func testUpdates(t *testing.T, newTransport func(*testing.T, *bus.Store) bus.Source) {
	s := bus.NewStore()
	publish(s, 0, 50, 5, "a")
	h := NewRecorder()
	Subscribe(t, newTransport(t, s), allTypes, h)
	WaitConverged(t, s, h, allTypes...)

	mark := h.Mark()
	// Same content again: no version change, nothing to deliver.
	s.Upsert(vsType, VirtualService("ns/vs-1", "", "a"))
	s.Upsert(vsType, VirtualService("ns/vs-2", "", "b"), VirtualService("ns/vs-new", "", "a"))
	s.Delete(vsType, "ns/vs-3", "ns/vs-4", "ns/never-existed")
	s.Delete(drType, "ns/dr-0")
	WaitConverged(t, s, h, allTypes...)
	want := []string{"ns/dr-0", "ns/vs-2", "ns/vs-3", "ns/vs-4", "ns/vs-new"}
	if got := h.TouchedSince(mark); !equalSets(got, want) {
		t.Errorf("delivered since the change = %v, want %v", got, want)
	}
	if n := h.SyncedCount(); n != 1 {
		t.Errorf("Synced called %d times", n)
	}
}

func testReplace(t *testing.T, newTransport func(*testing.T, *bus.Store) bus.Source) {
	s := bus.NewStore()
	publish(s, 0, 20, 0, "a")
	h := NewRecorder()
	Subscribe(t, newTransport(t, s), []string{vsType}, h)
	WaitConverged(t, s, h, vsType)

	var keep []*bus.Resource
	for i := 0; i < 10; i++ {
		host := "a"
		if i == 0 {
			host = "changed"
		}
		keep = append(keep, VirtualService(fmt.Sprintf("ns/vs-%d", i), "", host))
	}
	s.Replace(vsType, keep)
	WaitConverged(t, s, h, vsType)
	if n := len(h.State(vsType)); n != 10 {
		t.Errorf("consumer holds %d resources after Replace, want 10", n)
	}
}

func testReconnect(t *testing.T, newTransport func(*testing.T, *bus.Store) bus.Source) {
	s := bus.NewStore()
	publish(s, 0, 100, 10, "a")
	src := newTransport(t, s)
	rc, ok := src.(Reconnector)
	if !ok {
		// In-process: there is no peer to lose. The equivalent is a consumer that subscribes
		// again after changes it missed; it gets the full current state, deletions included.
		t.Run("resubscribe_in_process_full_state", func(t *testing.T) {
			h := NewRecorder()
			cancel := Subscribe(t, src, allTypes, h)
			WaitConverged(t, s, h, allTypes...)
			cancel()
			mutateWhileAway(s)
			h2 := NewRecorder()
			Subscribe(t, src, allTypes, h2)
			WaitConverged(t, s, h2, allTypes...)
			if _, ok := h2.State(vsType)["ns/vs-1"]; ok {
				t.Errorf("deleted resource still present")
			}
		})
		return
	}
	h := NewRecorder()
	Subscribe(t, src, allTypes, h)
	WaitConverged(t, s, h, allTypes...)

	rc.Disconnect(t)
	mark := h.Mark()
	mutateWhileAway(s)
	rc.Reconnect(t)
	WaitConverged(t, s, h, allTypes...)
	want := []string{"ns/vs-0", "ns/vs-1", "ns/vs-away", "ns/dr-0"}
	if got := h.TouchedSince(mark); !equalSets(got, want) {
		t.Errorf("delivered after reconnecting = %v, want only the difference %v", got, want)
	}
	if n := h.SyncedCount(); n != 1 {
		t.Errorf("Synced called %d times, want once", n)
	}
}

func mutateWhileAway(s *bus.Store) {
	s.Upsert(vsType, VirtualService("ns/vs-0", "", "away"), VirtualService("ns/vs-away", "", "a"))
	s.Delete(vsType, "ns/vs-1")
	s.Delete(drType, "ns/dr-0")
}

func testNACK(t *testing.T, newTransport func(*testing.T, *bus.Store) bus.Source) {
	s := bus.NewStore()
	s.Upsert(vsType, VirtualService("ns/x", "v1", "a"), VirtualService("ns/y", "v1", "a"))
	h := NewRecorder()
	h.RejectVersion("ns/x", "v2", "x v2 is bad")
	Subscribe(t, newTransport(t, s), []string{vsType}, h)
	WaitConverged(t, s, h, vsType)

	s.Upsert(vsType, VirtualService("ns/x", "v2", "bad"))
	WaitFor(t, "rejection recorded", func() bool {
		for _, r := range s.Rejections() {
			if r.TypeURL == vsType && r.Name == "ns/x" && r.Version == "v2" && strings.Contains(r.Err, "x v2 is bad") {
				return true
			}
		}
		return false
	})
	if v := h.State(vsType)["ns/x"]; v != "v1" {
		t.Errorf("consumer holds ns/x@%s after rejecting v2, want v1", v)
	}
	// Another change of the type must not bring v2 back.
	s.Upsert(vsType, VirtualService("ns/y", "v2", "b"))
	WaitFor(t, "ns/y@v2", func() bool { return h.State(vsType)["ns/y"] == "v2" })
	s.Upsert(vsType, VirtualService("ns/x", "v3", "good"))
	WaitFor(t, "ns/x@v3", func() bool { return h.State(vsType)["ns/x"] == "v3" })
	if n := h.Offered("ns/x", "v2"); n != 1 {
		t.Errorf("ns/x@v2 offered %d times, want once", n)
	}
}

func testStuckConsumer(t *testing.T, newTransport func(*testing.T, *bus.Store) bus.Source) {
	s := bus.NewStore()
	publish(s, 0, 20, 0, "a")
	src := newTransport(t, s)
	stuck, other := NewRecorder(), NewRecorder()
	Subscribe(t, src, []string{vsType}, stuck)
	Subscribe(t, src, []string{vsType}, other)
	WaitConverged(t, s, stuck, vsType)
	WaitConverged(t, s, other, vsType)

	release := stuck.BlockNext()
	defer release()
	s.Upsert(vsType, VirtualService("ns/vs-0", "", "block"))
	WaitFor(t, "consumer stuck in Apply", stuck.Blocked)

	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 2000; i++ {
			s.Upsert(vsType, VirtualService(fmt.Sprintf("ns/vs-%d", i%20), "", fmt.Sprintf("h%d", i)))
		}
	}()
	select {
	case <-done:
	case <-time.After(Timeout):
		t.Fatal("Upsert blocked behind a stuck consumer")
	}
	WaitConverged(t, s, other, vsType)
	release()
	WaitConverged(t, s, stuck, vsType)
}

func testManyConsumers(t *testing.T, newTransport func(*testing.T, *bus.Store) bus.Source) {
	s := bus.NewStore()
	publish(s, 0, 50, 5, "a")
	src := newTransport(t, s)
	hs := make([]*Recorder, 100)
	for i := range hs {
		hs[i] = NewRecorder()
		Subscribe(t, src, allTypes, hs[i])
	}
	for i := 0; i < 300; i++ {
		name := fmt.Sprintf("ns/vs-%d", i%60)
		if i%7 == 0 {
			s.Delete(vsType, name)
		} else {
			s.Upsert(vsType, VirtualService(name, "", fmt.Sprintf("h%d", i)))
		}
	}
	s.Delete(drType, "ns/dr-1")
	for _, h := range hs {
		WaitConverged(t, s, h, allTypes...)
	}
}

// publish upserts VirtualServices ns/vs-<from..to> and DestinationRules ns/dr-<0..drs>.
func publish(s *bus.Store, from, to, drs int, host string) {
	var vss, drss []*bus.Resource
	for i := from; i < to; i++ {
		vss = append(vss, VirtualService(fmt.Sprintf("ns/vs-%d", i), "", host))
	}
	for i := 0; i < drs; i++ {
		drss = append(drss, &bus.Resource{Name: fmt.Sprintf("ns/dr-%d", i),
			Body: &networking.DestinationRule{Host: fmt.Sprintf("svc-%d.ns.svc.cluster.local", i)}})
	}
	s.Upsert(vsType, vss...)
	s.Upsert(drType, drss...)
}

// VirtualService returns a realistic VirtualService resource: one HTTP route splitting traffic
// between two subsets. An empty version lets the Store derive it.
func VirtualService(name, version, host string) *bus.Resource {
	ns, n := schema.SplitName(name)
	svc := n + "." + ns + ".svc.cluster.local"
	return &bus.Resource{
		Name:    name,
		Version: version,
		Labels:  map[string]string{"app": n},
		Body: &networking.VirtualService{
			Hosts:    []string{svc, host},
			Gateways: []string{"mesh"},
			Http: []*networking.HTTPRoute{{
				Name:  "primary",
				Match: []*networking.HTTPMatchRequest{{Uri: &networking.StringMatch{MatchType: &networking.StringMatch_Prefix{Prefix: "/api"}}}},
				Route: []*networking.HTTPRouteDestination{
					{Destination: &networking.Destination{Host: svc, Subset: "v1", Port: &networking.PortSelector{Number: 8080}}, Weight: 90},
					{Destination: &networking.Destination{Host: svc, Subset: "v2", Port: &networking.PortSelector{Number: 8080}}, Weight: 10},
				},
			}},
		},
	}
}

// Subscribe runs src.Subscribe(h) in a goroutine until the returned cancel (also registered as
// a cleanup) is called; cancel checks that Subscribe returns nil promptly.
func Subscribe(t *testing.T, src bus.Source, types []string, h bus.Handler) (cancel func()) {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- src.Subscribe(ctx, types, h) }()
	var once sync.Once
	cancel = func() {
		once.Do(func() {
			stop()
			if r, ok := h.(*Recorder); ok {
				r.releaseAll()
			}
			select {
			case err := <-errc:
				if err != nil {
					t.Errorf("Subscribe returned %v after cancel, want nil", err)
				}
			case <-time.After(Timeout):
				t.Errorf("Subscribe did not return after cancel")
			}
		})
	}
	t.Cleanup(cancel)
	return cancel
}

// WaitFor polls cond until it holds, failing the test after Timeout.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(Timeout)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

// WaitConverged waits until h holds exactly the Store's state of each type.
func WaitConverged(t testing.TB, s *bus.Store, h *Recorder, types ...string) {
	t.Helper()
	var diff string
	deadline := time.Now().Add(Timeout)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		diff = ""
		for _, typ := range types {
			want := map[string]string{}
			for _, r := range s.List(typ) {
				want[r.Name] = r.Version
			}
			if got := h.State(typ); !maps.Equal(got, want) {
				diff = fmt.Sprintf("%s: consumer has %d resources, store %d", typ, len(got), len(want))
				break
			}
		}
		if diff == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumer did not converge: %s", diff)
		}
		<-tick.C
	}
}

func equalSets(got, want []string) bool {
	if len(got) != len(want) {
		return false
	}
	m := map[string]bool{}
	for _, g := range got {
		m[g] = true
	}
	for _, w := range want {
		if !m[w] {
			return false
		}
	}
	return true
}

// Recorder is a Handler that records what it holds and everything it was offered.
type Recorder struct {
	mu          sync.Mutex
	state       map[string]map[string]string // type -> name -> version
	offers      []offer
	types       map[string]bool
	synced      int
	sizeAtSync  int
	rejectName  string
	rejectVer   string
	rejectMsg   string
	blockNext   bool
	blocked     bool
	release     chan struct{}
	releaseOnce *sync.Once
}

type offer struct {
	name, version string // version "" for a removal
}

var _ bus.Handler = (*Recorder)(nil)

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder {
	return &Recorder{state: map[string]map[string]string{}, types: map[string]bool{}}
}

// Apply records the change, or rejects it when it carries the version set by RejectVersion.
func (r *Recorder) Apply(c bus.Change) error {
	r.mu.Lock()
	if r.blockNext {
		r.blockNext, r.blocked = false, true
		ch := r.release
		r.mu.Unlock()
		<-ch
		r.mu.Lock()
		r.blocked = false
	}
	defer r.mu.Unlock()
	r.types[c.TypeURL] = true
	var reject bool
	for _, res := range c.Updated {
		r.offers = append(r.offers, offer{res.Name, res.Version})
		if res.Name == r.rejectName && res.Version == r.rejectVer {
			reject = true
		}
		if res.Body == nil {
			return errors.New("resource without a body")
		}
	}
	for _, n := range c.Removed {
		r.offers = append(r.offers, offer{n, ""})
	}
	if reject {
		return errors.New(r.rejectMsg)
	}
	st := r.state[c.TypeURL]
	if st == nil {
		st = map[string]string{}
		r.state[c.TypeURL] = st
	}
	for _, res := range c.Updated {
		st[res.Name] = res.Version
	}
	for _, n := range c.Removed {
		delete(st, n)
	}
	return nil
}

// Synced counts calls.
func (r *Recorder) Synced() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.synced++
	if r.synced == 1 {
		for _, st := range r.state {
			r.sizeAtSync += len(st)
		}
	}
}

// SyncedCount returns how many times Synced was called.
func (r *Recorder) SyncedCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.synced
}

// SizeAtSynced returns how many resources the Recorder held when Synced was first called.
func (r *Recorder) SizeAtSynced() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sizeAtSync
}

// SawType reports whether a change of typ was applied.
func (r *Recorder) SawType(typ string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.types[typ]
}

// State returns a copy of what the Recorder holds of typ: name -> version.
func (r *Recorder) State(typ string) map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.state[typ])
}

// Mark returns a position in the offer log, for TouchedSince.
func (r *Recorder) Mark() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.offers)
}

// TouchedSince returns the distinct names offered (updated or removed) since mark.
func (r *Recorder) TouchedSince(mark int) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := map[string]bool{}
	var out []string
	for _, o := range r.offers[mark:] {
		if !seen[o.name] {
			seen[o.name] = true
			out = append(out, o.name)
		}
	}
	return out
}

// Offered counts how many times name@version was offered to Apply.
func (r *Recorder) Offered(name, version string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, o := range r.offers {
		if o.name == name && o.version == version {
			n++
		}
	}
	return n
}

// RejectVersion makes Apply reject any change carrying name@version with msg.
func (r *Recorder) RejectVersion(name, version, msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rejectName, r.rejectVer, r.rejectMsg = name, version, msg
}

// BlockNext makes the next Apply block until the returned release is called.
func (r *Recorder) BlockNext() (release func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.blockNext = true
	r.release = make(chan struct{})
	r.releaseOnce = &sync.Once{}
	ch, once := r.release, r.releaseOnce
	return func() { once.Do(func() { close(ch) }) }
}

// Blocked reports whether Apply is blocked.
func (r *Recorder) Blocked() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.blocked
}

func (r *Recorder) releaseAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.blockNext = false
	if r.release != nil {
		ch := r.release
		r.releaseOnce.Do(func() { close(ch) })
	}
}
