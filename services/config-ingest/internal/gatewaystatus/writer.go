// Package gatewaystatus writes the Kubernetes Gateway API status that gatewayapi.Translate
// computes, as the spec and istiod write it: only the status leader writes; a burst of changes
// becomes one write per object (changes are coalesced, then each object is queued once); writes
// are rate-limited; nothing is written when the object already carries its status (compared
// semantically); a condition keeps its lastTransitionTime unless its status, reason or message
// changed; on routes and policies only this controller's parent entries are replaced, other
// controllers' are kept; each write is a PUT of the /status subresource at the object's
// resourceVersion, retried on conflict from a fresh read.
package gatewaystatus

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"golang.org/x/time/rate"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	istioinformers "istio.io/client-go/pkg/informers/externalversions"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	gwinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions"

	"sailplane.dev/shared/gatewayapi"
	"sailplane.dev/shared/kube"
	"sailplane.dev/shared/revision"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/telemetry"
)

// RevisionLabel is Istio's label binding an object (or its namespace) to one control plane
// revision; a revision writes the status only of the objects that are its own (istiod's
// TagWatcher.IsMine, so that revisions do not fight over status: istio/istio#52105).
const RevisionLabel = "istio.io/rev"

// DefaultRevision is the revision of a control plane installed without one.
const DefaultRevision = "default"

// Defaults of Config.
const (
	DefaultQPS      = 50
	DefaultBurst    = 100
	DefaultDebounce = 100 * time.Millisecond
	DefaultMaxDelay = time.Second
)

// Config configures a Writer.
type Config struct {
	// Translate computes the status of every object (gatewayapi.Translate). Required.
	Translate func(gatewayapi.Input) gatewayapi.Output
	// Leader reports whether this replica holds the status Lease: only then does it write.
	// Required; call Elected when it becomes true.
	Leader func() bool
	// Revision is the control plane's revision; DefaultRevision when empty. Objects labelled
	// (or in a namespace labelled) istio.io/rev for another revision are left to it.
	Revision string
	// Owner, when set, decides instead of Revision which istio.io/rev values are this
	// revision's (its tags included: revision.Tags). Call Elected when its answers change.
	Owner revision.Owner
	// Selected, when set, admits the namespaces the mesh reads (the discoverySelectors, as the
	// bus): objects elsewhere are left out of the status, as if absent. Call Changed when its
	// answers may have changed.
	Selected func(namespace string) bool
	// DomainSuffix is the cluster domain; "cluster.local" when empty.
	DomainSuffix string
	// QPS and Burst limit the status writes; DefaultQPS and DefaultBurst when zero.
	QPS   float64
	Burst int
	// Debounce is how long changes must stay quiet before the status is computed again, and
	// MaxDelay how long a stream of changes can postpone it; DefaultDebounce and
	// DefaultMaxDelay when zero.
	Debounce, MaxDelay time.Duration
	// ServiceReady, when set, says whether the workloads behind a Service are ready, for the
	// Services it knows (the generated Services of deployed gateways: their Deployment has a
	// ready replica): a Gateway is Programmed only once its Service is ready. A Service it
	// does not know is ready once it has endpoints (EndpointSlices), as in istiod. Call Changed
	// when its answers may have changed.
	ServiceReady func(namespace, name string) (ready, known bool)
	// Credentials checks the Secrets and ConfigMaps that listeners' certificateRefs, Gateways'
	// caCertificateRefs and BackendTLSPolicies name (gatewayapi.Secrets), as istiod: a missing or
	// malformed one makes its listener or policy invalid. Only each object's verdict is kept,
	// never its data. It needs list and watch on Secrets and ConfigMaps in every namespace;
	// without them (or unset) references are taken as valid.
	Credentials bool
	// InvalidParameters, when set, says why a Gateway's infrastructure parameters cannot be
	// used (the deployment controller's verdict: parametersRef of an unsupported kind or
	// missing, a ConfigMap it cannot apply), nil when they can: such a Gateway is
	// Accepted=False with reason InvalidParameters, as the spec asks. Call Changed when its
	// answers may have changed.
	InvalidParameters func(namespace, name string) error
	// Now is the clock of lastTransitionTime; time.Now when nil.
	Now func() time.Time
	// Logger; discarded when nil.
	Logger *slog.Logger
	// MeterProvider receives sailplane_gateway_status_writes_total; the global one when nil.
	MeterProvider metric.MeterProvider
}

