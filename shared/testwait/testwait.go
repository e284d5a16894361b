// Package testwait is how tests wait: on a condition, polled until it holds or a deadline passes,
// never for a fixed time. Imported by tests only.
package testwait

import (
	"errors"
	"testing"
	"time"
)

// Tick is how often a condition is polled: short enough to add little to a test, long enough not
// to compete with the code under test for the CPU.
const Tick = 5 * time.Millisecond

// For polls cond until it returns nil; if it still fails after timeout, t fails with what and
// cond's last error.
func For(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	if err := poll(timeout, cond); err != nil {
		t.Fatalf("%s: not within %v: %v", what, timeout, err)
	}
}

// Until polls cond until it returns true; if it is still false after timeout, t fails with what.
func Until(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if err := poll(timeout, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	}); err != nil {
		t.Fatalf("%s: not within %v", what, timeout)
	}
}

var errNotYet = errors.New("not yet")

// poll returns nil as soon as cond does, else cond's last error once timeout has passed.
func poll(timeout time.Duration, cond func() error) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(Tick)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return nil
		}
		select {
		case <-deadline.C:
			return err
		case <-tick.C:
		}
	}
}
