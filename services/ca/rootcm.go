package ca

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/mesh"
	"sailplane.dev/shared/schema"
)

// Istio's names for the trust bundle workloads mount in every namespace.
const (
	RootCertConfigMap = "istio-ca-root-cert"
	RootCertKey       = "root-cert.pem"
)

// systemNamespaces never get the ConfigMap, as with istiod (which writes kube-system, for
// ztunnel).
var systemNamespaces = map[string]bool{"kube-public": true, "kube-node-lease": true, "local-path-storage": true}

// rootCertLabels are the labels istiod gives the ConfigMap.
var rootCertLabels = map[string]string{"istio.io/config": "true"}

// rootCertController keeps istio-ca-root-cert, holding the roots, in every namespace the mesh
// watches (all but Kubernetes' own, or the mesh config's discoverySelectors; the ca's and the
// root namespace always), restoring it when edited or deleted.
type rootCertController struct {
	kube      kubernetes.Interface
	log       *slog.Logger
	namespace string // the ca's: always written

	mu        sync.Mutex
	roots     string // follows a root rotation
	selectors []labels.Selector
	rootNS    string

	nsLister corelisters.NamespaceLister
	cmLister corelisters.ConfigMapLister
	queue    workqueue.TypedRateLimitingInterface[string]
}

// runRootCertController runs until ctx ends. meshSrc, when set, carries the MeshConfig (its
// discoverySelectors); without it every namespace is written. The roots are the ca's, followed
// through a rotation.
func (s *Service) runRootCertController(ctx context.Context, meshSrc bus.Source) error {
	c := &rootCertController{
		kube: s.kube, log: s.log.With("configmap", RootCertConfigMap), roots: string(s.RootsPEM()), namespace: s.cfg.Namespace,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](100*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "root-cert-configmaps"}),
	}
	defer c.queue.ShutDown()

	nsFactory := informers.NewSharedInformerFactory(s.kube, 0)
	// Only the ConfigMaps of that name are cached, not every ConfigMap of the cluster.
	cmFactory := informers.NewSharedInformerFactoryWithOptions(s.kube, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = "metadata.name=" + RootCertConfigMap }))
	nsInf, cmInf := nsFactory.Core().V1().Namespaces(), cmFactory.Core().V1().ConfigMaps()
	c.nsLister, c.cmLister = nsInf.Lister(), cmInf.Lister()
	enqueueNS := func(obj any) {
		if ns, ok := obj.(*corev1.Namespace); ok {
			c.queue.Add(ns.Name)
		}
	}
	if _, err := nsInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueueNS, UpdateFunc: func(_, obj any) { enqueueNS(obj) },
	}); err != nil {
		return err
	}
	enqueueCM := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			c.queue.Add(cm.Namespace)
		}
	}
	if _, err := cmInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueueCM, UpdateFunc: func(_, obj any) { enqueueCM(obj) }, DeleteFunc: enqueueCM,
	}); err != nil {
		return err
	}
	nsFactory.Start(ctx.Done())
	cmFactory.Start(ctx.Done())
	defer nsFactory.Shutdown()
	defer cmFactory.Shutdown()

	var wg sync.WaitGroup
	defer wg.Wait()
	if meshSrc != nil {
		// The bus is read before any namespace is written, so namespaces the selectors leave out
		// are not written in between.
		synced := make(chan struct{})
		h := &meshHandler{c: c, synced: synced}
		wg.Go(func() {
			if err := meshSrc.Subscribe(ctx, []string{schema.MeshConfig.TypeURL}, h); err != nil && ctx.Err() == nil {
				c.log.Error("mesh config subscription ended", "error", err)
			}
		})
		select {
		case <-ctx.Done():
			return nil
		case <-synced:
		}
	}
	if !cache.WaitForCacheSync(ctx.Done(), nsInf.Informer().HasSynced, cmInf.Informer().HasSynced) {
		return nil
	}
	c.enqueueAll()
	c.log.Info("keeping the trust bundle ConfigMap in the mesh's namespaces")
	wg.Go(func() {
		for {
			s.mu.Lock()
			rotated := s.rotated
			s.mu.Unlock()
			if roots := string(s.RootsPEM()); roots != c.currentRoots() {
				c.mu.Lock()
				c.roots = roots
				c.mu.Unlock()
				c.log.Info("the roots changed: rewriting the trust bundle ConfigMaps")
				c.enqueueAll()
			}
			select {
			case <-ctx.Done():
				return
			case <-rotated:
			}
		}
	})
	wg.Go(func() {
		<-ctx.Done()
		c.queue.ShutDown()
	})
	for {
		ns, shutdown := c.queue.Get()
		if shutdown {
			return nil
		}
		if err := c.reconcile(ctx, ns); err != nil && ctx.Err() == nil {
			c.log.Warn("cannot write the trust bundle ConfigMap; retrying", "namespace", ns, "error", err)
			c.queue.AddRateLimited(ns)
		} else {
			c.queue.Forget(ns)
		}
		c.queue.Done(ns)
	}
}

