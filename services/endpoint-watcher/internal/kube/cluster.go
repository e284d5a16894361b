package kube

import (
	"context"
	"fmt"
	"net/http"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listerv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Indexes on the informers' caches, so that one change finds what it affects without a scan.
const (
	bySlicedService = "service" // EndpointSlice -> "ns/service"
	byPod           = "pod"     // EndpointSlice -> "ns/pod" of each Pod endpoint
	byNode          = "node"    // EndpointSlice and Pod -> node names
)

// cluster is one Kubernetes cluster's informers. Its fields are set before its informers start
// and never change; synced is guarded by the Controller's mutex.
type cluster struct {
	id string
	// secret and hash identify the Secret key and kubeconfig of a remote cluster; both empty
	// for the primary.
	secret, hash string

	http     *http.Client
	client   kubernetes.Interface
	factory  informers.SharedInformerFactory
	services listerv1.ServiceLister
	pods     listerv1.PodLister
	nodes    listerv1.NodeLister
	slices   cache.Indexer
	podIdx   cache.Indexer
	hasSync  []cache.InformerSynced

	synced   bool          // guarded by Controller.mu
	syncedCh chan struct{} // closed once the caches synced
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

// newCluster builds the clients and informers of one cluster; nothing runs before start.
func newCluster(id string, cfg *rest.Config) (*cluster, error) {
	cfg = rest.CopyConfig(cfg)
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 100, 200
	}
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
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(transform))
	cl := &cluster{id: id, http: hc, client: client, factory: f, syncedCh: make(chan struct{})}

	svcInf := f.Core().V1().Services()
	podInf := f.Core().V1().Pods()
	nodeInf := f.Core().V1().Nodes()
	sliceInf := f.Discovery().V1().EndpointSlices()
	if err := sliceInf.Informer().AddIndexers(cache.Indexers{
		bySlicedService: sliceServiceIndex, byPod: slicePodIndex, byNode: sliceNodeIndex,
	}); err != nil {
		return nil, fmt.Errorf("cluster %s: %w", id, err)
	}
	if err := podInf.Informer().AddIndexers(cache.Indexers{byNode: podNodeIndex}); err != nil {
		return nil, fmt.Errorf("cluster %s: %w", id, err)
	}
	cl.services, cl.pods, cl.nodes = svcInf.Lister(), podInf.Lister(), nodeInf.Lister()
	cl.slices, cl.podIdx = sliceInf.Informer().GetIndexer(), podInf.Informer().GetIndexer()
	return cl, nil
}

// handlers registers the Controller's handlers on the cluster's informers.
func (cl *cluster) handlers(c *Controller) error {
	f := cl.factory
	reg := []struct {
		inf cache.SharedIndexInformer
		h   cache.ResourceEventHandlerFuncs
	}{
		{f.Core().V1().Services().Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { c.onService(cl, nil, o) },
			UpdateFunc: func(o, n any) { c.onService(cl, o, n) },
			DeleteFunc: func(o any) { c.onService(cl, untomb(o), nil) },
		}},
		{f.Discovery().V1().EndpointSlices().Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { c.onSlice(cl, nil, o) },
			UpdateFunc: func(o, n any) { c.onSlice(cl, o, n) },
			DeleteFunc: func(o any) { c.onSlice(cl, untomb(o), nil) },
		}},
		{f.Core().V1().Pods().Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { c.onPod(cl, o, false) },
			UpdateFunc: func(_, n any) { c.onPod(cl, n, false) },
			DeleteFunc: func(o any) { c.onPod(cl, untomb(o), true) },
		}},
		{f.Core().V1().Nodes().Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { c.onNode(cl, nil, o) },
			UpdateFunc: func(o, n any) { c.onNode(cl, o, n) },
			DeleteFunc: func(o any) { c.onNode(cl, untomb(o), nil) },
		}},
	}
	for _, r := range reg {
		// client-go retries failed watches on its own backoff; say so in our log, where an
		// operator looks, instead of only in klog's.
		if err := r.inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, rf *cache.Reflector, err error) {
			c.log.Warn("kubernetes watch failed; client-go retries with backoff",
				"cluster", cl.id, "resource", rf.TypeDescription(), "error", err)
			cache.DefaultWatchErrorHandler(ctx, rf, err)
		}); err != nil {
			return fmt.Errorf("cluster %s: %w", cl.id, err)
		}
		h, err := r.inf.AddEventHandler(r.h)
		if err != nil {
			return fmt.Errorf("cluster %s: %w", cl.id, err)
		}
		// The registration's HasSynced also waits until the handler saw every initial object,
		// so that Pods are handed to the ServiceEntry index before the cluster counts as synced.
		cl.hasSync = append(cl.hasSync, h.HasSynced)
	}
	return nil
}

// start runs the informers until stop; onSynced is called once the caches synced.
func (cl *cluster) start(ctx context.Context, onSynced func(*cluster)) {
	ctx, cl.cancel = context.WithCancel(ctx)
	cl.factory.Start(ctx.Done())
	cl.wg.Go(func() {
		if cache.WaitForCacheSync(ctx.Done(), cl.hasSync...) {
			onSynced(cl)
			close(cl.syncedCh)
		}
	})
}

// stop stops the informers and waits until none of their handlers runs any more.
func (cl *cluster) stop() {
	if cl.cancel != nil {
		cl.cancel()
	}
	cl.factory.Shutdown()
	cl.wg.Wait()
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
