// Package statefile saves config-ingest's state files: atomically, and off the caller's
// goroutine.
package statefile

import (
	"log/slog"
	"os"
	"path/filepath"
)

// Writer writes a state file off the run loop, since syncing it can take long on a busy
// disk; only the latest state waiting is written. Failing to write is logged once (until it
// works again) and changes nothing else: it only weakens what a restart remembers. A failed
// state is retried with the next change.
type Writer struct {
	log  *slog.Logger
	path string
	next chan []byte // holds the latest state not yet written
	done chan struct{}
}

// NewWriter starts a Writer of path; Close stops it.
func NewWriter(log *slog.Logger, path string) *Writer {
	w := &Writer{log: log, path: path, next: make(chan []byte, 1), done: make(chan struct{})}
	go w.run()
	return w
}

func (w *Writer) run() {
	defer close(w.done)
	failed := false
	for data := range w.next {
		if err := WriteAtomic(w.path, data); err != nil {
			if !failed {
				w.log.Warn("cannot save config state: after a restart, resources that are invalid then lose their last valid version", "file", w.path, "error", err)
			}
			failed = true
			continue
		}
		if failed {
			w.log.Info("config state saved again", "file", w.path)
		}
		failed = false
	}
}

// Write queues data, replacing a state still waiting. Called from one goroutine.
func (w *Writer) Write(data []byte) {
	for {
		select {
		case w.next <- data:
			return
		default:
		}
		select {
		case <-w.next:
		default:
		}
	}
}

// Close writes what is queued and stops.
func (w *Writer) Close() {
	close(w.next)
	<-w.done
}

// WriteAtomic replaces path by data so that a crash leaves either the old or the new content:
// a temporary file beside it, synced, then renamed over it.
func WriteAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // fails once renamed, which is fine
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return err
	}
	// The rename itself is durable once the folder is synced.
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
