// Package fswatch turns the bursts of file-system events a save makes (editors write in several
// steps, Kubernetes swaps a ConfigMap volume's symlink) into one call once the folder is quiet.
package fswatch

import (
	"context"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Settle runs until ctx ends or w closes: each event that keep accepts (nil: all) restarts a
// timer of quiet, and onQuiet runs when it fires. Watch errors go to onError: events may have
// been lost, so the next quiet period comes anyway.
func Settle(ctx context.Context, w *fsnotify.Watcher, quiet time.Duration, keep func(fsnotify.Event) bool, onQuiet func(), onError func(error)) {
	timer := time.NewTimer(quiet)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			if keep == nil || keep(ev) {
				timer.Reset(quiet)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			onError(err)
			timer.Reset(quiet)
		case <-timer.C:
			onQuiet()
		}
	}
}
