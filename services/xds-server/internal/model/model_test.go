package model

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"
	networking "istio.io/api/networking/v1alpha3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestApply(t *testing.T) {
	s := NewStore()
	h := s.Handler(nil)
	svc := &bus.Resource{Name: "demo/a.demo.svc.cluster.local", Body: &discoveryv1.Service{Hostname: "a.demo.svc.cluster.local", Namespace: "demo"}}
	if err := h.Apply(bus.Change{TypeURL: schema.Service.TypeURL, Updated: []*bus.Resource{svc}}); err != nil {
		t.Fatal(err)
	}
	<-s.Changed()
	if _, ok := s.Snapshot().Services["a.demo.svc.cluster.local"]; !ok {
		t.Fatal("service missing from snapshot")
	}

	for _, tc := range []struct {
		name   string
		change bus.Change
	}{
		{"unknown type", bus.Change{TypeURL: "example.com/v1/Nope"}},
		{"wrong body", bus.Change{TypeURL: schema.Service.TypeURL, Updated: []*bus.Resource{
			{Name: "demo/b", Body: &discoveryv1.Endpoints{}}, svc}}},
		{"no body", bus.Change{TypeURL: schema.VirtualService.TypeURL, Updated: []*bus.Resource{{Name: "demo/x"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := h.Apply(tc.change); !errors.Is(err, ErrRejected) {
				t.Fatalf("Apply: %v, want ErrRejected", err)
			}
		})
	}

	// Legacy type URLs land on the same kind; removal deletes.
	vs := &bus.Resource{Name: "demo/vs", Body: &networking.VirtualService{Hosts: []string{"a"}}}
	if err := h.Apply(bus.Change{TypeURL: "networking.istio.io/v1alpha3/VirtualService", Updated: []*bus.Resource{vs}}); err != nil {
		t.Fatal(err)
	}
	if got := len(s.Snapshot().VirtualServices); got != 1 {
		t.Fatalf("%d virtual services, want 1", got)
	}
	if err := h.Apply(bus.Change{TypeURL: schema.Service.TypeURL, Removed: []string{svc.Name}}); err != nil {
		t.Fatal(err)
	}
	if got := len(s.Snapshot().Services); got != 0 {
		t.Fatalf("%d services after removal, want 0", got)
	}
}

func TestSnapshotPrecedence(t *testing.T) {
	s := NewStore()
	h := s.Handler(nil)
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	mustApply := func(c bus.Change) {
		t.Helper()
		if err := h.Apply(c); err != nil {
			t.Fatal(err)
		}
	}
	mustApply(bus.Change{TypeURL: schema.VirtualService.TypeURL, Updated: []*bus.Resource{
		{Name: "b/young", CreateTime: t0.Add(time.Hour), Body: &networking.VirtualService{}},
		{Name: "z/old", CreateTime: t0, Body: &networking.VirtualService{}},
		{Name: "a/young", CreateTime: t0.Add(time.Hour), Body: &networking.VirtualService{}},
	}})
	// One hostname from two registries: the first bus name wins, with its own endpoints.
	mustApply(bus.Change{TypeURL: schema.Service.TypeURL, Updated: []*bus.Resource{
		{Name: "b/x.com", Body: &discoveryv1.Service{Hostname: "x.com", Namespace: "b"}},
		{Name: "a/x.com", Body: &discoveryv1.Service{Hostname: "x.com", Namespace: "a"}},
	}})
	mustApply(bus.Change{TypeURL: schema.Endpoints.TypeURL, Updated: []*bus.Resource{
		{Name: "b/x.com", Body: &discoveryv1.Endpoints{Hostname: "x.com", Namespace: "b", Endpoints: []*discoveryv1.Endpoint{{Address: "2.2.2.2"}}}},
		{Name: "a/x.com", Body: &discoveryv1.Endpoints{Hostname: "x.com", Namespace: "a", Endpoints: []*discoveryv1.Endpoint{{Address: "1.1.1.1"}}}},
	}})
	snap := s.Snapshot()
	var got []string
	for _, vs := range snap.VirtualServices {
		got = append(got, vs.Namespace+"/"+vs.Name)
	}
	want := []string{"z/old", "a/young", "b/young"}
	if len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("order = %v, want %v", got, want)
	}
	svc := snap.Services["x.com"]
	if svc.Spec.GetNamespace() != "a" || len(svc.Endpoints) != 1 || svc.Endpoints[0].GetAddress() != "1.1.1.1" {
		t.Fatalf("x.com = %v %v", svc.Spec, svc.Endpoints)
	}
}

func TestResolveHost(t *testing.T) {
	for _, tc := range []struct{ host, ns, want string }{
		{"echo", "demo", "echo.demo.svc.cluster.local"},
		{"echo.other.svc.cluster.local", "demo", "echo.other.svc.cluster.local"},
		{"*", "demo", "*"},
		{"*.example.com", "demo", "*.example.com"},
	} {
		if got := ResolveHost(tc.host, tc.ns); got != tc.want {
			t.Errorf("ResolveHost(%q, %q) = %q, want %q", tc.host, tc.ns, got, tc.want)
		}
	}
	for _, tc := range []struct {
		config, host string
		want         bool
	}{
		{"a.b", "a.b", true},
		{"*.b", "a.b", true},
		{"*.b", "a.c", false},
		{"*", "a.c", true},
		{"a.b", "a.c", false},
	} {
		if got := HostMatches(tc.config, tc.host); got != tc.want {
			t.Errorf("HostMatches(%q, %q) = %v", tc.config, tc.host, got)
		}
	}
}

func TestSynced(t *testing.T) {
	calls := 0
	h := NewStore().Handler(func() { calls++ })
	h.Synced()
	h.Synced()
	if calls != 1 {
		t.Fatalf("onSynced called %d times, want 1", calls)
	}
}

func TestDebounce(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	in := make(chan struct{}, 1)
	fired := make(chan struct{}, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		Debounce(ctx, in, time.Millisecond, 10*time.Millisecond, func() { fired <- struct{}{} })
	}()
	for range 2 {
		for range 5 {
			in <- struct{}{}
		}
		select {
		case <-fired:
		case <-time.After(10 * time.Second):
			t.Fatal("debounced function not called")
		}
	}
	cancel()
	<-done
}

// A steady trickle of changes, each arriving before the quiet period ends, is still rebuilt
// once maxDelay has passed.
func TestDebounceMaxDelay(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	in := make(chan struct{}, 1)
	fired := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		Debounce(ctx, in, time.Hour, 20*time.Millisecond, func() { close(fired) })
	}()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	for waiting := true; waiting; {
		select {
		case <-fired:
			waiting = false
		case <-deadline:
			t.Fatal("a steady trickle starved the rebuild")
		case <-tick.C:
			select {
			case in <- struct{}{}:
			default:
			}
		}
	}
	cancel()
	<-done
}
