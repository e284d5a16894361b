// Package kubesource reads config from a Kubernetes API server: every kind of schema.ConfigKinds
// (Istio's, and the Gateway API's when their CRDs are installed), in the namespaces the mesh
// config's discoverySelectors select, validated and published on the bus. The mesh config comes
// from the "istio" ConfigMap (or a file). One replica, elected with a Lease, writes validation
// errors back to the Istio resources' status.
package kubesource

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	istioinformers "istio.io/client-go/pkg/informers/externalversions"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"sailplane.dev/services/config-ingest/internal/statefile"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/config"
	"sailplane.dev/shared/kube"
	"sailplane.dev/shared/mesh"
	"sailplane.dev/shared/revision"
	"sailplane.dev/shared/schema"
)

// Defaults.
const (
	DefaultNamespace = "istio-system"
	// MeshConfigMap is the ConfigMap holding the mesh config under the key MeshKey, as in Istio.
	MeshConfigMap = "istio"
	MeshKey       = "mesh"
	// MeshNetworksKey holds Istio's meshNetworks in the same ConfigMap.
	MeshNetworksKey = "meshNetworks"
	// LeaseName is the Lease electing the replica that writes status.
	LeaseName = "sailplane-config-ingest-status"
)

// ErrKubernetes marks a problem talking to the API server: unreachable (cleared by the next
// successful request), or a resource that cannot be listed, e.g. for RBAC (cleared once it can).
var ErrKubernetes = errors.New("kubernetes")

// MeshConfigMapName is the mesh ConfigMap of a revision, as istiod names it: istio for the
// default revision, istio-<revision> for another.
func MeshConfigMapName(rev string) string {
	if rev == "" || rev == revision.Default {
		return MeshConfigMap
	}
	return MeshConfigMap + "-" + rev
}

// ErrMeshConfigMap marks a mesh config ConfigMap that could not be used; the last good mesh
// config stays in effect.
var ErrMeshConfigMap = errors.New("mesh config ConfigMap")

// Config configures a Source.
type Config struct {
	// Namespace is the control plane's namespace: the mesh ConfigMap and the Lease live there.
	// DefaultNamespace when empty. Its config is read whatever the discoverySelectors say.
	Namespace string
	// Identity names this replica in the Lease; the host name when empty.
	Identity string
	// MeshConfigMap names the mesh config's ConfigMap; MeshConfigMap when empty
	// (MeshConfigMapName gives a revision's).
	MeshConfigMap string
	// MeshFile, when set, is the mesh config's source instead of the ConfigMap.
	MeshFile string
	// Debounce is the mesh file's debounce (see mesh.WithDebounce).
	Debounce time.Duration
	// Leader election timings; client-go's usual 15s/10s/2s when zero.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// StateDir, when set, is the folder where the last valid version of every resource that is
	// invalid in the API server is saved (StateFile), so that a restart still serves it.
	StateDir string
	// MeterProvider receives pilot_k8s_cfg_events and sailplane_kube_watch_errors_total; the
	// global provider when nil.
	MeterProvider metric.MeterProvider
	// OnElected, when set, is called each time this replica becomes the leader, for the other
	// writers the Lease elects (the gateway deployment controller) to catch up.
	OnElected func()
	// Revision decides which config is this control plane's (istio.io/rev, tags included):
	// config labelled for another revision is left out, as if absent, as istiod's config
	// client does; unlabelled config is every revision's. nil: the default revision. Call
	// RevisionChanged when its answers may have changed.
	Revision revision.Owner
	// WatchNamespace, when set, is the one namespace read (Roles there suffice): its Istio and
	// Gateway API config. Namespaces, CRDs and GatewayClasses, cluster-scoped, are not watched: the namespace
	// is published without its labels, and Gateway API CRDs installed later are read after a
	// restart.
	WatchNamespace string
	// OnSelection, when set, is called when the namespaces Selected admits may have changed
	// (discoverySelectors, or a namespace's labels under them). It must not block.
	OnSelection func()
}

