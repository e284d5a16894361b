package kube

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/endpoint-watcher/internal/changetrace"
	"sailplane.dev/services/endpoint-watcher/internal/serviceentry"
	"sailplane.dev/shared/bus"
	sharedkube "sailplane.dev/shared/kube"
	"sailplane.dev/shared/schema"
)

// Defaults of Config.
const (
	DefaultNamespace         = "istio-system"
	DefaultRemoteSyncTimeout = 30 * time.Second
)

// ErrMissingDependency is returned by New when a required dependency is nil.
var ErrMissingDependency = errors.New("kube: missing dependency")

// Config configures the Controller.
type Config struct {
	// ClusterID of the primary cluster (required).
	ClusterID string
	// ClusterDomain of hostnames, DefaultClusterLocal when empty.
	ClusterDomain string
	// Namespace holding remote-cluster Secrets, DefaultNamespace when empty.
	Namespace string
	// WatchNamespace, when set, limits the primary's informers to that namespace (Roles there
	// suffice): Nodes and the control-plane Namespace, cluster-scoped, are not watched, so
	// endpoints have no node locality and the cluster's default network is unset.
	WatchNamespace string
	// RemoteSyncTimeout bounds how long Ready waits for the remote clusters known at start.
	RemoteSyncTimeout time.Duration
}

// WorkloadEntrySelector finds the WorkloadEntries a Service's selector selects.
type WorkloadEntrySelector interface {
	SelectWorkloadEntries(namespace string, selector map[string]string) []serviceentry.Workload
}

// WorkloadSink receives every Pod, so that ServiceEntry workloadSelectors can select them. What
// it publishes belongs to the trace of ctx's event (changetrace.Publisher).
type WorkloadSink interface {
	SetWorkload(ctx context.Context, w serviceentry.Workload)
	DeleteWorkload(ctx context.Context, clusterID, namespace, name string)
}

var _ WorkloadEntrySelector = (*serviceentry.Index)(nil)

// Deps are the Controller's collaborators.
type Deps struct {
	Logger *slog.Logger
	// Kube is the primary cluster. Required.
	Kube *rest.Config
	// Publisher receives Service and Endpoints resources. Required.
	Publisher bus.Publisher
	// WorkloadEntries and Workloads connect to the ServiceEntry registry; optional.
	WorkloadEntries WorkloadEntrySelector
	Workloads       WorkloadSink
	// MeterProvider receives pilot_k8s_reg_events and sailplane_kube_watch_errors_total; the
	// global provider when nil.
	MeterProvider metric.MeterProvider
}

// svcKey is a Kubernetes Service: the unit merged across clusters.
type svcKey struct{ namespace, name string }

// Controller watches the primary cluster and the remote clusters its Secrets register, and
// publishes one Service and one Endpoints per Kubernetes Service hostname, merged across
// clusters. Only what changed is published: one EndpointSlice change upserts one Endpoints.
type Controller struct {
	cfg   Config
	log   *slog.Logger
	rest  *rest.Config
	pub   bus.Publisher
	wes   WorkloadEntrySelector
	sink  WorkloadSink
	ready chan struct{}
	// meters is where every cluster's informers report; events counts their events.
	meters metric.MeterProvider
	events sharedkube.EventCounter

	// secretMu serializes syncSecret, which starts and stops clusters outside mu.
	secretMu sync.Mutex

	mu       sync.Mutex
	ctx      context.Context // Run's; remote clusters run under it
	closing  bool
	primary  *cluster
	clusters map[string]*cluster            // by cluster ID, the primary included
	bySecret map[string]map[string]*cluster // remote clusters by Secret, then ID
	synced   bool                           // the first full state was published
	dirty    map[svcKey]struct{}
	// Last published content per Service.
	services  map[svcKey]*discoveryv1.Service
	endpoints map[svcKey]*discoveryv1.Endpoints
}

