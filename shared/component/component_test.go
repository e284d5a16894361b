package component

import (
	"context"
	"errors"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// blockUntilDone is a well-behaved component: it runs until its context ends.
func blockUntilDone(stopped chan<- struct{}) Func {
	return func(ctx context.Context) error {
		<-ctx.Done()
		close(stopped)
		return nil
	}
}

func TestManager(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name    string
		failing Func
		wantErr string
		wantIs  error
	}{
		{"error stops the others", func(context.Context) error { return boom }, "failing: boom", boom},
		{"panic becomes an error", func(context.Context) error { panic("kaput") }, "failing: panic: kaput", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stopped := make(chan struct{})
			var m Manager
			m.Add("steady", blockUntilDone(stopped))
			m.Add("failing", tt.failing)
			err := m.Run(context.Background())
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Run() = %v, want an error containing %q", err, tt.wantErr)
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("Run() = %v, want it to wrap %v", err, tt.wantIs)
			}
			select {
			case <-stopped:
			default:
				t.Error("the steady component was not stopped")
			}
		})
	}
}

func TestManagerStopsCleanlyOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var m Manager
	stopped := make(chan struct{})
	m.Add("steady", blockUntilDone(stopped))
	m.Add("finishes early", Func(func(context.Context) error { return nil }))
	m.Add("cancels", Func(func(context.Context) error { cancel(); return nil }))
	if err := m.Run(ctx); err != nil {
		t.Fatalf("Run() = %v after cancel, want nil", err)
	}
	<-stopped
}