// Source is the Kubernetes config source.
type Source struct {
	cfg     Config
	log     *slog.Logger
	pub     bus.Publisher
	clients kube.Clients
	dynamic dynamic.Interface // the Gateway API kinds
	crds    metadata.Interface
	ready   chan struct{}
	leader  atomic.Bool
	// queue holds the resources whose status the leader must check.
	queue workqueue.TypedRateLimitingInterface[statusKey]
	// probeNow wakes the loop that clears watch problems.
	probeNow chan struct{}
	// outages restarts the informers as soon as the API server is back from an outage.
	outages *kube.Outages
	// retired tracks the stopping of informers replaced by resync.
	retired sync.WaitGroup
	// events counts the informers' events, as istiod's pilot_k8s_cfg_events.
	events kube.EventCounter
	// resyncMu serializes resyncs: after an outage and after a Gateway API CRD change.
	resyncMu sync.Mutex
	// crdChanged is signalled by the CRD watch when a Gateway API CRD changes.
	crdChanged chan struct{}

	mu        sync.Mutex
	synced    bool // the initial state was published: from now on, publish every change
	mesh      *meshv1alpha1.MeshConfig
	selectors []labels.Selector // nil: every namespace
	kinds     []*kindState
	caches    *caches // the informers in use
	// gwServed holds the plurals of the Gateway API kinds the API server serves as v1, those
	// whose CRD is installed: the others are not watched (and publish nothing).
	gwServed map[string]bool
	meshProb error
	// nets is the last good meshNetworks (nil: none); netsProb why the ConfigMap's was refused.
	nets      *meshv1alpha1.MeshNetworks
	netsProb  error
	watchProb map[string]error // by informer name
	// namespaces are the labels of the namespaces published (schema.Namespace), by name.
	namespaces map[string]map[string]string

	// restored holds, until the initial sync, the last valid versions saved by the previous
	// run, by type URL then bus name; restoredCount counts those the initial sync used.
	restored      map[string]map[string]keptVersion
	restoredCount int
	saved         []byte            // the state last handed to writer
	writer        *statefile.Writer // nil without a state folder
}

type kindState struct {
	kind schema.Kind
	// informer is caches.kinds[i]; nil for a Gateway API kind whose CRD is not installed.
	informer cache.SharedIndexInformer
	// published is what the bus has, by bus name: the last valid version of each resource.
	published map[string]config.Config
	// invalid holds the validation error of resources whose current version is invalid.
	invalid map[string]error
	// uids holds the UID of the object whose version is published, by bus name.
	uids map[string]types.UID
}

type statusKey struct {
	kind int // index in Source.kinds (and schema.ConfigKinds)
	ns   string
	name string
}

// New returns a Source reading the cluster restCfg points at.
func New(restCfg *rest.Config, cfg Config, pub bus.Publisher, log *slog.Logger) (*Source, error) {
	if restCfg == nil || pub == nil {
		return nil, errors.New("kubesource: a rest config and a publisher are required")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace
	}
	if cfg.Revision == nil {
		cfg.Revision = revision.Static(revision.Default)
	}
	if cfg.MeshConfigMap == "" {
		cfg.MeshConfigMap = MeshConfigMap
	}
	if cfg.Identity == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("kubesource: leader election identity: %w", err)
		}
		cfg.Identity = h
	}
	if cfg.LeaseDuration <= 0 {
		cfg.LeaseDuration = 15 * time.Second
	}
	if cfg.RenewDeadline <= 0 {
		cfg.RenewDeadline = 10 * time.Second
	}
	if cfg.RetryPeriod <= 0 {
		cfg.RetryPeriod = 2 * time.Second
	}
	s := &Source{
		cfg: cfg, log: log, pub: pub,
		ready: make(chan struct{}), probeNow: make(chan struct{}, 1), crdChanged: make(chan struct{}, 1),
		watchProb:  map[string]error{},
		namespaces: map[string]map[string]string{},
		events:     kube.ConfigEvents(cfg.MeterProvider),
	}
	s.outages = kube.NewOutages(restCfg.Host, log)
	restCfg = rest.CopyConfig(restCfg)
	restCfg.Wrap(s.outages.Wrap)
	kube.CountWatchErrors(restCfg, cfg.MeterProvider)
	clients, err := kube.NewClients(restCfg)
	if err != nil {
		return nil, fmt.Errorf("kubesource: %w", err)
	}
	s.clients = clients
	limited := kube.WithRateLimits(restCfg)
	if s.dynamic, err = dynamic.NewForConfig(limited); err != nil {
		return nil, fmt.Errorf("kubesource: %w", err)
	}
	if s.crds, err = metadata.NewForConfig(limited); err != nil {
		return nil, fmt.Errorf("kubesource: %w", err)
	}
	return s, nil
}

// Ready is closed once the first full state of every kind and the mesh config was published.
func (s *Source) Ready() <-chan struct{} { return s.ready }

// Leader reports whether this replica holds the Lease and writes status.
func (s *Source) Leader() bool { return s.leader.Load() }