func (c *rootCertController) enqueueAll() {
	all, _ := c.nsLister.List(labels.Everything())
	for _, ns := range all {
		c.queue.Add(ns.Name)
	}
}

func (c *rootCertController) currentRoots() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.roots
}

func (c *rootCertController) selected(ns *corev1.Namespace) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return ns.Name == c.namespace || ns.Name == c.rootNS || mesh.Selected(c.selectors, ns.Labels)
}

// reconcile makes the namespace's ConfigMap hold exactly the roots, when the mesh watches it.
func (c *rootCertController) reconcile(ctx context.Context, name string) error {
	ns, err := c.nsLister.Get(name)
	if apierrors.IsNotFound(err) || (err == nil && ns.Status.Phase == corev1.NamespaceTerminating) {
		return nil
	}
	if err != nil {
		return err
	}
	if systemNamespaces[name] || !c.selected(ns) {
		return nil
	}
	roots := c.currentRoots()
	cms := c.kube.CoreV1().ConfigMaps(name)
	cm, err := c.cmLister.ConfigMaps(name).Get(RootCertConfigMap)
	switch {
	case apierrors.IsNotFound(err):
		_, err := cms.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: RootCertConfigMap, Namespace: name, Labels: rootCertLabels},
			Data:       map[string]string{RootCertKey: roots},
		}, metav1.CreateOptions{})
		switch {
		case err == nil:
			c.log.Info("wrote the trust bundle", "namespace", name)
		case apierrors.IsAlreadyExists(err), apierrors.IsNotFound(err),
			apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause):
			// Created meanwhile (its event brings it back here), or the namespace is going away.
			return nil
		}
		return err
	case err != nil:
		return err
	}
	if cm.Data[RootCertKey] == roots {
		return nil
	}
	// As istiod: only the key is corrected; other keys someone added are kept.
	fixed := cm.DeepCopy()
	if fixed.Data == nil {
		fixed.Data = map[string]string{}
	}
	fixed.Data[RootCertKey] = roots
	if _, err := cms.Update(ctx, fixed, metav1.UpdateOptions{}); err != nil {
		return err
	}
	c.log.Info("updated the trust bundle", "namespace", name)
	return nil
}

// meshHandler follows the MeshConfig's discoverySelectors and root namespace.
type meshHandler struct {
	c      *rootCertController
	synced chan struct{}
	once   sync.Once
}

func (h *meshHandler) Apply(ch bus.Change) error {
	for _, r := range ch.Updated {
		m, ok := r.Body.(*meshv1alpha1.MeshConfig)
		if !ok {
			return fmt.Errorf("MeshConfig %s: body is %T", r.Name, r.Body)
		}
		sels, err := mesh.DiscoverySelectors(m)
		if err != nil {
			return fmt.Errorf("MeshConfig %s: %w", r.Name, err)
		}
		h.c.mu.Lock()
		h.c.selectors, h.c.rootNS = sels, m.GetRootNamespace()
		h.c.mu.Unlock()
		if h.c.nsLister != nil {
			select {
			case <-h.synced:
				h.c.enqueueAll() // selectors changed: newly selected namespaces get it
			default:
			}
		}
	}
	return nil
}

func (h *meshHandler) Synced() { h.once.Do(func() { close(h.synced) }) }