// New checks its arguments; nothing runs before Run.
func New(cfg Config, deps Deps) (*Controller, error) {
	switch {
	case deps.Kube == nil:
		return nil, fmt.Errorf("%w: Kube", ErrMissingDependency)
	case deps.Publisher == nil:
		return nil, fmt.Errorf("%w: Publisher", ErrMissingDependency)
	case cfg.ClusterID == "":
		return nil, fmt.Errorf("%w: ClusterID", ErrMissingDependency)
	}
	cfg.ClusterDomain = cmp.Or(cfg.ClusterDomain, DefaultClusterLocal)
	cfg.Namespace = cmp.Or(cfg.Namespace, DefaultNamespace)
	cfg.RemoteSyncTimeout = cmp.Or(cfg.RemoteSyncTimeout, DefaultRemoteSyncTimeout)
	log := deps.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.WatchNamespace != "" {
		log.Info("watching one namespace: Nodes and the control-plane Namespace are cluster-scoped, so endpoints have no node locality and the cluster's default network is unset",
			"namespace", cfg.WatchNamespace)
	}
	return &Controller{
		cfg: cfg, log: log, rest: deps.Kube, pub: deps.Publisher,
		wes: deps.WorkloadEntries, sink: deps.Workloads,
		meters: deps.MeterProvider, events: sharedkube.RegistryEvents(deps.MeterProvider),
		ready:     make(chan struct{}),
		clusters:  map[string]*cluster{},
		bySecret:  map[string]map[string]*cluster{},
		dirty:     map[svcKey]struct{}{},
		services:  map[svcKey]*discoveryv1.Service{},
		endpoints: map[svcKey]*discoveryv1.Endpoints{},
	}, nil
}

// Ready is closed once the first full state of the primary cluster, and of the remote
// clusters registered at start (bounded by RemoteSyncTimeout), was published.
func (c *Controller) Ready() <-chan struct{} { return c.ready }

// Run watches until ctx is done and returns nil then; it fails only if the primary cluster's
// clients cannot be built.
func (c *Controller) Run(ctx context.Context) error {
	primary, err := c.newCluster(c.cfg.ClusterID, "", c.rest)
	if err != nil {
		return err
	}

	c.mu.Lock()
	c.ctx, c.primary = ctx, primary
	c.clusters[primary.id] = primary
	primary.start(ctx, c.clusterSynced, c.resync)
	c.mu.Unlock()
	defer c.shutdown()

	// The primary's caches include the remote-cluster Secrets: once synced, every remote
	// cluster known at start was added.
	select {
	case <-primary.syncedCh:
	case <-ctx.Done():
		return nil
	}
	c.mu.Lock()
	var remotes []*cluster
	for _, cl := range c.clusters {
		if cl != primary {
			remotes = append(remotes, cl)
		}
	}
	c.mu.Unlock()
	timeout := time.NewTimer(c.cfg.RemoteSyncTimeout)
	defer timeout.Stop()
wait:
	for _, cl := range remotes {
		select {
		case <-cl.syncedCh:
		case <-timeout.C:
			c.log.Warn("remote clusters not synced in time; going on without them", "timeout", c.cfg.RemoteSyncTimeout)
			break wait
		case <-ctx.Done():
			return nil
		}
	}

	c.mu.Lock()
	c.synced = true
	for _, cl := range c.clusters {
		if cl.synced {
			c.markCluster(cl)
		}
	}
	c.flush(context.Background())
	c.mu.Unlock()
	close(c.ready)
	c.log.Info("published initial Kubernetes registry", "clusters", len(remotes)+1)
	<-ctx.Done()
	return nil
}

// shutdown stops every cluster; no remote cluster starts any more.
func (c *Controller) shutdown() {
	c.mu.Lock()
	c.closing = true
	all := slices.Collect(maps.Values(c.clusters))
	c.mu.Unlock()
	for _, cl := range all {
		cl.stop()
	}
}