// Problems returns the invalid resources (*config.Error, sorted by kind then name), an unusable
// mesh ConfigMap (wrapping ErrMeshConfigMap) and failing watches (wrapping ErrKubernetes).
func (s *Source) Problems() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []error
	if s.meshProb != nil {
		out = append(out, s.meshProb)
	}
	if s.netsProb != nil {
		out = append(out, s.netsProb)
	}
	if err := s.outages.Err(); err != nil {
		out = append(out, fmt.Errorf("%w: %w", ErrKubernetes, err))
	}
	for _, name := range slices.Sorted(maps.Keys(s.watchProb)) {
		out = append(out, s.watchProb[name])
	}
	for _, ks := range s.kinds {
		for _, name := range slices.Sorted(maps.Keys(ks.invalid)) {
			out = append(out, ks.invalid[name])
		}
	}
	return out
}

// Run watches the cluster and publishes until ctx is done. It fails only when a mesh file
// (Config.MeshFile) cannot be loaded at start.
func (s *Source) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Watched before the Gateway API kinds are looked up, so that no CRD installed meanwhile
	// goes unnoticed.
	if s.cfg.WatchNamespace == "" {
		stopCRDs := s.watchCRDs(ctx)
		defer stopCRDs()
	}
	served, err := s.gatewayAPIServedRetrying(ctx)
	if err != nil {
		return nil // ctx is done
	}
	s.logGatewayAPI(nil, served)
	g, err := s.newCaches(served)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	s.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.DefaultTypedControllerRateLimiter[statusKey](),
		workqueue.TypedRateLimitingQueueConfig[statusKey]{Name: "config-ingest-status"})
	s.mu.Lock()
	s.gwServed = served
	s.kinds = make([]*kindState, len(schema.ConfigKinds))
	for i, k := range schema.ConfigKinds {
		s.kinds[i] = &kindState{kind: k, published: map[string]config.Config{}, invalid: map[string]error{}, uids: map[string]types.UID{}}
	}
	s.useLocked(g)
	s.loadState()
	s.mu.Unlock()
	stopWriter := s.startWriter()
	defer func() {
		cancel()
		wg.Wait() // a resync in progress stops its own informers
		s.retired.Wait()
		s.mu.Lock()
		cur := s.caches
		s.mu.Unlock()
		cur.stop() // waits until the informers stopped
		s.queue.ShutDown()
		stopWriter() // after the informers: their handlers save
	}()

	meshCh := make(chan *meshv1alpha1.MeshConfig, 1)
	watchErr := make(chan error, 1)
	if s.cfg.MeshFile != "" {
		w := mesh.NewWatcher(s.cfg.MeshFile, func(m *meshv1alpha1.MeshConfig) {
			s.mu.Lock()
			defer s.mu.Unlock()
			if err := s.setMeshLocked(m); err != nil {
				s.meshProb = fmt.Errorf("%s: %w", s.cfg.MeshFile, err)
				s.log.Error("mesh config rejected; keeping the last good one", "error", s.meshProb)
				if s.mesh != nil {
					return
				}
				_ = s.setMeshLocked(mesh.Default())
			}
			select {
			case meshCh <- m:
			default:
			}
		}, mesh.WithLogger(s.log), mesh.WithDebounce(s.cfg.Debounce), mesh.WithReloadErrors(func(err error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.meshProb = err
		}))
		wg.Go(func() { watchErr <- w.Run(ctx) })
		// meshNetworks from the file beside the mesh file, as the ConfigMap's key would be.
		netsFile := mesh.NetworksFile(s.cfg.MeshFile)
		// Loaded now too, so that the first published state has them.
		if nets, err := mesh.LoadNetworks(netsFile); err == nil {
			s.mu.Lock()
			s.setNetworksLocked(nets)
			s.mu.Unlock()
		}
		wg.Go(func() {
			err := mesh.WatchNetworks(ctx, netsFile, s.cfg.Debounce, s.log, func(nets *meshv1alpha1.MeshNetworks) {
				s.mu.Lock()
				defer s.mu.Unlock()
				s.setNetworksLocked(nets)
			}, func(err error) {
				s.mu.Lock()
				defer s.mu.Unlock()
				s.netsProb = err
			})
			if err != nil {
				s.log.Error("meshNetworks not watched", "file", netsFile, "error", err)
			}
		})
	}
	g.start(ctx)

	wg.Go(func() { s.runLeaderElection(ctx) })
	wg.Go(func() { s.runStatusWriter(ctx) })
	wg.Go(func() { s.runProbes(ctx) })

	// The mesh config first: it says which namespaces count.
	if g.cm != nil {
		if !cache.WaitForCacheSync(ctx.Done(), g.cm.HasSynced) {
			return nil
		}
		s.onConfigMap()
	} else {
		select {
		case <-meshCh:
		case err := <-watchErr:
			return err
		case <-ctx.Done():
			return nil
		}
	}
	if !cache.WaitForCacheSync(ctx.Done(), g.synced()...) {
		return nil
	}

	s.mu.Lock()
	s.resyncLocked(func(string) bool { return true })
	s.resyncNamespacesLocked()
	s.pub.Replace(schema.MeshConfig.TypeURL, []*bus.Resource{meshResource(s.mesh)})
	s.pub.Replace(schema.MeshNetworks.TypeURL, meshNetworksResources(s.nets))
	s.pub.Replace(schema.Namespace.TypeURL, s.namespaceResourcesLocked())
	total := 0
	for _, ks := range s.kinds {
		rs := make([]*bus.Resource, 0, len(ks.published))
		for _, c := range ks.published {
			rs = append(rs, c.Resource())
		}
		total += len(rs)
		s.pub.Replace(ks.kind.TypeURL, rs)
	}
	s.synced = true
	if s.restored != nil {
		s.log.Info("saved Kubernetes config state restored", "file", s.statePath(), "resources", s.restoredCount)
	}
	s.restored = nil
	s.saveStateLocked() // drops what the restart did not use
	problems := s.problemCountLocked()
	s.mu.Unlock()
	close(s.ready)
	s.log.Info("config published from Kubernetes", "resources", total, "problems", problems)

	wg.Go(func() {
		s.outages.Run(ctx, s.clients.Kube.Discovery().RESTClient(), func(until context.Context) error {
			// The Gateway API CRDs may have changed during the outage too.
			served, err := s.gatewayAPIServed(until)
			if err != nil {
				served = s.servedGatewayAPI()
			}
			return s.resync(ctx, until, served)
		})
	})
	wg.Go(func() { s.followCRDs(ctx) })
	select {
	case <-ctx.Done():
		return nil
	case err := <-watchErr:
		return err
	}
}

