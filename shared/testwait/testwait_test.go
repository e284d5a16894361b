package testwait

import (
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPoll(t *testing.T) {
	calls := 0
	if err := poll(time.Minute, func() error {
		calls++
		if calls < 3 {
			return errors.New("not yet")
		}
		return nil
	}); err != nil || calls != 3 {
		t.Errorf("poll = %v after %d calls, want nil after 3", err, calls)
	}

	last := errors.New("last")
	if err := poll(20*time.Millisecond, func() error { return last }); err != last {
		t.Errorf("poll of a condition that never holds = %v, want its last error", err)
	}
}