// clusterSynced runs once per cluster when its caches are synced.
func (c *Controller) clusterSynced(cl *cluster) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cl.synced = true
	if c.clusters[cl.id] != cl || !c.synced {
		return
	}
	c.log.Info("cluster synced", "cluster", cl.id)
	c.markCluster(cl)
	c.flush(context.Background())
}

// WorkloadEntriesChanged tells the controller that WorkloadEntries of these namespaces
// changed, so that Services selecting them are recomputed; what it publishes continues the
// trace of ctx's span.
func (c *Controller) WorkloadEntriesChanged(ctx context.Context, namespaces ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.synced {
		return
	}
	for _, cl := range c.clusters {
		if !cl.synced {
			continue
		}
		for _, ns := range namespaces {
			svcs, _ := cl.cur.services.Services(ns).List(labels.Everything())
			for _, s := range svcs {
				if len(s.Spec.Selector) > 0 {
					c.dirty[svcKey{s.Namespace, s.Name}] = struct{}{}
				}
			}
		}
	}
	c.flush(ctx)
}

// markCluster marks every Service of cl; c.mu held.
func (c *Controller) markCluster(cl *cluster) { c.markCaches(cl.cur) }

// markCaches marks every Service in g; c.mu held.
func (c *Controller) markCaches(g *caches) {
	svcs, _ := g.services.List(labels.Everything())
	for _, s := range svcs {
		c.dirty[svcKey{s.Namespace, s.Name}] = struct{}{}
	}
}

// markAndFlush marks keys and publishes, once the first full state is out, cl is synced and g
// is its caches in use (until then, the cluster's sync, or resync, marks all its Services at
// once).
func (c *Controller) markAndFlush(ctx context.Context, cl *cluster, g *caches, keys ...svcKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.synced || !cl.synced || cl.cur != g {
		return
	}
	for _, k := range keys {
		c.dirty[k] = struct{}{}
	}
	c.flush(ctx)
}

// event starts the handling of a watch event of cl: old is nil for an add, cur for a delete.
// What it publishes is the event's trace (see changetrace).
func (c *Controller) event(cl *cluster, kind string, old, cur any) (context.Context, func()) {
	e := changetrace.Event{At: time.Now(), Registry: Registry, Kind: kind, Op: "update", Cluster: cl.id}
	switch {
	case old == nil:
		e.Op = "add"
	case cur == nil:
		e.Op = "delete"
	}
	if m, ok := cmp.Or(cur, old).(metav1.Object); ok {
		e.Namespace, e.Name = m.GetNamespace(), m.GetName()
	}
	return changetrace.Start(context.Background(), e)
}

func (c *Controller) onService(cl *cluster, g *caches, old, cur any) {
	ctx, end := c.event(cl, "Service", old, cur)
	defer end()
	var keys []svcKey
	for _, o := range []any{old, cur} {
		if s, ok := o.(*corev1.Service); ok {
			keys = append(keys, svcKey{s.Namespace, s.Name})
		}
	}
	c.markAndFlush(ctx, cl, g, keys...)
}

func (c *Controller) onSlice(cl *cluster, g *caches, old, cur any) {
	ctx, end := c.event(cl, "EndpointSlice", old, cur)
	defer end()
	var keys []svcKey
	for _, o := range []any{old, cur} {
		if s, ok := o.(*discovery.EndpointSlice); ok && s.Labels[discovery.LabelServiceName] != "" {
			keys = append(keys, svcKey{s.Namespace, s.Labels[discovery.LabelServiceName]})
		}
	}
	c.markAndFlush(ctx, cl, g, keys...)
}

// slicesServices lists the Services of the EndpointSlices found under index keys.
func (g *caches) slicesServices(index string, keys ...string) []svcKey {
	var out []svcKey
	for _, key := range keys {
		objs, _ := g.slices.ByIndex(index, key)
		for _, o := range objs {
			if s, ok := o.(*discovery.EndpointSlice); ok && s.Labels[discovery.LabelServiceName] != "" {
				out = append(out, svcKey{s.Namespace, s.Labels[discovery.LabelServiceName]})
			}
		}
	}
	return out
}

