package grpcserver

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestOverloadedCarriesRetryDelay(t *testing.T) {
	err := Overloaded("busy", 1500*time.Millisecond)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("code %v, want Unavailable", status.Code(err))
	}
	if d, ok := RetryAfter(err); !ok || d != 1500*time.Millisecond {
		t.Fatalf("RetryAfter = %v, %v; want 1.5s", d, ok)
	}
	// Wrapped, as clients report it, the delay is still found.
	if d, ok := RetryAfter(errors.Join(errors.New("opening stream"), err)); !ok || d != 1500*time.Millisecond {
		t.Fatalf("RetryAfter of a wrapped error = %v, %v", d, ok)
	}
	for _, other := range []error{status.Error(codes.Unavailable, "no delay"), status.Error(codes.Internal, "x"), errors.New("plain")} {
		if _, ok := RetryAfter(other); ok {
			t.Errorf("RetryAfter(%v) found a delay", other)
		}
	}
}

func TestBackoff(t *testing.T) {
	b := Backoff{Initial: 100 * time.Millisecond, Max: 400 * time.Millisecond}
	plain := errors.New("connection refused")
	for i, limit := range []time.Duration{100, 200, 400, 400} {
		limit *= time.Millisecond
		if d := b.Next(plain); d < limit/2 || d > limit {
			t.Errorf("attempt %d: %v, want within [%v, %v]", i, d, limit/2, limit)
		}
	}
	// The server's delay replaces the backoff, with a little jitter.
	if d := b.Next(Overloaded("busy", 2*time.Second)); d < 2*time.Second || d > 2200*time.Millisecond {
		t.Errorf("after a refusal with a delay: %v, want 2s to 2.2s", d)
	}
	b.Reset()
	if d := b.Next(plain); d > 100*time.Millisecond {
		t.Errorf("after Reset: %v, want at most 100ms", d)
	}
}
