package bus

import (
	"context"
	"fmt"
	"maps"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"

	"sailplane.dev/shared/schema"
)

// The size the Store checks without encoding is the size of the encoding.
func TestWireSize(t *testing.T) {
	for _, r := range []*Resource{
		{Name: "ns/empty"},
		{Name: "ns/vs", Version: "v1", Body: &networking.VirtualService{Hosts: []string{"a", "b"}}},
		{Name: "ns/empty-body", Version: "v1", Body: &networking.VirtualService{}}, // found by FuzzDecodeMCP
		{Name: "ns/empty-map-entries", Version: "v", CreateTime: time.Unix(1700000000, 0),
			Labels: map[string]string{"": "", "k": ""}, Annotations: map[string]string{"": "v"}},
		{Name: "ns/meta", Version: "123abc", CreateTime: time.Unix(1700000000, 5),
			Labels: map[string]string{"app": "x"}, Annotations: map[string]string{"note": string(make([]byte, 300))},
			Body: &networking.VirtualService{Hosts: []string{string(make([]byte, 20000))}}},
	} {
		m, err := toMCP(r)
		if err != nil {
			t.Fatal(err)
		}
		want := proto.Size(m)
		if got := wireSize(r, r.Version, -1); got != want {
			t.Errorf("%s: wireSize = %d, encoding is %d bytes", r.Name, got, want)
		}
	}
}

func TestRetryScheduleCappedAndJittered(t *testing.T) {
	r := retry{initial: DefaultBackoffInitial, max: DefaultBackoffMax}
	r.reset()
	waits := map[time.Duration]bool{}
	for i := range 50 {
		w := r.wait()
		if w > DefaultBackoffMax {
			t.Fatalf("attempt %d waits %s, over the %s cap", i, w, DefaultBackoffMax)
		}
		if i >= 10 && w < DefaultBackoffMax/2 {
			t.Fatalf("attempt %d waits %s: capped waits are drawn from [max/2, max]", i, w)
		}
		waits[w] = true
	}
	if len(waits) < 10 {
		t.Errorf("%d distinct waits in 50 attempts: not jittered", len(waits))
	}
	r.reset()
	if w := r.wait(); w > DefaultBackoffInitial {
		t.Errorf("after a reset the wait is %s, want at most %s", w, DefaultBackoffInitial)
	}
}

// versionRecorder is a Handler that keeps name -> version and counts the updates it was given.
type versionRecorder struct {
	mu      sync.Mutex
	have    map[string]string
	updates int
	synced  chan struct{}
}

func (h *versionRecorder) Apply(c Change) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range c.Updated {
		h.have[r.Name] = r.Version
	}
	for _, n := range c.Removed {
		delete(h.have, n)
	}
	h.updates += len(c.Updated)
	return nil
}

func (h *versionRecorder) Synced() { close(h.synced) }

func (h *versionRecorder) state() (map[string]string, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.have), h.updates
}

// A delta consumer holding more versions than a request may carry resubscribes without them,
// receives the whole state, and still learns what was deleted while it was away.
func TestResubscribeWithoutInitialVersions(t *testing.T) {
	typ := schema.VirtualService.TypeURL
	vs := func(i int, host string) *Resource {
		return &Resource{Name: fmt.Sprintf("ns/vs-%02d", i), Body: &networking.VirtualService{Hosts: []string{host}}}
	}
	s := NewStore()
	for i := range 50 {
		if err := s.Upsert(typ, vs(i, "a")); err != nil {
			t.Fatal(err)
		}
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	serve := func(lis net.Listener) *grpc.Server {
		gs := grpc.NewServer()
		NewServer(s).Register(gs)
		go func() { _ = gs.Serve(lis) }()
		return gs
	}
	gs := serve(lis)

	h := &versionRecorder{have: map[string]string{}, synced: make(chan struct{})}
	src := Dial(addr, WithBackoff(5*time.Millisecond, 50*time.Millisecond),
		func(c *dialConfig) { c.maxInitialVersions = 100 }) // 50 versions are about 1.5 KB
	defer subscribeSynced(t, src, typ, h)()

	// While the consumer is away: 10 deleted, 5 changed, 3 added.
	gs.Stop()
	for i := range 10 {
		s.Delete(typ, fmt.Sprintf("ns/vs-%02d", i))
	}
	for i := 10; i < 15; i++ {
		if err := s.Upsert(typ, vs(i, "b")); err != nil {
			t.Fatal(err)
		}
	}
	for i := 50; i < 53; i++ {
		if err := s.Upsert(typ, vs(i, "a")); err != nil {
			t.Fatal(err)
		}
	}
	lis, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listening again on %s: %v", addr, err)
	}
	gs = serve(lis)
	defer gs.Stop()

	want := map[string]string{}
	for _, r := range s.List(typ) {
		want[r.Name] = r.Version
	}
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		got, updates := h.state()
		if maps.Equal(got, want) {
			// Versions the consumer held were not handed to it again.
			if updates != 50+5+3 {
				t.Errorf("handler got %d updates, want 50 then 8", updates)
			}
			return
		}
		select {
		case <-deadline:
			t.Fatalf("consumer holds %d resources, store %d", len(got), len(want))
		case <-tick.C:
		}
	}
}

// subscribeSynced subscribes h to typ from src and waits until it synced; the returned func
// ends the subscription and checks it ended cleanly.
func subscribeSynced(t *testing.T, src Source, typ string, h *versionRecorder) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Subscribe(ctx, []string{typ}, h) }()
	stop = func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Subscribe: %v", err)
		}
	}
	select {
	case <-h.synced:
	case <-time.After(10 * time.Second):
		stop()
		t.Fatal("not synced")
	}
	return stop
}