// caches is one generation of the Source's informers. After an API server outage a new
// generation replaces the old one whole (see resync).
type caches struct {
	factories []interface {
		Start(stopCh <-chan struct{})
		Shutdown()
	}
	kinds              []cache.SharedIndexInformer // by index in schema.ConfigKinds; nil when not served
	ns                 cache.SharedIndexInformer
	cm                 cache.SharedIndexInformer // nil when the mesh config comes from a file
	nsLister, cmLister cache.GenericLister
	cancel             context.CancelFunc
}

// newCaches builds a generation of informers, with the Source's handlers; nothing runs yet.
// Of the Gateway API kinds, only those served (by plural) are watched.
func (s *Source) newCaches(served map[string]bool) (*caches, error) {
	ns := cmp.Or(s.cfg.WatchNamespace, metav1.NamespaceAll)
	istioF := istioinformers.NewSharedInformerFactoryWithOptions(s.clients.Istio, 0, istioinformers.WithNamespace(ns))
	nsF := informers.NewSharedInformerFactoryWithOptions(s.clients.Kube, 0)
	gwF := dynamicinformer.NewFilteredDynamicSharedInformerFactory(s.dynamic, 0, ns, nil)
	g := &caches{cancel: func() {}}
	g.factories = append(g.factories, istioF, gwF)
	if s.cfg.WatchNamespace == "" {
		g.factories = append(g.factories, nsF)
	}
	for i, k := range schema.ConfigKinds {
		var inf cache.SharedIndexInformer
		switch {
		case isGatewayAPI(k) && (!served[k.Plural] || k.ClusterScoped && s.cfg.WatchNamespace != ""):
			// GatewayClasses are cluster-scoped: not read when watching one namespace.
			g.kinds = append(g.kinds, nil)
			continue
		case isGatewayAPI(k):
			inf = gwF.ForResource(gvr(k)).Informer()
		default:
			gi, err := istioF.ForResource(gvr(k))
			if err != nil {
				return nil, fmt.Errorf("kubesource: %s: %w", k.Kind, err)
			}
			inf = gi.Informer()
		}
		g.kinds = append(g.kinds, inf)
		s.handle(g, inf, informerName(k), func(key string) { s.onObject(i, key) })
	}
	if s.cfg.WatchNamespace == "" {
		g.ns = nsF.Core().V1().Namespaces().Informer()
	} else {
		g.ns = oneNamespace(s.cfg.WatchNamespace)
		g.factories = append(g.factories, informerRunner{g.ns})
	}
	g.nsLister = cache.NewGenericLister(g.ns.GetIndexer(), corev1.Resource("namespaces"))
	s.handle(g, g.ns, "Namespace", s.onNamespace)
	if s.cfg.MeshFile == "" {
		cmF := informers.NewSharedInformerFactoryWithOptions(s.clients.Kube, 0,
			informers.WithNamespace(s.cfg.Namespace),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = "metadata.name=" + s.cfg.MeshConfigMap }))
		g.factories = append(g.factories, cmF)
		g.cm = cmF.Core().V1().ConfigMaps().Informer()
		g.cmLister = cache.NewGenericLister(g.cm.GetIndexer(), corev1.Resource("configmaps"))
		s.handle(g, g.cm, "ConfigMap", func(string) { s.onConfigMap() })
	}
	return g, nil
}