func (c *Controller) onPod(cl *cluster, g *caches, old, cur any) {
	p, ok := cmp.Or(cur, old).(*corev1.Pod)
	if !ok {
		return
	}
	ctx, end := c.event(cl, "Pod", old, cur)
	defer end()
	c.sendPod(ctx, cl, g, p, cur == nil)
	c.markAndFlush(ctx, cl, g, g.slicesServices(byPod, p.Namespace+"/"+p.Name)...)
}

// sendPod hands a Pod to the ServiceEntry registry, outside c.mu: the sink publishes itself.
// Both generations of caches send their Pods during a resync, until it retires the old one.
func (c *Controller) sendPod(ctx context.Context, cl *cluster, g *caches, p *corev1.Pod, deleted bool) {
	if c.sink == nil {
		return
	}
	cl.podMu.Lock()
	defer cl.podMu.Unlock()
	if !g.retired {
		c.sendPodLocked(ctx, cl, g, p, deleted)
	}
}

// sendPodLocked is sendPod with cl.podMu held.
func (c *Controller) sendPodLocked(ctx context.Context, cl *cluster, g *caches, p *corev1.Pod, deleted bool) {
	key := p.Namespace + "/" + p.Name
	if deleted || p.Status.PodIP == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		delete(cl.sent, key)
		c.sink.DeleteWorkload(ctx, cl.id, p.Namespace, p.Name)
		return
	}
	cl.sent[key] = struct{}{}
	w := serviceentry.Workload{
		ClusterID: cl.id, Namespace: p.Namespace, Name: p.Name, Address: p.Status.PodIP,
		Labels: p.Labels, ServiceAccount: p.Spec.ServiceAccountName, Network: cmp.Or(p.Labels[LabelNetwork], g.network()),
		Health: discoveryv1.Health_UNHEALTHY,
	}
	if podReady(p) {
		w.Health = discoveryv1.Health_HEALTHY
	}
	if p.Spec.NodeName != "" {
		n, _ := g.nodes.Get(p.Spec.NodeName)
		w.Locality = nodeLocality(n)
	}
	c.sink.SetWorkload(ctx, w)
}

func (c *Controller) onNode(cl *cluster, g *caches, old, cur any) {
	var o, n *corev1.Node
	o, _ = old.(*corev1.Node)
	n, _ = cur.(*corev1.Node)
	if o != nil && n != nil && proto.Equal(nodeLocality(o), nodeLocality(n)) {
		return
	}
	ctx, end := c.event(cl, "Node", old, cur)
	defer end()
	name := cmp.Or(n, o).Name
	keys := g.slicesServices(byNode, name)
	pods, _ := g.podIdx.ByIndex(byNode, name)
	for _, obj := range pods {
		if p, ok := obj.(*corev1.Pod); ok {
			c.sendPod(ctx, cl, g, p, false)
			keys = append(keys, g.slicesServices(byPod, p.Namespace+"/"+p.Name)...)
		}
	}
	c.markAndFlush(ctx, cl, g, keys...)
}

// onSystemNamespace recomputes every Service of cl when its default network changes.
func (c *Controller) onSystemNamespace(cl *cluster, g *caches, old, cur any) {
	var was, is string
	if o, ok := old.(*corev1.Namespace); ok {
		was = o.Labels[LabelNetwork]
	}
	if n, ok := cur.(*corev1.Namespace); ok {
		is = n.Labels[LabelNetwork]
	}
	if was == is {
		return
	}
	ctx, end := c.event(cl, "Namespaces", old, cur)
	defer end()
	var keys []svcKey
	svcs, _ := g.services.List(labels.Everything())
	for _, s := range svcs {
		keys = append(keys, svcKey{s.Namespace, s.Name})
	}
	pods, _ := g.pods.List(labels.Everything())
	for _, p := range pods {
		c.sendPod(ctx, cl, g, p, false)
	}
	c.markAndFlush(ctx, cl, g, keys...)
}

