package testenv

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"sailplane.dev/shared/testlog"
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

func tLogger(t testing.TB) *slog.Logger {
	return testlog.New(t, slog.LevelInfo)
}

// PilotAgentForTest returns the path of Istio's pilot-agent, building it on the machine's
// first use (minutes; `make testenv` does it up front), bounded like KubeForTest.
func PilotAgentForTest(t testing.TB) string {
	t.Helper()
	return ensureForTest(t, EnsurePilotAgent)
}

// IstioctlForTest returns the path of Istio's istioctl, building it on the machine's first use
// (minutes; `make testenv` does it up front), bounded like KubeForTest.
func IstioctlForTest(t testing.TB) string {
	t.Helper()
	return ensureForTest(t, EnsureIstioctl)
}

// KubectlForTest returns the path of kubectl, building it on the machine's first use (23 s
// after kube-apiserver's build, minutes alone; `make testenv` does it up front).
func KubectlForTest(t testing.TB) string {
	t.Helper()
	return ensureForTest(t, EnsureKubectl)
}

// ensureForTest runs an Ensure function for a test, bounded like KubeForTest.
func ensureForTest(t testing.TB, ensure func(context.Context, *slog.Logger) (string, error)) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	bin, err := ensure(ctx, tLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	return bin
}
