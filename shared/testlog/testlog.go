// Package testlog routes a component's slog output to the test's log, so it shows with the test
// that produced it (and only when it fails, or with -v).
package testlog

import (
	"bytes"
	"log/slog"
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
