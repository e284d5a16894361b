package mesh

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/protobuf/proto"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	"sailplane.dev/shared/fswatch"
)

// Watcher reloads a mesh file when it changes and hands each new config to a callback.
type Watcher struct {
	path     string
	onChange func(*meshv1alpha1.MeshConfig)
	logger   *slog.Logger
	debounce time.Duration
	onError  func(error)
	fallback *meshv1alpha1.MeshConfig

	mu      sync.Mutex
	current *meshv1alpha1.MeshConfig
	// hadContent: the current config was read from a file that was not empty. Only then is an
	// empty file taken as a write in progress; a file empty from the start holds the defaults.
	hadContent bool
}

// WatcherOption configures a Watcher.
type WatcherOption func(*Watcher)

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) WatcherOption { return func(w *Watcher) { w.logger = l } }

// WithDebounce sets how long the file must stay quiet before it is reloaded (default 100ms):
// editors and ConfigMap updates write in several steps.
func WithDebounce(d time.Duration) WatcherOption { return func(w *Watcher) { w.debounce = d } }

// WithReloadErrors sets a function called after every reload with its error, nil when the
// reload succeeded, so a caller can show the mesh file's current problem.
func WithReloadErrors(f func(error)) WatcherOption { return func(w *Watcher) { w.onError = f } }

// WithFallback sets the config to use when the file cannot be loaded at start (missing,
// unreadable, invalid): typically the last good config saved before a restart. Run then logs
// the error, reports it through WithReloadErrors, starts with fallback and keeps watching,
// instead of failing.
func WithFallback(m *meshv1alpha1.MeshConfig) WatcherOption {
	return func(w *Watcher) { w.fallback = m }
}

// NewWatcher returns a Watcher of the mesh file at path. onChange is called from Run's goroutine
// with the first config, then with every config that differs from the previous one; it must not
// modify it.
func NewWatcher(path string, onChange func(*meshv1alpha1.MeshConfig), opts ...WatcherOption) *Watcher {
	w := &Watcher{path: path, onChange: onChange, logger: slog.Default(), debounce: 100 * time.Millisecond, onError: func(error) {}}
	for _, o := range opts {
		o(w)
	}
	return w
}

// Current returns the last good config, nil before Run loaded one.
func (w *Watcher) Current() *meshv1alpha1.MeshConfig {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.current
}

// Run loads the file (failing if it cannot, unless WithFallback), calls onChange, then watches
// the file until ctx is done. A reload that fails is logged and the last good config stays
// current.
func (w *Watcher) Run(ctx context.Context) error {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("mesh watcher: %w", err)
	}
	defer fw.Close()
	// Watch the folder, not the file: editors replace files by renaming a new one over them and
	// Kubernetes swaps a ConfigMap's "..data" symlink, both of which end a watch on the file.
	if err := fw.Add(filepath.Dir(w.path)); err != nil {
		// fsnotify's error names no path: say which file this is about.
		return fmt.Errorf("mesh config %s: cannot watch its folder: %w", w.path, err)
	}
	first, err := w.load()
	if err != nil && w.fallback == nil {
		return err
	}
	if err != nil {
		w.logger.Error("mesh config cannot be loaded, using the last good one (the fallback)", "file", w.path, "error", err)
		w.onError(err)
		first = w.fallback
	}
	w.set(first)
	w.onChange(first)

	fswatch.Settle(ctx, fw, w.debounce,
		func(ev fsnotify.Event) bool {
			w.logger.Debug("mesh file event", "event", ev.String())
			return true
		},
		w.reload,
		func(err error) { w.logger.Warn("mesh file watch error", "error", err) })
	return nil
}

func (w *Watcher) reload() {
	// Editors that write in place truncate the file first: a file that had content and reads
	// empty is taken as a write in progress, and the write that follows brings another event. A
	// mesh file meant to go back to Istio's defaults says so with "{}".
	data, err := os.ReadFile(w.path)
	empty := err == nil && len(bytes.TrimSpace(data)) == 0
	if empty && w.hadContent {
		w.logger.Warn(`mesh file is empty, keeping the current mesh config (write "{}" for Istio's defaults)`, "file", w.path)
		return
	}
	m, err := Load(w.path)
	w.onError(err)
	if err != nil {
		w.logger.Error("mesh config not reloaded, keeping the previous one", "file", w.path, "error", err)
		return
	}
	w.hadContent = !empty
	if proto.Equal(m, w.Current()) {
		return
	}
	w.logger.Info("mesh config reloaded", "file", w.path)
	w.set(m)
	w.onChange(m)
}

// load reads the file at start.
func (w *Watcher) load() (*meshv1alpha1.MeshConfig, error) {
	data, err := os.ReadFile(w.path)
	if err != nil {
		return nil, fmt.Errorf("mesh config: %w", err)
	}
	m, err := Load(w.path)
	if err != nil {
		return nil, err
	}
	w.hadContent = len(bytes.TrimSpace(data)) > 0
	return m, nil
}

func (w *Watcher) set(m *meshv1alpha1.MeshConfig) {
	w.mu.Lock()
	w.current = m
	w.mu.Unlock()
}