func (g *caches) start(ctx context.Context) {
	ctx, g.cancel = context.WithCancel(ctx)
	for _, f := range g.factories {
		f.Start(ctx.Done())
	}
}

// stop stops the informers and waits until they did.
func (g *caches) stop() {
	g.cancel()
	for _, f := range g.factories {
		f.Shutdown()
	}
}

func (g *caches) synced() []cache.InformerSynced {
	out := []cache.InformerSynced{g.ns.HasSynced}
	if g.cm != nil {
		out = append(out, g.cm.HasSynced)
	}
	for _, inf := range g.kinds {
		if inf != nil {
			out = append(out, inf.HasSynced)
		}
	}
	return out
}

// useLocked makes g the informers every lookup reads.
func (s *Source) useLocked(g *caches) {
	s.caches = g
	for i, ks := range s.kinds {
		ks.informer = g.kinds[i]
	}
}

// resync, run when the API server answers again after an outage, replaces the informers with
// new ones (client-go's would relist only when their backoff, up to a minute, lets them) and,
// once the new ones listed everything, diffs their state against what is published: what
// changed or went away during the outage is published, what did not is left as it is. The
// informers run under ctx; until cancels the wait for their first list. served are the Gateway
// API kinds to watch.
func (s *Source) resync(ctx, until context.Context, served map[string]bool) error {
	s.resyncMu.Lock()
	defer s.resyncMu.Unlock()
	g, err := s.newCaches(served)
	if err != nil {
		return err
	}
	g.start(ctx)
	if !cache.WaitForCacheSync(until.Done(), g.synced()...) {
		g.stop()
		return fmt.Errorf("kubesource: new informers not synced: %w", context.Cause(until))
	}
	s.mu.Lock()
	old := s.caches
	s.gwServed = served
	s.useLocked(g)
	if g.cm != nil {
		s.onConfigMapLocked()
	}
	s.resyncLocked(func(string) bool { return true })
	s.resyncNamespacesLocked()
	s.mu.Unlock()
	// old's events are ignored from now on: stop it in the background (client-go takes seconds
	// to close its watches); Run waits for it.
	s.retired.Go(old.stop)
	return nil
}

func (s *Source) problemCountLocked() int {
	n := len(s.watchProb)
	if s.outages.Err() != nil {
		n++
	}
	if s.meshProb != nil {
		n++
	}
	for _, ks := range s.kinds {
		n += len(ks.invalid)
	}
	return n
}

// handle routes inf's events, by namespace/name key, to fn, and records its watch errors,
// while g is the generation in use: a new generation's initial list is taken in whole by
// resync, and an old one's late events are stale.
func (s *Source) handle(g *caches, inf cache.SharedIndexInformer, name string, fn func(key string)) {
	current := func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.caches == g
	}
	key := func(obj any) {
		if !current() {
			return
		}
		k, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
		if err != nil {
			s.log.Warn("unexpected object in informer", "kind", name, "error", err)
			return
		}
		fn(k)
	}
	_, _ = inf.AddEventHandler(s.events.Counted(name, cache.ResourceEventHandlerFuncs{
		AddFunc:    key,
		UpdateFunc: func(_, obj any) { key(obj) },
		DeleteFunc: key,
	}))
	// Set before the informer starts, as client-go requires; it replaces client-go's default
	// handler, which only logs.
	_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		if !current() {
			return
		}
		s.log.Warn("kubernetes watch failed; retrying", "kind", name, "error", err)
		s.mu.Lock()
		s.watchProb[name] = fmt.Errorf("%w: list/watch %s: %w", ErrKubernetes, name, err)
		s.mu.Unlock()
		select {
		case s.probeNow <- struct{}{}:
		default:
		}
	})
}