// Writer computes the Gateway API status from informers and, while it is the leader, writes it.
type Writer struct {
	cfg     Config
	log     *slog.Logger
	kube    kubernetes.Interface
	istio   istioclient.Interface
	gw      gwclient.Interface
	limiter *rate.Limiter
	writes  metric.Int64Counter

	kinds     map[string]*kind
	services  cache.SharedIndexInformer
	endpoints *endpoints // which Services have endpoints (EndpointSlices)
	entries   cache.SharedIndexInformer
	grants    cache.SharedIndexInformer // ReferenceGrants: read by Translate, no status
	ns        cache.SharedIndexInformer
	factories []interface {
		Start(<-chan struct{})
		Shutdown()
	}
	// secrets and configMaps hold credentials (Config.Credentials); nil when not read.
	secrets, configMaps cache.SharedIndexInformer

	dirty chan struct{} // something Translate reads changed
	queue workqueue.TypedRateLimitingInterface[key]

	mu      sync.Mutex
	synced  bool
	desired map[key]any
	status  []gatewayapi.Status // the last Translate's, for the debug page
}

// key names one object: its Gateway API kind and namespace/name.
type key struct {
	kind, ns, name string
}

// New returns a Writer reading and writing the cluster restCfg points at; nothing runs before Run.
func New(restCfg *rest.Config, cfg Config) (*Writer, error) {
	if cfg.Translate == nil || cfg.Leader == nil {
		return nil, errors.New("gatewaystatus: Config.Translate and Config.Leader are required")
	}
	cfg.Revision = cmp.Or(cfg.Revision, DefaultRevision)
	cfg.DomainSuffix = cmp.Or(cfg.DomainSuffix, "cluster.local")
	cfg.QPS = cmp.Or(cfg.QPS, DefaultQPS)
	cfg.Burst = cmp.Or(cfg.Burst, DefaultBurst)
	cfg.Debounce = cmp.Or(cfg.Debounce, DefaultDebounce)
	cfg.MaxDelay = cmp.Or(cfg.MaxDelay, DefaultMaxDelay)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	restCfg = kube.WithRateLimits(restCfg)
	w := &Writer{cfg: cfg, log: cfg.Logger, limiter: rate.NewLimiter(rate.Limit(cfg.QPS), cfg.Burst), dirty: make(chan struct{}, 1)}
	var err error
	if w.kube, err = kubernetes.NewForConfig(restCfg); err != nil {
		return nil, fmt.Errorf("gatewaystatus: %w", err)
	}
	if w.istio, err = istioclient.NewForConfig(restCfg); err != nil {
		return nil, fmt.Errorf("gatewaystatus: %w", err)
	}
	if w.gw, err = gwclient.NewForConfig(restCfg); err != nil {
		return nil, fmt.Errorf("gatewaystatus: %w", err)
	}
	w.writes, err = telemetry.Meter(cfg.MeterProvider, "sailplane.dev/config-ingest").Int64Counter("sailplane_gateway_status_writes_total",
		metric.WithDescription("Gateway API status writes by kind and result: written, skipped (the object already carried its status) or failed."))
	telemetry.Handle(err)
	return w, nil
}

// Elected is called when this replica becomes the leader: it checks every object, as what
// changed meanwhile was not written.
func (w *Writer) Elected() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.synced {
		w.enqueueAllLocked()
	}
}

