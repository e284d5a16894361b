package fswatch

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/goleak"

	"sailplane.dev/shared/testwait"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSettle: a burst of writes gives fewer calls than writes (one, unless the machine stalls
// longer than the quiet period between two writes), the first once the folder is quiet.
func TestSettle(t *testing.T) {
	dir := t.TempDir()
	w, err := fsnotify.NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Add(dir); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Settle(ctx, w, 300*time.Millisecond, nil, func() { calls.Add(1) }, func(err error) { t.Error(err) })
	}()
	defer func() { cancel(); <-done }()

	const writes = 5
	f := filepath.Join(dir, "file")
	for i := range writes {
		if err := os.WriteFile(f, []byte{byte(i)}, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	testwait.Until(t, 10*time.Second, "a call after the burst", func() bool { return calls.Load() >= 1 })
	if n := calls.Load(); n >= writes {
		t.Errorf("%d calls for a burst of %d writes: not settled", n, writes)
	}
}
