package kube

import (
	"context"
	"fmt"
	"net/http"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listerv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	sharedkube "sailplane.dev/shared/kube"
)

// Indexes on the informers' caches, so that one change finds what it affects without a scan.
const (
	bySlicedService = "service" // EndpointSlice -> "ns/service"
	byPod           = "pod"     // EndpointSlice -> "ns/pod" of each Pod endpoint
	byNode          = "node"    // EndpointSlice and Pod -> node names
)

// cluster is one Kubernetes cluster: its clients and its informers. Its fields are set before
// its informers start and never change, but for cur and synced, guarded by the Controller's
// mutex.
type cluster struct {
	id string
	// secret and hash identify the Secret key and kubeconfig of a remote cluster; both empty
	// for the primary.
	secret, hash string

	http    *http.Client
	client  kubernetes.Interface
	outages *sharedkube.Outages

	cur      *caches       // the informers in use: replaced after an API server outage
	synced   bool          // the first caches synced
	syncedCh chan struct{} // closed once the first caches synced
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	podMu sync.Mutex
	// sent holds the "namespace/name" of each Pod handed to the WorkloadSink, so that the
	// Pods deleted during an outage, or of a stopped cluster, are removed from it.
	sent map[string]struct{}
}

// caches is one generation of a cluster's informers, with the Controller's handlers.
type caches struct {
	factory  informers.SharedInformerFactory
	services listerv1.ServiceLister
	pods     listerv1.PodLister
	nodes    listerv1.NodeLister
	slices   cache.Indexer
	podIdx   cache.Indexer
	// secrets are the remote-cluster Secrets, on the primary only (nil on remote clusters).
	secrets  cache.Indexer
	secretsF informers.SharedInformerFactory
	// sysNS holds the control plane's namespace of this cluster, whose network label names
	// the network of the cluster's endpoints that have none of their own.
	sysNS   cache.Indexer
	sysNSF  informers.SharedInformerFactory
	hasSync []cache.InformerSynced
	cancel  context.CancelFunc
	retired bool // replaced: sends no more Pods; guarded by cluster.podMu
}

// newCluster builds the clients and informers of one cluster; nothing runs before start.
// secret is the Secret registering a remote cluster, empty for the primary.
func (c *Controller) newCluster(id, secret string, cfg *rest.Config) (*cluster, error) {
	cfg = rest.CopyConfig(cfg)
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 100, 200
	}
	outages := sharedkube.NewOutages(cfg.Host, c.log.With("cluster", id))
	cfg.Wrap(outages.Wrap)
	sharedkube.CountWatchErrors(cfg, c.meters, attribute.String("cluster", id))
	// Our own HTTP client, so that stopping a cluster closes its connections (client-go's
	// shared transport cache would keep them open for the life of the process).
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("cluster %s: http client: %w", id, err)
	}
	client, err := kubernetes.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, fmt.Errorf("cluster %s: client: %w", id, err)
	}
	cl := &cluster{id: id, secret: secret, http: hc, client: client, outages: outages, syncedCh: make(chan struct{}), sent: map[string]struct{}{}}
	if cl.cur, err = c.newCaches(cl); err != nil {
		return nil, err
	}
	return cl, nil
}