// onObject re-evaluates one resource of kinds[i] from the informer's current state.
func (s *Source) onObject(i int, key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.synced {
		return // the initial full pass reads the informers' state
	}
	ctx, span := tracer().Start(context.Background(), "config.change", trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String("sailplane.trigger", "kubernetes watch"),
			attribute.String("sailplane.kind", s.kinds[i].kind.Kind), attribute.String("sailplane.name", key)))
	defer span.End()
	s.syncLocked(ctx, s.kinds[i], i, key)
}

// syncLocked brings the bus in line with the informer's state of one resource: publishes it
// when valid and selected, deletes it when gone or no longer selected, and keeps the last valid
// version when the current one is invalid. Before the initial sync it only records the state.
func (s *Source) syncLocked(ctx context.Context, ks *kindState, i int, key string) {
	ns, name, _ := cache.SplitMetaNamespaceKey(key)
	busName := schema.Name(ns, name)
	var obj any
	exists := false
	if ks.informer != nil { // nil: the kind's CRD is gone, and its objects with it
		obj, exists, _ = ks.informer.GetIndexer().GetByKey(key)
	}
	// Cluster-scoped kinds (GatewayClass) are in no namespace for the selectors to filter.
	if !exists || (!ks.kind.ClusterScoped && !s.selectedLocked(ns)) || !s.inRevision(obj) {
		_, wasInvalid := ks.invalid[busName]
		delete(ks.invalid, busName)
		delete(ks.uids, busName)
		if _, ok := ks.published[busName]; ok {
			delete(ks.published, busName)
			if s.synced {
				s.pub.Delete(ks.kind.TypeURL, busName)
			}
		}
		if wasInvalid {
			s.saveStateLocked()
		}
		return
	}
	c, ok := toConfig(ks.kind, obj)
	if !ok {
		return
	}
	meta, _, _, _ := parts(obj)
	uid := meta.GetUID()
	s.enqueueStatusLocked(statusKey{kind: i, ns: ns, name: name})
	_, validating := tracer().Start(ctx, "config.validate")
	warnings, err := config.Validate(c)
	endValidate(validating, err)
	for _, w := range warnings {
		s.log.Warn("config warning", "warning", w.String())
	}
	if err != nil {
		if kept, ok := s.restored[ks.kind.TypeURL][busName]; ok && kept.uid == uid {
			if _, ok := ks.published[busName]; !ok {
				ks.published[busName], ks.uids[busName] = kept.c, uid
				s.restoredCount++
			}
		}
		prev := ks.invalid[busName]
		ks.invalid[busName] = err
		if prev == nil {
			s.saveStateLocked()
		}
		if prev == nil || prev.Error() != err.Error() {
			_, kept := ks.published[busName]
			s.log.Error("invalid config not published", "error", err, "previous_version_kept", kept)
		}
		return
	}
	ks.uids[busName] = uid
	if ks.invalid[busName] != nil {
		delete(ks.invalid, busName)
		s.log.Info("config valid again", "kind", ks.kind.Kind, "name", busName)
		s.saveStateLocked()
	}
	if prev, ok := ks.published[busName]; ok && config.Equal(prev, c) {
		return // a status or metadata-only change
	}
	ks.published[busName] = c
	if s.synced {
		ctx, span := tracer().Start(ctx, "bus.publish", trace.WithAttributes(attribute.String("sailplane.type", ks.kind.TypeURL)))
		s.pub.Upsert(ks.kind.TypeURL, bus.Traced(ctx, c.Resource())...)
		span.End()
	}
}

// resyncLocked re-evaluates every known resource in the namespaces match accepts.
func (s *Source) resyncLocked(match func(ns string) bool) {
	for i, ks := range s.kinds {
		keys := map[string]bool{}
		if ks.informer != nil {
			for _, k := range ks.informer.GetIndexer().ListKeys() {
				keys[k] = true
			}
		}
		for busName := range ks.published {
			// The informer's key: "namespace/name", "name" for a cluster-scoped kind, as the
			// bus name.
			keys[busName] = true
		}
		for k := range keys {
			ns, _, _ := cache.SplitMetaNamespaceKey(k)
			if match(ns) {
				s.syncLocked(context.Background(), ks, i, k)
			}
		}
	}
}

// inRevision reports whether obj is this revision's config (Config.Revision).
func (s *Source) inRevision(obj any) bool {
	m, _, _, ok := parts(obj)
	return ok && revision.ConfigIn(s.cfg.Revision, m.GetLabels())
}

// RevisionChanged re-evaluates every resource: the revision's tags may have changed.
func (s *Source) RevisionChanged() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.synced {
		s.resyncLocked(func(string) bool { return true })
	}
}