// syncSecret starts, restarts (kubeconfig changed) and stops the remote clusters of one Secret,
// by its namespace/name key, as the primary's current caches have it: each data key is a
// cluster ID, its value a kubeconfig. It reads the caches rather than taking an event's object,
// so that it can run for any key at any time (after an outage, for every Secret).
func (c *Controller) syncSecret(key string) {
	c.secretMu.Lock()
	defer c.secretMu.Unlock()
	c.mu.Lock()
	obj, exists, _ := c.primary.cur.secrets.GetByKey(key)
	c.mu.Unlock()
	want := map[string][]byte{}
	if s, ok := obj.(*corev1.Secret); ok && exists {
		for id, kc := range s.Data {
			if id == c.cfg.ClusterID {
				c.log.Warn("ignoring remote cluster with the primary's ID", "secret", key, "cluster", id)
				continue
			}
			want[id] = kc
		}
	}

	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return
	}
	var stop []*cluster
	start := map[string][]byte{}
	for id, cl := range c.bySecret[key] {
		if kc, ok := want[id]; !ok || hash(kc) != cl.hash {
			stop = append(stop, cl)
		}
	}
	for id, kc := range want {
		cur := c.clusters[id]
		if cur != nil && cur.secret == key && cur.hash == hash(kc) {
			continue
		}
		if cur != nil && cur.secret != key {
			c.log.Warn("remote cluster moved to another Secret", "cluster", id, "from", cur.secret, "to", key)
			stop = append(stop, cur)
		}
		start[id] = kc
	}
	for _, cl := range stop {
		c.removeCluster(cl)
	}
	c.mu.Unlock()

	for _, cl := range stop {
		c.log.Info("stopping remote cluster", "cluster", cl.id, "secret", cl.secret)
		cl.stop()
		c.forgetPods(cl)
	}
	for id, kc := range start {
		if err := c.addCluster(key, id, kc); err != nil {
			c.log.Error("cannot start remote cluster", "secret", key, "cluster", id, "err", err)
		}
	}
}

func hash(b []byte) string {
	h := sha256.Sum256(b)
	return string(h[:])
}

// removeCluster forgets cl and republishes what it contributed to; c.mu held.
func (c *Controller) removeCluster(cl *cluster) {
	if c.clusters[cl.id] == cl {
		delete(c.clusters, cl.id)
	}
	delete(c.bySecret[cl.secret], cl.id)
	if len(c.bySecret[cl.secret]) == 0 {
		delete(c.bySecret, cl.secret)
	}
	if c.synced && cl.synced {
		c.markCluster(cl)
		c.flush(context.Background())
	}
}

// forgetPods removes a stopped cluster's Pods from the ServiceEntry registry.
func (c *Controller) forgetPods(cl *cluster) {
	if c.sink == nil {
		return
	}
	cl.podMu.Lock()
	defer cl.podMu.Unlock()
	for key := range cl.sent {
		ns, name, _ := cache.SplitMetaNamespaceKey(key)
		c.sink.DeleteWorkload(context.Background(), cl.id, ns, name)
	}
	clear(cl.sent)
}