// newCaches builds a generation of cl's informers with the Controller's handlers.
func (c *Controller) newCaches(cl *cluster) (*caches, error) {
	opts := []informers.SharedInformerOption{informers.WithTransform(transform)}
	scoped := c.cfg.WatchNamespace != "" && cl.secret == ""
	if scoped {
		opts = append(opts, informers.WithNamespace(c.cfg.WatchNamespace))
	}
	f := informers.NewSharedInformerFactoryWithOptions(cl.client, 0, opts...)
	g := &caches{factory: f, cancel: func() {}}
	svcInf := f.Core().V1().Services()
	podInf := f.Core().V1().Pods()
	nodeInf := f.Core().V1().Nodes()
	sliceInf := f.Discovery().V1().EndpointSlices()
	if err := sliceInf.Informer().AddIndexers(cache.Indexers{
		bySlicedService: sliceServiceIndex, byPod: slicePodIndex, byNode: sliceNodeIndex,
	}); err != nil {
		return nil, fmt.Errorf("cluster %s: %w", cl.id, err)
	}
	if err := podInf.Informer().AddIndexers(cache.Indexers{byNode: podNodeIndex}); err != nil {
		return nil, fmt.Errorf("cluster %s: %w", cl.id, err)
	}
	g.services, g.pods = svcInf.Lister(), podInf.Lister()
	if scoped {
		// Nodes are cluster-scoped: an empty cache in their place (the factory starts only the
		// informers asked for), so no endpoint has a node's locality.
		g.nodes = listerv1.NewNodeLister(cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}))
	} else {
		g.nodes = nodeInf.Lister()
	}
	g.slices, g.podIdx = sliceInf.Informer().GetIndexer(), podInf.Informer().GetIndexer()
	if cl.secret == "" {
		if err := c.watchSecrets(cl, g); err != nil {
			return nil, err
		}
	}

	if !scoped {
		if err := c.watchSystemNamespace(cl, g); err != nil {
			return nil, err
		}
	}

	// Each informer's events count in istiod's pilot_k8s_reg_events, under istiod's type names.
	reg := []struct {
		inf cache.SharedIndexInformer
		h   cache.ResourceEventHandlerFuncs
	}{
		{svcInf.Informer(), c.events.Counted("Services", cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { c.onService(cl, g, nil, o) },
			UpdateFunc: func(o, n any) { c.onService(cl, g, o, n) },
			DeleteFunc: func(o any) { c.onService(cl, g, untomb(o), nil) },
		})},
		{sliceInf.Informer(), c.events.Counted("EndpointSlice", cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { c.onSlice(cl, g, nil, o) },
			UpdateFunc: func(o, n any) { c.onSlice(cl, g, o, n) },
			DeleteFunc: func(o any) { c.onSlice(cl, g, untomb(o), nil) },
		})},
		{podInf.Informer(), c.events.Counted("Pods", cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { c.onPod(cl, g, nil, o) },
			UpdateFunc: func(o, n any) { c.onPod(cl, g, o, n) },
			DeleteFunc: func(o any) { c.onPod(cl, g, untomb(o), nil) },
		})},
	}
	if !scoped {
		reg = append(reg, struct {
			inf cache.SharedIndexInformer
			h   cache.ResourceEventHandlerFuncs
		}{nodeInf.Informer(), c.events.Counted("Nodes", cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { c.onNode(cl, g, nil, o) },
			UpdateFunc: func(o, n any) { c.onNode(cl, g, o, n) },
			DeleteFunc: func(o any) { c.onNode(cl, g, untomb(o), nil) },
		})})
	}
	for _, r := range reg {
		// Say in our log, where an operator looks, instead of only in klog's.
		if err := r.inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, rf *cache.Reflector, err error) {
			c.log.Warn("kubernetes watch failed; retrying",
				"cluster", cl.id, "resource", rf.TypeDescription(), "error", err)
			cache.DefaultWatchErrorHandler(ctx, rf, err)
		}); err != nil {
			return nil, fmt.Errorf("cluster %s: %w", cl.id, err)
		}
		h, err := r.inf.AddEventHandler(r.h)
		if err != nil {
			return nil, fmt.Errorf("cluster %s: %w", cl.id, err)
		}
		// The registration's HasSynced also waits until the handler saw every initial object,
		// so that Pods are handed to the ServiceEntry index before the cluster counts as synced.
		g.hasSync = append(g.hasSync, h.HasSynced)
	}
	return g, nil
}

// watchSystemNamespace adds to the caches the cluster's control-plane namespace (only it: the
// RBAC rule names it), for its topology.istio.io/network label: the network, as in istiod, of
// the cluster's endpoints whose Pod has no such label.
func (c *Controller) watchSystemNamespace(cl *cluster, g *caches) error {
	g.sysNSF = informers.NewSharedInformerFactoryWithOptions(cl.client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = "metadata.name=" + c.cfg.Namespace }))
	inf := g.sysNSF.Core().V1().Namespaces().Informer()
	g.sysNS = inf.GetIndexer()
	h, err := inf.AddEventHandler(c.events.Counted("Namespaces", cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { c.onSystemNamespace(cl, g, nil, o) },
		UpdateFunc: func(o, n any) { c.onSystemNamespace(cl, g, o, n) },
		DeleteFunc: func(o any) { c.onSystemNamespace(cl, g, untomb(o), nil) },
	}))
	if err != nil {
		return fmt.Errorf("cluster %s: %w", cl.id, err)
	}
	g.hasSync = append(g.hasSync, h.HasSynced)
	return nil
}