// Selected reports whether the mesh config's discoverySelectors admit namespace ns, as for
// config; before the first sync (Ready), every namespace is.
func (s *Source) Selected(ns string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.caches == nil {
		return true
	}
	return s.selectedLocked(ns)
}

// selectedLocked applies the discoverySelectors. The control plane and root namespaces are
// always read, as istiod does for its own namespace: mesh-wide policies live there.
func (s *Source) selectedLocked(ns string) bool {
	if s.selectors == nil || ns == s.cfg.Namespace || ns == s.mesh.GetRootNamespace() {
		return true
	}
	obj, err := s.caches.nsLister.Get(ns)
	if err != nil {
		return false
	}
	n, ok := obj.(*corev1.Namespace)
	if !ok {
		return false
	}
	return mesh.Selected(s.selectors, n.Labels)
}

func (s *Source) onNamespace(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.synced {
		return
	}
	s.syncNamespaceLocked(key)
	if s.selectors == nil {
		return
	}
	s.resyncLocked(func(ns string) bool { return ns == key })
	if s.cfg.OnSelection != nil {
		s.cfg.OnSelection()
	}
}

// onConfigMap reads the mesh config from the ConfigMap; a missing ConfigMap or key means
// Istio's defaults, a broken one keeps the last good mesh config.
func (s *Source) onConfigMap() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onConfigMapLocked()
}

func (s *Source) onConfigMapLocked() {
	where := s.cfg.Namespace + "/" + s.cfg.MeshConfigMap
	data, netsData := "", ""
	if obj, err := s.caches.cmLister.ByNamespace(s.cfg.Namespace).Get(s.cfg.MeshConfigMap); err == nil {
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			data, netsData = cm.Data[MeshKey], cm.Data[MeshNetworksKey]
		}
	}
	if nets, err := mesh.ParseNetworks([]byte(netsData)); err != nil {
		s.netsProb = fmt.Errorf("%w %s key %q: %w", ErrMeshConfigMap, where, MeshNetworksKey, err)
		s.log.Error("meshNetworks unusable; keeping the last good ones", "error", s.netsProb)
	} else {
		s.netsProb = nil
		s.setNetworksLocked(nets)
	}
	m, err := mesh.Parse([]byte(data))
	if err == nil {
		if err = s.setMeshLocked(m); err == nil {
			s.meshProb = nil
			return
		}
	}
	s.meshProb = fmt.Errorf("%w %s key %q: %w", ErrMeshConfigMap, where, MeshKey, err)
	if s.mesh == nil {
		s.log.Error("mesh config ConfigMap unusable; using Istio's defaults", "error", s.meshProb)
		_ = s.setMeshLocked(mesh.Default())
		return
	}
	s.log.Error("mesh config ConfigMap unusable; keeping the last good mesh config", "error", s.meshProb)
}

// setNetworksLocked makes nets the meshNetworks, published once the initial state was.
func (s *Source) setNetworksLocked(nets *meshv1alpha1.MeshNetworks) {
	if proto.Equal(s.nets, nets) {
		return
	}
	s.nets = nets
	if s.synced {
		s.log.Info("meshNetworks changed")
		s.pub.Replace(schema.MeshNetworks.TypeURL, meshNetworksResources(nets))
	}
}

// meshNetworksResources is the bus state of meshNetworks: one resource, or none.
func meshNetworksResources(nets *meshv1alpha1.MeshNetworks) []*bus.Resource {
	if nets == nil {
		return nil
	}
	return []*bus.Resource{{Name: "mesh-networks", Body: nets}}
}

// setMeshLocked makes m the mesh config: publishes it and, when the discoverySelectors changed,
// re-evaluates every resource.
func (s *Source) setMeshLocked(m *meshv1alpha1.MeshConfig) error {
	if s.mesh != nil && proto.Equal(s.mesh, m) {
		return nil
	}
	sels, err := selectors(m)
	if err != nil {
		return err
	}
	old := s.mesh
	s.mesh, s.selectors = m, sels
	if !s.synced {
		return nil
	}
	s.log.Info("mesh config changed")
	s.pub.Upsert(schema.MeshConfig.TypeURL, meshResource(m))
	if !slices.EqualFunc(old.GetDiscoverySelectors(), m.GetDiscoverySelectors(), func(a, b *meshv1alpha1.LabelSelector) bool { return proto.Equal(a, b) }) ||
		old.GetRootNamespace() != m.GetRootNamespace() {
		s.log.Info("discovery selectors changed", "selectors", len(m.GetDiscoverySelectors()))
		s.resyncLocked(func(string) bool { return true })
		s.resyncNamespacesLocked()
		if s.cfg.OnSelection != nil {
			s.cfg.OnSelection()
		}
	}
	return nil
}

