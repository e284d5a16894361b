// Package endpointwatcher publishes the service registry on the bus: schema.Service and
// schema.Endpoints resources, one of each per (namespace, hostname), named
// "<namespace>/<hostname>". Its sources are ServiceEntry + WorkloadEntry from config-ingest
// (always) and Kubernetes (when Config.Kube is set), all publishing into one Publisher.
package endpointwatcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"k8s.io/client-go/rest"

	"sailplane.dev/services/endpoint-watcher/internal/changetrace"
	"sailplane.dev/services/endpoint-watcher/internal/consul"
	"sailplane.dev/services/endpoint-watcher/internal/kube"
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
	// Kube is the primary Kubernetes cluster; nil runs without Kubernetes discovery.
	Kube *rest.Config
	// Namespace is the control plane's namespace, where remote-cluster kubeconfig Secrets
	// (label istio/multiCluster=true) live; DefaultNamespace when empty.
	Namespace string
	// WatchNamespace, when set, is the one namespace watched (Services, Pods, EndpointSlices);
	// Nodes (locality) and the control-plane namespace's network label, cluster-scoped, are not.
	WatchNamespace string
	// ClusterDomain of Kubernetes Service hostnames; DefaultClusterDomain when empty.
	ClusterDomain string
	// Consul is a Consul catalog to discover; nil runs without Consul.
	Consul *ConsulConfig
}

// ConsulConfig selects a Consul catalog. Its services are published as
// "<Namespace>/<service>.<HostSuffix>".
type ConsulConfig struct {
	// Address of Consul's HTTP API ("127.0.0.1:8500", "https://host:8501"); CONSUL_HTTP_ADDR or
	// 127.0.0.1:8500 when empty.
	Address string
	// Token is the ACL token; CONSUL_HTTP_TOKEN when empty.
	Token string
	// Datacenter to read; the agent's own when empty.
	Datacenter string
	// HostSuffix of hostnames, "service.consul" when empty.
	HostSuffix string
	// Namespace of the published resources, "consul" when empty.
	Namespace string
}

// Defaults of Config.
const (
	DefaultNamespace     = kube.DefaultNamespace
	DefaultClusterDomain = kube.DefaultClusterLocal
)

// registrySource is a registry that runs beside the ServiceEntry source and publishes into the
// Watcher's Publisher: Kubernetes, and any other (Consul) added in New with addSource.
type registrySource interface {
	Run(ctx context.Context) error
	// Ready is closed once the source published its first full state.
	Ready() <-chan struct{}
}

type namedSource struct {
	name string
	src  registrySource
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
	// MeterProvider receives the registries' metrics (pilot_k8s_reg_events, watch errors); the
	// global provider when nil.
	MeterProvider metric.MeterProvider
}

// Watcher translates ServiceEntries and WorkloadEntries into the registry.
type Watcher struct {
	log   *slog.Logger
	src   bus.Source
	pub   bus.Publisher
	index *serviceentry.Index
	// Registries beside ServiceEntry; kube is also among them when set.
	sources []namedSource
	kube    *kube.Controller

	mu      sync.Mutex
	synced  bool
	seReady chan struct{} // the ServiceEntry registry's first full state is out
	ready   chan struct{} // every registry's is
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
	w := &Watcher{
		log:     log,
		src:     deps.Config,
		pub:     deps.Publisher,
		index:   serviceentry.NewIndex(cfg.ClusterID),
		seReady: make(chan struct{}),
		ready:   make(chan struct{}),
	}
	if cfg.Kube != nil {
		k, err := kube.New(kube.Config{
			ClusterID: cfg.ClusterID, ClusterDomain: cfg.ClusterDomain, Namespace: cfg.Namespace,
			WatchNamespace: cfg.WatchNamespace,
		}, kube.Deps{
			Logger: log.With("registry", kube.Registry), Kube: cfg.Kube, Publisher: deps.Publisher,
			// Cross-registry selection, as istiod does: Services select WorkloadEntries and
			// ServiceEntries select Pods.
			WorkloadEntries: w.index, Workloads: seWorkloads{w}, MeterProvider: deps.MeterProvider,
		})
		if err != nil {
			return nil, err
		}
		w.kube = k
		w.addSource(kube.Registry, k)
	}
	if cc := cfg.Consul; cc != nil {
		c, err := consul.New(consul.Config{
			Address: cc.Address, Token: cc.Token, Datacenter: cc.Datacenter,
			HostSuffix: cc.HostSuffix, Namespace: cc.Namespace, ClusterID: cfg.ClusterID,
			MeterProvider: deps.MeterProvider,
		}, deps.Publisher, log.With("registry", consul.Registry))
		if err != nil {
			return nil, err
		}
		w.addSource(consul.Registry, c)
	}
	return w, nil
}