// network is the cluster's default network: its control-plane namespace's network label.
func (g *caches) network() string {
	if g.sysNS == nil {
		return ""
	}
	for _, o := range g.sysNS.List() {
		if ns, ok := o.(*corev1.Namespace); ok {
			return ns.Labels[LabelNetwork]
		}
	}
	return ""
}

// watchSecrets adds to the primary's caches the Secrets registering remote clusters.
func (c *Controller) watchSecrets(cl *cluster, g *caches) error {
	g.secretsF = informers.NewSharedInformerFactoryWithOptions(cl.client, 0,
		informers.WithNamespace(c.cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = LabelMultiCluster + "=true" }))
	inf := g.secretsF.Core().V1().Secrets().Informer()
	g.secrets = inf.GetIndexer()
	key := func(o any) {
		if k, err := cache.DeletionHandlingMetaNamespaceKeyFunc(o); err == nil {
			c.syncSecret(k)
		}
	}
	h, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    key,
		UpdateFunc: func(_, n any) { key(n) },
		DeleteFunc: key,
	})
	if err != nil {
		return fmt.Errorf("cluster %s: %w", cl.id, err)
	}
	g.hasSync = append(g.hasSync, h.HasSynced)
	return nil
}

func (g *caches) start(ctx context.Context) {
	ctx, g.cancel = context.WithCancel(ctx)
	g.factory.Start(ctx.Done())
	if g.sysNSF != nil {
		g.sysNSF.Start(ctx.Done())
	}
	if g.secretsF != nil {
		g.secretsF.Start(ctx.Done())
	}
}

// stop stops the informers and waits until none of their handlers runs any more.
func (g *caches) stop() {
	g.cancel()
	g.factory.Shutdown()
	if g.sysNSF != nil {
		g.sysNSF.Shutdown()
	}
	if g.secretsF != nil {
		g.secretsF.Shutdown()
	}
}

// start runs the informers until stop; onSynced is called once the caches synced. From then
// on, an API server outage ends with resync as soon as the server answers again.
func (cl *cluster) start(ctx context.Context, onSynced func(*cluster), resync func(ctx, until context.Context, cl *cluster) error) {
	ctx, cl.cancel = context.WithCancel(ctx)
	first := cl.cur
	first.start(ctx)
	cl.wg.Go(func() {
		if !cache.WaitForCacheSync(ctx.Done(), first.hasSync...) {
			return
		}
		onSynced(cl)
		close(cl.syncedCh)
		cl.outages.Run(ctx, cl.client.Discovery().RESTClient(), func(until context.Context) error {
			return resync(ctx, until, cl)
		})
	})
}

// stop stops the informers and waits until none of their handlers runs any more.
func (cl *cluster) stop() {
	if cl.cancel != nil {
		cl.cancel()
	}
	cl.wg.Wait() // no resync runs any more, old caches stopped: cur is stable
	cl.cur.stop()
	cl.http.CloseIdleConnections()
}

func sliceServiceIndex(obj any) ([]string, error) {
	s, ok := obj.(*discovery.EndpointSlice)
	if !ok || s.Labels[discovery.LabelServiceName] == "" {
		return nil, nil
	}
	return []string{s.Namespace + "/" + s.Labels[discovery.LabelServiceName]}, nil
}

func slicePodIndex(obj any) ([]string, error) {
	s, ok := obj.(*discovery.EndpointSlice)
	if !ok {
		return nil, nil
	}
	var out []string
	for _, e := range s.Endpoints {
		if r := e.TargetRef; r != nil && r.Kind == "Pod" {
			out = append(out, refNamespace(r, s.Namespace)+"/"+r.Name)
		}
	}
	return out, nil
}

func sliceNodeIndex(obj any) ([]string, error) {
	s, ok := obj.(*discovery.EndpointSlice)
	if !ok {
		return nil, nil
	}
	var out []string
	for _, e := range s.Endpoints {
		if e.NodeName != nil && *e.NodeName != "" {
			out = append(out, *e.NodeName)
		}
	}
	return out, nil
}

func podNodeIndex(obj any) ([]string, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok || p.Spec.NodeName == "" {
		return nil, nil
	}
	return []string{p.Spec.NodeName}, nil
}

func refNamespace(r *corev1.ObjectReference, def string) string {
	if r.Namespace != "" {
		return r.Namespace
	}
	return def
}