// selectors compiles the mesh config's discoverySelectors; nil when there are none.
func selectors(m *meshv1alpha1.MeshConfig) ([]labels.Selector, error) {
	return mesh.DiscoverySelectors(m)
}

func (s *Source) enqueueStatusLocked(k statusKey) {
	if s.leader.Load() && !isGatewayAPI(s.kinds[k.kind].kind) {
		s.queue.Add(k)
	}
}

// writeStatus makes one resource's status carry its current validation result.
func (s *Source) writeStatus(ctx context.Context, k statusKey) error {
	s.mu.Lock()
	ks := s.kinds[k.kind]
	inf := ks.informer
	selected := s.selectedLocked(k.ns)
	s.mu.Unlock()
	if !selected || !s.leader.Load() {
		return nil
	}
	obj, exists, err := inf.GetIndexer().GetByKey(k.ns + "/" + k.name)
	if err != nil || !exists {
		return nil
	}
	meta, _, status, ok := parts(obj)
	c, ok2 := toConfig(ks.kind, obj)
	if !ok || !ok2 {
		return nil
	}
	_, invalid := config.Validate(c)
	patch, err := statusPatch(status, invalid, meta.GetResourceVersion(), time.Now())
	if err != nil || patch == nil {
		return err
	}
	rc := s.clients.Istio.NetworkingV1().RESTClient()
	if ks.kind.Group == "security.istio.io" {
		rc = s.clients.Istio.SecurityV1().RESTClient()
	}
	err = rc.Patch(types.MergePatchType).Namespace(k.ns).Resource(ks.kind.Plural).Name(k.name).
		SubResource("status").Body(patch).Do(ctx).Error()
	if err != nil {
		return fmt.Errorf("status of %s %s/%s: %w", ks.kind.Kind, k.ns, k.name, err)
	}
	s.log.Debug("status written", "kind", ks.kind.Kind, "namespace", k.ns, "name", k.name)
	return nil
}

func (s *Source) runStatusWriter(ctx context.Context) {
	go func() {
		<-ctx.Done()
		s.queue.ShutDown()
	}()
	for {
		k, quit := s.queue.Get()
		if quit {
			return
		}
		if err := s.writeStatus(ctx, k); err != nil && ctx.Err() == nil {
			// A conflict means the informer has a newer version coming, which is enqueued
			// again; anything else is retried with backoff.
			s.log.Warn("cannot write status; retrying", "error", err)
			s.queue.AddRateLimited(k)
		} else {
			s.queue.Forget(k)
		}
		s.queue.Done(k)
	}
}

// runProbes clears watch problems once the failing resources can be listed again (client-go
// has no "watch recovered" callback).
func (s *Source) runProbes(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.probeNow:
		case <-t.C:
		}
		s.mu.Lock()
		names := slices.Collect(maps.Keys(s.watchProb))
		s.mu.Unlock()
		for _, name := range names {
			if err := s.probe(ctx, name); err == nil {
				s.mu.Lock()
				delete(s.watchProb, name)
				s.mu.Unlock()
				s.log.Info("kubernetes watch recovered", "kind", name)
			}
		}
	}
}

func (s *Source) probe(ctx context.Context, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	one := metav1.ListOptions{Limit: 1}
	switch name {
	case "Namespace":
		_, err := s.clients.Kube.CoreV1().Namespaces().List(ctx, one)
		return err
	case "ConfigMap":
		one.FieldSelector = "metadata.name=" + s.cfg.MeshConfigMap
		_, err := s.clients.Kube.CoreV1().ConfigMaps(s.cfg.Namespace).List(ctx, one)
		return err
	}
	for _, k := range schema.ConfigKinds {
		if informerName(k) != name {
			continue
		}
		if isGatewayAPI(k) {
			_, err := s.dynamic.Resource(gvr(k)).List(ctx, one)
			return err
		}
		rc := s.clients.Istio.NetworkingV1().RESTClient()
		if k.Group == "security.istio.io" {
			rc = s.clients.Istio.SecurityV1().RESTClient()
		}
		return rc.Get().Resource(k.Plural).Param("limit", "1").Do(ctx).Error()
	}
	return nil
}

func meshResource(m *meshv1alpha1.MeshConfig) *bus.Resource {
	return &bus.Resource{Name: "mesh", Body: m}
}