// resync, run when cl's API server answers again after an outage, replaces cl's informers with
// new ones (client-go's would relist only when their backoff, up to a minute, lets them) and,
// once the new ones listed everything, recomputes every Service either knows: the publisher
// gets only what changed, so nothing that still exists is deleted. The informers run under
// ctx; until cancels the wait for their first list.
func (c *Controller) resync(ctx, until context.Context, cl *cluster) error {
	g, err := c.newCaches(cl)
	if err != nil {
		return err
	}
	g.start(ctx)
	if !cache.WaitForCacheSync(until.Done(), g.hasSync...) {
		g.stop()
		return fmt.Errorf("cluster %s: new informers not synced: %w", cl.id, context.Cause(until))
	}

	c.mu.Lock()
	old := cl.cur
	cl.cur = g
	if c.synced && c.clusters[cl.id] == cl {
		c.markCaches(old)
		c.markCaches(g)
		c.flush(context.Background())
	}
	c.mu.Unlock()
	c.reconcilePods(cl, old, g)
	// old's handlers have no effect any more: stop it in the background (client-go takes
	// seconds to close its watches); cl.stop waits for it.
	cl.wg.Go(old.stop)
	if g.secrets != nil {
		// The Secrets changed or deleted during the outage.
		keys := map[string]bool{}
		for _, k := range g.secrets.ListKeys() {
			keys[k] = true
		}
		c.mu.Lock()
		for k := range c.bySecret {
			keys[k] = true
		}
		c.mu.Unlock()
		for k := range keys {
			c.syncSecret(k)
		}
	}
	return nil
}

// reconcilePods retires old, so that it sends no more Pods, and makes the ServiceEntry registry
// hold exactly g's Pods of cl: old may have sent a Pod that is gone, or a version older than g's.
func (c *Controller) reconcilePods(cl *cluster, old, g *caches) {
	if c.sink == nil {
		return
	}
	cl.podMu.Lock()
	defer cl.podMu.Unlock()
	old.retired = true
	for key := range cl.sent {
		ns, name, _ := cache.SplitMetaNamespaceKey(key)
		if p, err := g.pods.Pods(ns).Get(name); err == nil {
			c.sendPodLocked(context.Background(), cl, g, p, false)
		} else {
			delete(cl.sent, key)
			c.sink.DeleteWorkload(context.Background(), cl.id, ns, name)
		}
	}
}

func (c *Controller) addCluster(secret, id string, kubeconfig []byte) error {
	cfg, err := sharedkube.FromKubeconfig(kubeconfig)
	if err != nil {
		return err
	}
	cl, err := c.newCluster(id, secret, cfg)
	if err != nil {
		return err
	}
	cl.hash = hash(kubeconfig)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return nil
	}
	c.clusters[id] = cl
	if c.bySecret[secret] == nil {
		c.bySecret[secret] = map[string]*cluster{}
	}
	c.bySecret[secret][id] = cl
	// Started under c.mu so that shutdown, which takes it first, sees every started cluster.
	cl.start(c.ctx, c.clusterSynced, c.resync)
	c.log.Info("starting remote cluster", "cluster", id, "secret", secret, "host", cfg.Host)
	return nil
}

