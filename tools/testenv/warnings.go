package testenv

import "sync"

// WarningRecorder keeps the API server's Warning headers (deprecations, unknown fields, Pod
// Security's "warn" level, admission webhooks' warnings). Set it as a rest.Config's
// WarningHandler.
type WarningRecorder struct {
	mu   sync.Mutex
	seen []string
}

// HandleWarningHeader implements client-go's rest.WarningHandler.
func (w *WarningRecorder) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen = append(w.seen, text)
}

// Take returns the warnings recorded since the last Take and forgets them.
func (w *WarningRecorder) Take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	seen := w.seen
	w.seen = nil
	return seen
}