// Run watches the cluster and writes status until ctx is done.
func (w *Writer) Run(ctx context.Context) error {
	w.queue = workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[key](),
		workqueue.TypedRateLimitingQueueConfig[key]{Name: "gateway-status"})
	defer w.queue.ShutDown()
	served, ok := w.waitForAPI(ctx)
	if !ok {
		return nil
	}
	gwF := gwinformers.NewSharedInformerFactory(w.gw, 0)
	coreF := informers.NewSharedInformerFactory(w.kube, 0)
	istioF := istioinformers.NewSharedInformerFactory(w.istio, 0)
	w.factories = append(w.factories, gwF, coreF, istioF)
	w.kinds = newKinds(w.gw, gwF, served)
	for _, k := range w.kinds {
		w.watch(k.informer, k.Kind.Kind)
		_, _ = k.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: func(obj any) {
			if m, err := meta.Accessor(obj); err == nil {
				k.forget(m.GetNamespace(), m.GetName())
			} else if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				ns, name, _ := cache.SplitMetaNamespaceKey(d.Key)
				k.forget(ns, name)
			}
		}})
	}
	w.services = coreF.Core().V1().Services().Informer()
	w.ns = coreF.Core().V1().Namespaces().Informer()
	w.entries = istioF.Networking().V1().ServiceEntries().Informer()
	slices := coreF.Discovery().V1().EndpointSlices().Informer()
	var err error
	if w.endpoints, err = newEndpoints(slices, w.markDirty); err != nil {
		return fmt.Errorf("gatewaystatus: %w", err)
	}
	informers := []cache.SharedIndexInformer{w.services, w.ns, w.entries}
	if served("referencegrants") {
		w.grants = gwF.Gateway().V1().ReferenceGrants().Informer()
		informers = append(informers, w.grants)
	}
	for _, inf := range informers {
		w.watch(inf, "")
	}
	if w.cfg.Credentials {
		if ok, why := mayReadCredentials(ctx, w.kube); !ok {
			w.log.Warn("the certificates Gateways and BackendTLSPolicies reference are not checked: grant the ClusterRole "+
				"sailplane-gateway-credentials, or set --gateway-secrets=false", "reason", why)
		} else {
			var err error
			if w.secrets, w.configMaps, err = w.watchCredentials(); err != nil {
				return err
			}
			informers = append(informers, w.secrets, w.configMaps)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		w.queue.ShutDown()
		wg.Wait()
		for _, f := range w.factories {
			f.Shutdown()
		}
	}()
	for _, f := range w.factories {
		f.Start(ctx.Done())
	}
	var synced []cache.InformerSynced
	for _, k := range w.kinds {
		synced = append(synced, k.informer.HasSynced)
	}
	for _, inf := range informers {
		synced = append(synced, inf.HasSynced)
	}
	synced = append(synced, slices.HasSynced)
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return nil
	}
	w.compute()
	w.mu.Lock()
	w.synced = true
	if w.cfg.Leader() {
		w.enqueueAllLocked()
	}
	w.mu.Unlock()
	const workers = 4
	for range workers {
		wg.Go(func() { w.runWorker(ctx) })
	}
	w.runCompute(ctx)
	return nil
}

// waitForAPI waits until the API server serves Gateway API v1 GatewayClasses and Gateways (the
// CRDs are often installed after the control plane) and returns which of the group's resources
// it serves: kinds whose CRD is missing (an older Gateway API release) are left out, as their
// informers would never sync. Kinds installed later are read after a restart.
func (w *Writer) waitForAPI(ctx context.Context) (served func(plural string) bool, ok bool) {
	tick := time.NewTicker(apiPoll)
	defer tick.Stop()
	for logged := false; ; {
		rl, err := w.kube.Discovery().ServerResourcesForGroupVersion(gwv1.GroupVersion.String())
		if err == nil {
			names := map[string]bool{}
			for _, r := range rl.APIResources {
				names[r.Name] = true
			}
			if names["gatewayclasses"] && names["gateways"] {
				return func(plural string) bool { return names[plural] }, true
			}
		}
		if !logged {
			w.log.Info("the API server does not serve Gateway API v1 GatewayClasses and Gateways (CRDs not installed?); the Gateway API status waits for them", "error", err)
			logged = true
		}
		select {
		case <-ctx.Done():
			return nil, false
		case <-tick.C:
		}
	}
}