// orderedClusters lists the synced clusters, the primary first, then by ID; c.mu held.
func (c *Controller) orderedClusters() []*cluster {
	out := make([]*cluster, 0, len(c.clusters))
	for _, cl := range c.clusters {
		if cl.synced {
			out = append(out, cl)
		}
	}
	slices.SortFunc(out, func(a, b *cluster) int {
		if a == c.primary || b == c.primary {
			return cmp.Compare(boolInt(b == c.primary), boolInt(a == c.primary))
		}
		return cmp.Compare(a.id, b.id)
	})
	return out
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// flush recomputes the dirty Services and publishes what changed: at most one Upsert and one
// Delete per type, Services before Endpoints, in the trace of ctx (changetrace.Publisher); c.mu
// held.
func (c *Controller) flush(ctx context.Context) {
	if len(c.dirty) == 0 {
		return
	}
	keys := slices.SortedFunc(maps.Keys(c.dirty), func(a, b svcKey) int {
		return cmp.Or(cmp.Compare(a.namespace, b.namespace), cmp.Compare(a.name, b.name))
	})
	clear(c.dirty)
	clusters := c.orderedClusters()
	var upSvc, upEps []*bus.Resource
	var delSvc, delEps []string
	for _, k := range keys {
		svc, eps := c.compute(clusters, k)
		if svc == nil {
			if old, ok := c.services[k]; ok {
				delete(c.services, k)
				delSvc = append(delSvc, schema.Name(k.namespace, old.Hostname))
			}
			if old, ok := c.endpoints[k]; ok {
				delete(c.endpoints, k)
				delEps = append(delEps, schema.Name(k.namespace, old.Hostname))
			}
			continue
		}
		name := schema.Name(k.namespace, svc.Hostname)
		if old, ok := c.services[k]; !ok || !proto.Equal(old, svc) {
			c.services[k] = svc
			upSvc = append(upSvc, &bus.Resource{Name: name, Body: svc})
		}
		if old, ok := c.endpoints[k]; !ok || !proto.Equal(old, eps) {
			c.endpoints[k] = eps
			upEps = append(upEps, &bus.Resource{Name: name, Body: eps})
		}
	}
	pub := changetrace.Publisher(ctx, c.pub)
	if len(upSvc) > 0 {
		pub.Upsert(schema.Service.TypeURL, upSvc...)
	}
	if len(delSvc) > 0 {
		pub.Delete(schema.Service.TypeURL, delSvc...)
	}
	if len(upEps) > 0 {
		pub.Upsert(schema.Endpoints.TypeURL, upEps...)
	}
	if len(delEps) > 0 {
		pub.Delete(schema.Endpoints.TypeURL, delEps...)
	}
}

// compute merges one Service across clusters: the first cluster that has it (the primary
// when it does) gives addresses, labels, resolution and exportTo; ports are the union by name;
// endpoints are every cluster's, then the WorkloadEntries the first one's selector selects.
func (c *Controller) compute(clusters []*cluster, k svcKey) (*discoveryv1.Service, *discoveryv1.Endpoints) {
	type part struct {
		cl  *cluster
		svc *corev1.Service
	}
	var parts []part
	for _, cl := range clusters {
		if s, err := cl.cur.services.Services(k.namespace).Get(k.name); err == nil {
			parts = append(parts, part{cl, s})
		}
	}
	if len(parts) == 0 {
		return nil, nil
	}
	hostname := Hostname(k.name, k.namespace, c.cfg.ClusterDomain)
	svc := convertService(parts[0].svc, hostname, parts[0].cl.id)
	for _, p := range parts[1:] {
		// Each cluster's gateway Service is its own network's gateway.
		svc.NetworkGateways = append(svc.NetworkGateways, networkGateways(p.svc, p.cl.id)...)
		for _, port := range convertPorts(p.svc) {
			if !slices.ContainsFunc(svc.Ports, func(q *discoveryv1.Port) bool { return q.Name == port.Name }) {
				svc.Ports = append(svc.Ports, port)
			}
		}
	}
	eps := &discoveryv1.Endpoints{Hostname: hostname, Namespace: k.namespace}
	for _, p := range parts {
		eps.Endpoints = append(eps.Endpoints, clusterEndpoints(p.cl, p.svc)...)
	}
	if sel := parts[0].svc.Spec.Selector; c.wes != nil && len(sel) > 0 {
		for _, w := range c.wes.SelectWorkloadEntries(k.namespace, sel) {
			eps.Endpoints = append(eps.Endpoints, c.bindWorkloadEntry(w, svc.Ports))
		}
	}
	return svc, eps
}

// bindWorkloadEntry makes the endpoint of a WorkloadEntry a Service selects; its port for each
// service port is, as in istiod, the WE's port of that name, else the targetPort, else the port.
func (c *Controller) bindWorkloadEntry(w serviceentry.Workload, ports []*discoveryv1.Port) *discoveryv1.Endpoint {
	ep := &discoveryv1.Endpoint{
		Address: w.Address, Labels: w.Labels, ServiceAccount: w.ServiceAccount, Locality: w.Locality,
		Weight: w.Weight, Health: w.Health, ClusterId: cmp.Or(w.ClusterID, c.cfg.ClusterID),
		Network: w.Network, Workload: w.Name, Ports: make(map[string]uint32, len(ports)),
	}
	for _, p := range ports {
		ep.Ports[p.Name] = cmp.Or(w.Ports[p.Name], p.TargetPort, p.Number)
	}
	return ep
}

// clusterEndpoints lists one cluster's endpoints of a Service by address: from its
// EndpointSlices, or its external name.
func clusterEndpoints(cl *cluster, svc *corev1.Service) []*discoveryv1.Endpoint {
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		if svc.Spec.ExternalName == "" {
			return nil
		}
		ep := &discoveryv1.Endpoint{Address: svc.Spec.ExternalName, ClusterId: cl.id, Ports: map[string]uint32{}}
		for _, p := range svc.Spec.Ports {
			ep.Ports[p.Name] = uint32(p.Port)
		}
		return []*discoveryv1.Endpoint{ep}
	}
	objs, _ := cl.cur.slices.ByIndex(bySlicedService, svc.Namespace+"/"+svc.Name)
	byAddr := map[string]*discoveryv1.Endpoint{}
	for _, o := range objs {
		s, ok := o.(*discovery.EndpointSlice)
		if !ok {
			continue
		}
		for i := range s.Endpoints {
			e := &s.Endpoints[i]
			for _, addr := range e.Addresses {
				if have := byAddr[addr]; have != nil {
					// An address in two slices (mid-migration) keeps one endpoint with every port.
					for _, p := range s.Ports {
						if p.Port != nil {
							if _, ok := have.Ports[deref(p.Name)]; !ok {
								have.Ports[deref(p.Name)] = uint32(*p.Port)
							}
						}
					}
					continue
				}
				if ep := sliceEndpoint(cl, s, e, addr); ep != nil {
					byAddr[addr] = ep
				}
			}
		}
	}
	return slices.SortedFunc(maps.Values(byAddr), func(a, b *discoveryv1.Endpoint) int {
		return cmp.Compare(a.Address, b.Address)
	})
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// sliceEndpoint makes the endpoint of one address of an EndpointSlice endpoint, completed from
// its Pod (labels, service account, name) and the Pod's Node (locality). It is nil while the
// Pod it names is not in the cache, as in istiod: its labels and identity are unknown until
// then, and the Pod's arrival recomputes the Service (onPod, through the byPod index).
func sliceEndpoint(cl *cluster, s *discovery.EndpointSlice, e *discovery.Endpoint, addr string) *discoveryv1.Endpoint {
	ep := &discoveryv1.Endpoint{
		Address:   addr,
		Ports:     make(map[string]uint32, len(s.Ports)),
		Health:    Health(e.Conditions),
		ClusterId: cl.id,
	}
	for _, p := range s.Ports {
		if p.Port != nil {
			ep.Ports[deref(p.Name)] = uint32(*p.Port)
		}
	}
	nodeName := deref(e.NodeName)
	if r := e.TargetRef; r != nil && r.Kind == "Pod" {
		pod, err := cl.cur.pods.Pods(refNamespace(r, s.Namespace)).Get(r.Name)
		if err != nil {
			return nil
		}
		// Shared with the informer cache, which never modifies it; published resources are
		// immutable too.
		ep.Labels = pod.Labels
		ep.ServiceAccount = pod.Spec.ServiceAccountName
		ep.Network = cmp.Or(pod.Labels[LabelNetwork], cl.cur.network())
		nodeName = cmp.Or(nodeName, pod.Spec.NodeName)
		ep.Workload = r.Name
		if pod.Spec.Subdomain != "" {
			ep.PodDnsName = cmp.Or(pod.Spec.Hostname, pod.Name) + "." + pod.Spec.Subdomain
		}
	}
	if nodeName != "" {
		if n, err := cl.cur.nodes.Get(nodeName); err == nil {
			ep.Locality = nodeLocality(n)
		}
	}
	if ep.Locality == nil && deref(e.Zone) != "" {
		ep.Locality = &discoveryv1.Locality{Zone: *e.Zone}
	}
	return ep
}