// addSource plugs a registry in: it runs with the Watcher and gates Ready. Another registry
// (Consul) is added here with a few lines: build it with deps.Publisher, then addSource.
func (w *Watcher) addSource(name string, src registrySource) {
	w.sources = append(w.sources, namedSource{name, src})
}

// seWorkloads hands Pods to the ServiceEntry index and publishes what their selection changed.
type seWorkloads struct{ w *Watcher }

var _ kube.WorkloadSink = seWorkloads{}

func (s seWorkloads) SetWorkload(ctx context.Context, wl serviceentry.Workload) {
	s.w.index.SetWorkload(wl)
	s.w.flushServiceEntries(ctx)
}

func (s seWorkloads) DeleteWorkload(ctx context.Context, clusterID, namespace, name string) {
	s.w.index.DeleteWorkload(clusterID, namespace, name)
	s.w.flushServiceEntries(ctx)
}

// flushServiceEntries publishes the ServiceEntry index's pending changes, once its first full
// state is out (before, changes only accumulate), in the trace of ctx: of the Pod event or the
// delivered change that caused them (changetrace.Publisher).
func (w *Watcher) flushServiceEntries(ctx context.Context) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.synced {
		w.index.Flush(changetrace.Publisher(ctx, w.pub))
	}
}

// PublishedTypes are the bus types the watcher publishes: the service registry.
func PublishedTypes() []string {
	return []string{schema.Service.TypeURL, schema.Endpoints.TypeURL}
}

// Ready is closed once every registry published its first full state: ServiceEntries and
// WorkloadEntries, and Kubernetes when configured.
func (w *Watcher) Ready() <-chan struct{} { return w.ready }

// Run runs every registry until ctx is done and returns nil then, or the first error of a
// registry that fails for good (the others are stopped).
func (w *Watcher) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(w.sources)+1)
	var wg sync.WaitGroup
	wg.Go(func() { errs <- w.runServiceEntries(ctx) })
	for _, s := range w.sources {
		wg.Go(func() {
			err := s.src.Run(ctx)
			if err == nil && ctx.Err() == nil {
				err = errors.New("stopped")
			}
			if err != nil && ctx.Err() == nil {
				err = fmt.Errorf("endpoint-watcher: %s registry: %w", s.name, err)
			} else {
				err = nil
			}
			errs <- err
		})
	}
	wg.Go(func() {
		for _, ch := range w.readyChans() {
			select {
			case <-ch:
			case <-ctx.Done():
				return
			}
		}
		close(w.ready)
		w.log.Info("every registry published its first full state", "registries", len(w.sources)+1)
	})
	var first error
	for range len(w.sources) + 1 {
		if err := <-errs; err != nil && first == nil {
			first = err
			cancel()
		}
	}
	wg.Wait()
	return first
}

func (w *Watcher) readyChans() []<-chan struct{} {
	out := []<-chan struct{}{w.seReady}
	for _, s := range w.sources {
		out = append(out, s.src.Ready())
	}
	return out
}

func (w *Watcher) runServiceEntries(ctx context.Context) error {
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
	isWE := false
	switch {
	case ok && kind.Kind == schema.ServiceEntry.Kind && kind.Group == schema.ServiceEntry.Group:
		set, del = w.index.SetServiceEntry, w.index.DeleteServiceEntry
	case ok && kind.Kind == schema.WorkloadEntry.Kind && kind.Group == schema.WorkloadEntry.Group:
		set, del = w.index.SetWorkloadEntry, w.index.DeleteWorkloadEntry
		isWE = true
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
	// Before the first full state, changes only accumulate: publishing half a registry would
	// let consumers see services without their endpoints or vice versa. What the change
	// brings about continues its trace.
	ctx := trace.ContextWithSpanContext(context.Background(), c.Trace)
	w.flushServiceEntries(ctx)
	if isWE && w.kube != nil {
		// Kubernetes Services select WorkloadEntries too.
		namespaces := map[string]bool{}
		for _, r := range c.Updated {
			ns, _ := schema.SplitName(r.Name)
			namespaces[ns] = true
		}
		for _, name := range c.Removed {
			ns, _ := schema.SplitName(name)
			namespaces[ns] = true
		}
		w.kube.WorkloadEntriesChanged(ctx, slices.Collect(maps.Keys(namespaces))...)
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
	close(w.seReady)
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
