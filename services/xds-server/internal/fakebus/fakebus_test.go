package fakebus

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"sailplane.dev/shared/bus"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type recorder struct {
	events chan string
}

func (r recorder) Apply(c bus.Change) error {
	for _, u := range c.Updated {
		r.events <- c.TypeURL + " +" + u.Name
	}
	for _, n := range c.Removed {
		r.events <- c.TypeURL + " -" + n
	}
	return nil
}

func (r recorder) Synced() { r.events <- "synced" }

func TestSubscribe(t *testing.T) {
	src := New(bus.Change{TypeURL: "t1", Updated: []*bus.Resource{{Name: "a"}}})
	rec := recorder{events: make(chan string, 16)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Subscribe(ctx, []string{"t1", "t2"}, rec) }()
	next := func(want string) {
		t.Helper()
		select {
		case got := <-rec.events:
			if got != want {
				t.Fatalf("got %q, want %q", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no event, want %q", want)
		}
	}
	next("t1 +a")
	next("synced")
	src.Push(bus.Change{TypeURL: "other", Updated: []*bus.Resource{{Name: "x"}}})
	src.Push(bus.Change{TypeURL: "t2", Updated: []*bus.Resource{{Name: "b"}}})
	src.Push(bus.Change{TypeURL: "t1", Removed: []string{"a"}})
	next("t2 +b")
	next("t1 -a")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
