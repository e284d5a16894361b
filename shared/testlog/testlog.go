// Package testlog routes a component's slog output to the test's log, so it shows with the test
// that produced it (and only when it fails, or with -v).
package testlog

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// New returns a logger writing to t.Log at level and above.
func New(t testing.TB, level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(writer{t}, &slog.HandlerOptions{Level: level}))
}

type writer struct{ t testing.TB }

func (w writer) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

// Messages keeps the messages a logger from NewRecording wrote, for tests that check what was
// logged.
type Messages struct {
	mu   sync.Mutex
	msgs []string
}

// Count returns how many messages contain substr.
func (m *Messages) Count(substr string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, msg := range m.msgs {
		if strings.Contains(msg, substr) {
			n++
		}
	}
	return n
}

// NewRecording is New, keeping the messages too.
func NewRecording(t testing.TB, level slog.Level) (*slog.Logger, *Messages) {
	m := &Messages{}
	return slog.New(recording{Handler: New(t, level).Handler(), m: m}), m
}

type recording struct {
	slog.Handler
	m *Messages
}

func (r recording) Handle(ctx context.Context, rec slog.Record) error {
	r.m.mu.Lock()
	r.m.msgs = append(r.m.msgs, rec.Message)
	r.m.mu.Unlock()
	return r.Handler.Handle(ctx, rec)
}

func (r recording) WithAttrs(as []slog.Attr) slog.Handler {
	return recording{Handler: r.Handler.WithAttrs(as), m: r.m}
}

func (r recording) WithGroup(name string) slog.Handler {
	return recording{Handler: r.Handler.WithGroup(name), m: r.m}
}
