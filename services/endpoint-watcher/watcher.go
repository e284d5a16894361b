// Package endpointwatcher publishes the service registry on the bus: schema.Service and
// schema.Endpoints resources, one of each per (namespace, hostname), named
// "<namespace>/<hostname>". Its first source is ServiceEntry + WorkloadEntry from config-ingest.
package endpointwatcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"sailplane.dev/services/endpoint-watcher/internal/serviceentry"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
)

// DefaultClusterID is Istio's default cluster name.
const DefaultClusterID = "Kubernetes"

// ErrMissingDependency is returned by New when a required dependency is nil.
var ErrMissingDependency = errors.New("endpoint-watcher: missing dependency")

// Config configures the Watcher.
type Config struct {
	// ClusterID is stamped on every Service and Endpoint; DefaultClusterID when empty.
	ClusterID string
}

// Deps are the Watcher's collaborators.
type Deps struct {
	// Logger defaults to discarding.
	Logger *slog.Logger
	// Config delivers ServiceEntry and WorkloadEntry (config-ingest's output). Required.
	Config bus.Source
	// Publisher receives Service and Endpoints resources. Required. The Watcher only Upserts and
	// Deletes its own names, so other registries may publish to the same Publisher.
	Publisher bus.Publisher
}

// Watcher translates ServiceEntries and WorkloadEntries into the registry.
type Watcher struct {
	log   *slog.Logger
	src   bus.Source
	pub   bus.Publisher
	index *serviceentry.Index

	mu     sync.Mutex
	synced bool
	ready  chan struct{}
}

var _ bus.Handler = (*handler)(nil)

// New checks deps and returns a Watcher; nothing runs before Run.
func New(cfg Config, deps Deps) (*Watcher, error) {
	if deps.Config == nil {
		return nil, fmt.Errorf("%w: Config source", ErrMissingDependency)
	}
	if deps.Publisher == nil {
		return nil, fmt.Errorf("%w: Publisher", ErrMissingDependency)
	}
	if cfg.ClusterID == "" {
		cfg.ClusterID = DefaultClusterID
	}
	log := deps.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Watcher{
		log:   log,
		src:   deps.Config,
		pub:   deps.Publisher,
		index: serviceentry.NewIndex(cfg.ClusterID),
		ready: make(chan struct{}),
	}, nil
}

// PublishedTypes are the bus types the watcher publishes: the service registry.
func PublishedTypes() []string {
	return []string{schema.Service.TypeURL, schema.Endpoints.TypeURL}
}

// Ready is closed once the first full state of ServiceEntries and WorkloadEntries was published.
func (w *Watcher) Ready() <-chan struct{} { return w.ready }

// Run subscribes to the config source and publishes until ctx is done; it returns nil then, or
// the source's error if it fails for good.
func (w *Watcher) Run(ctx context.Context) error {
	types := []string{schema.ServiceEntry.TypeURL, schema.WorkloadEntry.TypeURL}
	err := w.src.Subscribe(ctx, types, &handler{w})
	if ctx.Err() != nil {
		return nil
	}
	if err == nil {
		err = errors.New("subscription ended")
	}
	return fmt.Errorf("endpoint-watcher: subscribe to ServiceEntry/WorkloadEntry: %w", err)
}

type handler struct{ w *Watcher }

// Apply never rejects a change: a resource that cannot be translated is logged and skipped so
// that the rest of the change, and every other service, still goes through.
func (h *handler) Apply(c bus.Change) error {
	w := h.w
	kind, ok := schema.ByTypeURL(c.TypeURL)
	var set func(*bus.Resource) error
	var del func(string)
	switch {
	case ok && kind.Kind == schema.ServiceEntry.Kind && kind.Group == schema.ServiceEntry.Group:
		set, del = w.index.SetServiceEntry, w.index.DeleteServiceEntry
	case ok && kind.Kind == schema.WorkloadEntry.Kind && kind.Group == schema.WorkloadEntry.Group:
		set, del = w.index.SetWorkloadEntry, w.index.DeleteWorkloadEntry
	default:
		w.log.Warn("ignoring change of unexpected type", "type", c.TypeURL)
		return nil
	}
	for _, r := range c.Updated {
		if err := set(r); err != nil {
			w.logSkip(err, kind.Kind, r.Name)
		}
	}
	for _, name := range c.Removed {
		del(name)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	// Before the first full state, changes only accumulate: publishing half a registry would
	// let consumers see services without their endpoints or vice versa.
	if w.synced {
		w.index.Flush(w.pub)
	}
	return nil
}

func (h *handler) Synced() {
	w := h.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.synced {
		return
	}
	w.index.Flush(w.pub)
	w.synced = true
	close(w.ready)
	w.log.Info("published initial ServiceEntry registry")
}

func (w *Watcher) logSkip(err error, kind, name string) {
	var te *serviceentry.TranslationError
	if errors.As(err, &te) {
		w.log.Error("skipping resource that cannot be translated", "kind", te.Kind,
			"namespace", te.Namespace, "name", te.Name, "field", te.Field, "reason", te.Reason)
		return
	}
	w.log.Error("skipping resource that cannot be translated", "kind", kind, "name", name, "err", err)
}