// apiPoll is how often waitForAPI asks.
const apiPoll = 10 * time.Second

// watch routes an informer's events: a change of what Translate reads (a spec, labels, a
// Service) recomputes everything; an added or updated Gateway API object is also queued, to
// check it carries its status (a status-only change needs nothing else). An object deleted
// and made again with the same spec has the status it had, which the recomputation finds
// unchanged: only the queued check writes it to the new object.
func (w *Writer) watch(inf cache.SharedIndexInformer, kindName string) {
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			w.markDirty()
			if m, err := meta.Accessor(obj); err == nil && kindName != "" {
				w.enqueue(key{kind: kindName, ns: m.GetNamespace(), name: m.GetName()})
			}
		},
		DeleteFunc: func(any) { w.markDirty() },
		UpdateFunc: func(oldObj, newObj any) {
			o, err1 := meta.Accessor(oldObj)
			n, err2 := meta.Accessor(newObj)
			if kindName == "" || err1 != nil || err2 != nil {
				w.markDirty()
				return
			}
			w.enqueue(key{kind: kindName, ns: n.GetNamespace(), name: n.GetName()})
			if o.GetGeneration() != n.GetGeneration() || !equalMaps(o.GetLabels(), n.GetLabels()) || !equalMaps(o.GetAnnotations(), n.GetAnnotations()) {
				w.markDirty()
			}
		},
	})
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if bv, ok := b[k]; !ok || bv != v {
			return false
		}
	}
	return true
}

// serviceReady says whether the workloads behind a Service are ready: Config.ServiceReady for
// the Services it knows (a deployed gateway's: its Deployment has a ready replica), else whether
// the Service has endpoints, as istiod.
func (w *Writer) serviceReady(ns, name string) (ready, known bool) {
	if w.cfg.ServiceReady != nil {
		if r, known := w.cfg.ServiceReady(ns, name); known {
			return r, true
		}
	}
	return w.endpoints.Has(ns, name), true
}

// Changed asks for the status to be computed again: an input outside the writer's informers
// (Config.ServiceReady) may have changed.
func (w *Writer) Changed() { w.markDirty() }

func (w *Writer) markDirty() {
	select {
	case w.dirty <- struct{}{}:
	default:
	}
}

// runCompute recomputes the status once changes stay quiet for Debounce, or MaxDelay after
// the first of a stream of them.
func (w *Writer) runCompute(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.dirty:
		}
		deadline := time.NewTimer(w.cfg.MaxDelay)
		quiet := time.NewTimer(w.cfg.Debounce)
	wait:
		for {
			select {
			case <-ctx.Done():
				deadline.Stop()
				quiet.Stop()
				return
			case <-w.dirty:
				quiet.Reset(w.cfg.Debounce)
			case <-quiet.C:
				break wait
			case <-deadline.C:
				break wait
			}
		}
		deadline.Stop()
		quiet.Stop()
		w.compute()
	}
}

