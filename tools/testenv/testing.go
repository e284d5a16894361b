package testenv

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// KubeForTest starts a Kube for one test: it fails t if the start fails,
// logs the processes' output if t failed, and stops everything at cleanup.
// Without WithLogger, progress goes to t.Log. The first use on a machine
// builds the binaries (minutes), so the start is bounded by 20 minutes.
func KubeForTest(t testing.TB, opts ...Option) *Kube {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	k, err := StartKube(ctx, append([]Option{WithLogger(tLogger(t))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Stop)
	// Registered after Stop, so it runs first, while the log files exist.
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(k.Logs())
		}
	})
	return k
}

// ConsulForTest is KubeForTest for a dev-mode consul agent.
func ConsulForTest(t testing.TB, opts ...Option) *Consul {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c, err := StartConsul(ctx, append([]Option{WithLogger(tLogger(t))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(c.Logs())
		}
	})
	return c
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func tLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, nil))
}