// compute runs Translate over the informers' state and queues, while leading, every object
// whose wanted status changed.
func (w *Writer) compute() {
	list := func(k schema.Kind) []any {
		if kd := w.kinds[k.Kind]; kd != nil {
			return w.configs(kd.list())
		}
		return nil
	}
	in := gatewayapi.Input{
		GatewayClasses:     listOf[*gwv1.GatewayClass](list(schema.GatewayClass)),
		Gateways:           listOf[*gwv1.Gateway](list(schema.KubernetesGateway)),
		ListenerSets:       listOf[*gwv1.ListenerSet](list(schema.ListenerSet)),
		HTTPRoutes:         listOf[*gwv1.HTTPRoute](list(schema.HTTPRoute)),
		GRPCRoutes:         listOf[*gwv1.GRPCRoute](list(schema.GRPCRoute)),
		TCPRoutes:          listOf[*gwv1.TCPRoute](list(schema.TCPRoute)),
		TLSRoutes:          listOf[*gwv1.TLSRoute](list(schema.TLSRoute)),
		BackendTLSPolicies: listOf[*gwv1.BackendTLSPolicy](list(schema.BackendTLSPolicy)),
		DomainSuffix:       w.cfg.DomainSuffix,
	}
	if w.grants != nil {
		in.ReferenceGrants = listOf[*gwv1.ReferenceGrant](w.configs(w.grants.GetStore().List()))
	}
	var entries []serviceEntry
	for _, se := range listOf[*networkingv1.ServiceEntry](w.configs(w.entries.GetStore().List())) {
		entries = append(entries, serviceEntry{ns: se.Namespace, spec: &se.Spec})
	}
	reg := newRegistry(listOf[*corev1.Service](w.selected(w.services.GetStore().List())), entries, w.cfg.DomainSuffix, w.serviceReady)
	in.Services = reg
	if w.secrets != nil {
		in.Services = credentialRegistry{registry: reg, secrets: w.secrets.GetStore(), configMaps: w.configMaps.GetStore()}
	}
	// Listeners' allowedRoutes namespace selectors match these.
	in.NamespaceLabels = map[string]map[string]string{}
	for _, n := range listOf[*corev1.Namespace](w.ns.GetStore().List()) {
		in.NamespaceLabels[n.Name] = n.Labels
	}
	out := w.cfg.Translate(in)
	if w.cfg.InvalidParameters != nil {
		markInvalidParameters(out.Status, w.cfg.InvalidParameters)
	}
	desired := make(map[key]any, len(out.Status))
	for _, s := range out.Status {
		desired[key{kind: s.Kind.Kind, ns: s.Namespace, name: s.Name}] = s.Value
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	old := w.desired
	w.desired, w.status = desired, out.Status
	if !w.cfg.Leader() || !w.synced {
		return
	}
	for k, v := range desired {
		if prev, ok := old[k]; !ok || !Equal(prev, v) {
			w.queue.Add(k)
		}
	}
	for k := range old {
		if _, ok := desired[k]; !ok {
			w.queue.Add(k) // a route no longer ours keeps no entry of ours
		}
	}
}

// markInvalidParameters sets Accepted=False, reason InvalidParameters, on the Gateways whose
// parameters cannot be used; the rest of their status (listeners, addresses) stays as computed.
func markInvalidParameters(sts []gatewayapi.Status, invalid func(namespace, name string) error) {
	for _, s := range sts {
		gs, ok := s.Value.(*gwv1.GatewayStatus)
		if !ok || s.Kind.Kind != schema.KubernetesGateway.Kind {
			continue
		}
		err := invalid(s.Namespace, s.Name)
		if err == nil {
			continue
		}
		c := metav1.Condition{Type: string(gwv1.GatewayConditionAccepted), Status: metav1.ConditionFalse,
			Reason: string(gwv1.GatewayReasonInvalidParameters), Message: err.Error(), ObservedGeneration: s.Generation}
		if i := slices.IndexFunc(gs.Conditions, func(c metav1.Condition) bool { return c.Type == string(gwv1.GatewayConditionAccepted) }); i >= 0 {
			gs.Conditions[i] = c
		} else {
			gs.Conditions = append(gs.Conditions, c)
		}
	}
}

func (w *Writer) enqueue(k key) {
	if w.cfg.Leader() {
		w.queue.Add(k)
	}
}

// enqueueAllLocked queues every Gateway API object with a status, for a new leader.
func (w *Writer) enqueueAllLocked() {
	for name, k := range w.kinds {
		for _, o := range k.list() {
			if m, err := meta.Accessor(o); err == nil {
				w.queue.Add(key{kind: name, ns: m.GetNamespace(), name: m.GetName()})
			}
		}
	}
}

func (w *Writer) runWorker(ctx context.Context) {
	for {
		k, quit := w.queue.Get()
		if quit {
			return
		}
		if err := w.write(ctx, k); err != nil && ctx.Err() == nil {
			w.count(ctx, k.kind, "failed")
			w.log.Warn("cannot write Gateway API status; retrying", "kind", k.kind, "namespace", k.ns, "name", k.name, "error", err)
			w.queue.AddRateLimited(k)
		} else {
			w.queue.Forget(k)
		}
		w.queue.Done(k)
	}
}

func (w *Writer) count(ctx context.Context, kind, result string) {
	w.writes.Add(context.WithoutCancel(ctx), 1, metric.WithAttributes(attribute.String("kind", kind), attribute.String("result", result)))
}

// maxConflicts bounds the retries of one write after conflicts (each from a fresh read).
const maxConflicts = 5

// write makes one object carry its wanted status.
func (w *Writer) write(ctx context.Context, k key) error {
	kd := w.kinds[k.kind]
	if kd == nil || !w.cfg.Leader() {
		return nil
	}
	obj, exists, err := kd.informer.GetIndexer().GetByKey(cache.NewObjectName(k.ns, k.name).String())
	if err != nil || !exists {
		return nil
	}
	if !w.mine(obj) || !w.inSelection(obj) {
		return nil
	}
	w.mu.Lock()
	want, ours := w.desired[k]
	w.mu.Unlock()
	if !ours && !kd.parented {
		return nil // another controller's object
	}
	now := metav1.NewTime(w.cfg.Now().Truncate(time.Second))
	for attempt := 0; ; attempt++ {
		updated, changed, err := kd.merge(obj, want, now)
		if err != nil {
			return err
		}
		if !changed {
			w.count(ctx, k.kind, "skipped")
			return nil
		}
		if err := w.limiter.Wait(ctx); err != nil {
			return err
		}
		if !w.cfg.Leader() {
			return nil
		}
		err = kd.update(ctx, updated)
		switch {
		case err == nil:
			w.count(ctx, k.kind, "written")
			w.log.Debug("Gateway API status written", "kind", k.kind, "namespace", k.ns, "name", k.name)
			return nil
		case apierrors.IsNotFound(err):
			return nil
		case !apierrors.IsConflict(err) || attempt >= maxConflicts:
			return fmt.Errorf("status of %s %s/%s: %w", k.kind, k.ns, k.name, err)
		}
		// Someone wrote the object since the informer saw it: merge with what it is now.
		w.log.Debug("Gateway API status conflict; reading the object again", "kind", k.kind, "namespace", k.ns, "name", k.name)
		if obj, err = kd.get(ctx, k.ns, k.name); err != nil {
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("status of %s %s/%s: %w", k.kind, k.ns, k.name, err)
		}
	}
}

// mine is istiod's IsMine: an object labelled istio.io/rev, or else in a namespace so
// labelled, belongs to that revision; an unlabelled one to the default revision.
func (w *Writer) mine(obj any) bool {
	m, err := meta.Accessor(obj)
	if err != nil {
		return false
	}
	rev, ok := m.GetLabels()[RevisionLabel]
	if !ok && m.GetNamespace() != "" {
		if nsObj, exists, _ := w.ns.GetIndexer().GetByKey(m.GetNamespace()); exists {
			if n, ok := nsObj.(*corev1.Namespace); ok {
				rev = n.Labels[RevisionLabel]
			}
		}
	}
	return w.owner().Owns(rev)
}

// Computed is one object's status as last computed, for the debug page.
type Computed struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	Status    any    `json:"status"`
}

// Statuses returns the status Translate last computed for each object, by kind (schema.GatewayAPI order) then namespace/name.
func (w *Writer) Statuses() []Computed {
	w.mu.Lock()
	defer w.mu.Unlock()
	return computed(w.status)
}

func computed(status []gatewayapi.Status) []Computed {
	out := make([]Computed, 0, len(status))
	for _, s := range status {
		out = append(out, Computed{Kind: s.Kind.Kind, Namespace: s.Namespace, Name: s.Name, Status: s.Value})
	}
	order := map[string]int{}
	for i, k := range schema.GatewayAPI {
		order[k.Kind] = i
	}
	slices.SortStableFunc(out, func(a, b Computed) int {
		return cmp.Or(cmp.Compare(order[a.Kind], order[b.Kind]), strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	return out
}
