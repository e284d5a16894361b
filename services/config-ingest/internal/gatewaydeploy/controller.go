// Package gatewaydeploy deploys the Envoy gateways of Kubernetes Gateways, as istiod's gateway
// deployment controller does: a Gateway of a class Sailplane serves (controller
// istio.io/gateway-controller or sailplane.dev/gateway-controller), without addresses naming
// an existing Service, gets a ServiceAccount, a Deployment whose pods Sailplane's webhook
// injects with the `gateway` template, a Service with its listeners' ports, and, when its
// customization asks, an HPA and a PDB. The objects are server-side applied, owned by the
// Gateway, and removed when the Gateway no longer needs them. Only the elected replica writes.
package gatewaydeploy

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	gwinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions"
	gwlisters "sigs.k8s.io/gateway-api/pkg/client/listers/apis/v1"

	"sailplane.dev/shared/gatewayapi"
	"sailplane.dev/shared/revision"
)

// FieldManager is the server-side apply field manager of the generated objects: istiod's, so
// that a cluster moving from istiod to Sailplane has its gateways' fields taken over whole and
// what istiod set that Sailplane does not is removed, instead of lingering under a second
// manager (istiod renders the pod itself; Sailplane's webhook injects it).
const FieldManager = "istio.io/gateway-controller"

var configMapsGVR = corev1.SchemeGroupVersion.WithResource("configmaps")

// Config configures a Controller.
type Config struct {
	// Namespace is the control plane's namespace, where class-default ConfigMaps (labelled
	// ClassDefaultsLabel) live; "istio-system" when empty.
	Namespace string
	// Leader reports whether this replica may write; nil: always.
	Leader func() bool
	// Selected reports whether a namespace is in the mesh (the discoverySelectors); a Gateway
	// of another namespace is left alone, its objects included, as istiod ignores it. nil: all.
	Selected func(namespace string) bool
	// Owner, when set, says which istio.io/rev values (on a Gateway, else its namespace) are
	// this revision's: another revision's Gateways are left to it. nil: the default revision's.
	// Call Elected when its answers change.
	Owner revision.Owner
	// Ready, when set, is waited for before any write: closed once Selected is meaningful
	// (config-ingest's first sync, the mesh config read).
	Ready <-chan struct{}
	// OnOwnedChange, when set, is called (without blocking) whenever a generated object
	// changes, or why a Gateway is not deployed (Problem): the Gateway status follows its
	// Service's address, its Deployment's readiness and its parameters' validity.
	OnOwnedChange func()
	Logger        *slog.Logger
}

// Controller is the gateway deployment controller.
type Controller struct {
	cfg   Config
	log   *slog.Logger
	kube  kubernetes.Interface
	dyn   dynamic.Interface
	queue workqueue.TypedRateLimitingInterface[types.NamespacedName]

	gwFactory   gwinformers.SharedInformerFactory
	ownFactory  dynamicinformer.DynamicSharedInformerFactory
	metaFactory metadatainformer.SharedInformerFactory
	gateways    gwlisters.GatewayLister
	classes     gwlisters.GatewayClassLister
	owned       map[schema.GroupVersionResource]cache.SharedIndexInformer
	configMaps  cache.SharedIndexInformer
	nsFactory   informers.SharedInformerFactory
	namespaces  corelisters.NamespaceLister
	// listenerSets is nil when the API server does not serve ListenerSets (set by Run).
	listenerSets gwlisters.ListenerSetLister
	synced       []cache.InformerSynced

	mu sync.Mutex
	// applied is, per generated object, the hash of what was last applied and the
	// resourceVersion the API server answered: an object whose cached version is still that one
	// and whose rendering did not change is not applied again.
	applied  map[objKey]appliedAs
	problems map[types.NamespacedName]error

	// applies counts the apply requests sent.
	applies atomic.Int64
	// reconciled, for tests, is called after each reconcile.
	reconciled func(types.NamespacedName, error)
}

type objKey struct {
	gvr             schema.GroupVersionResource
	namespace, name string
}

type appliedAs struct{ hash, resourceVersion, before string }

// New returns a Controller for the cluster restCfg points at; nothing is read before Run.
func New(restCfg *rest.Config, cfg Config) (*Controller, error) {
	if cfg.Namespace == "" {
		cfg.Namespace = "istio-system"
	}
	if cfg.Leader == nil {
		cfg.Leader = func() bool { return true }
	}
	if cfg.Owner == nil {
		cfg.Owner = revision.Static(revision.Default)
	}
	if cfg.Selected == nil {
		cfg.Selected = func(string) bool { return true }
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	kc, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, fmt.Errorf("gatewaydeploy: %w", err)
	}
	gc, err := gwclient.NewForConfig(restCfg)
	if err != nil {
		return nil, fmt.Errorf("gatewaydeploy: %w", err)
	}
	dc, err := dynamic.NewForConfig(restCfg)
	if err != nil {
		return nil, fmt.Errorf("gatewaydeploy: %w", err)
	}
	mc, err := metadata.NewForConfig(restCfg)
	if err != nil {
		return nil, fmt.Errorf("gatewaydeploy: %w", err)
	}
	c := &Controller{
		cfg: cfg, log: cfg.Logger, kube: kc, dyn: dc,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[types.NamespacedName](),
			workqueue.TypedRateLimitingQueueConfig[types.NamespacedName]{Name: "gateway-deploy"}),
		gwFactory: gwinformers.NewSharedInformerFactory(gc, 0),
		// Only the objects this controller made: a cluster's Deployments and Services are not cached.
		ownFactory: dynamicinformer.NewFilteredDynamicSharedInformerFactory(dc, 0, metav1.NamespaceAll, func(o *metav1.ListOptions) {
			o.LabelSelector = ManagedLabel + "=" + ManagedValue
		}),
		// ConfigMaps' metadata only: enough to follow edits of a parametersRef; their data is
		// read when a Gateway naming one is reconciled.
		metaFactory: metadatainformer.NewSharedInformerFactory(mc, 0),
		owned:       map[schema.GroupVersionResource]cache.SharedIndexInformer{},
		applied:     map[objKey]appliedAs{},
		problems:    map[types.NamespacedName]error{},
	}
	// Namespaces' labels, for allowedListeners selecting ListenerSets' namespaces, and for the
	// revision that owns their Gateways.
	c.nsFactory = informers.NewSharedInformerFactory(kc, 0)
	nsInf := c.nsFactory.Core().V1().Namespaces()
	c.namespaces = nsInf.Lister()
	// A namespace's ListenerSets are followed by their own events; what changes here is whether
	// a Gateway's selector admits them, and, with istio.io/rev, which revision deploys its own.
	if _, err := nsInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{UpdateFunc: func(old, cur any) {
		o, n := old.(*corev1.Namespace), cur.(*corev1.Namespace)
		if !maps.Equal(o.Labels, n.Labels) {
			c.enqueueSelecting()
		}
		if o.Labels[revision.Label] != n.Labels[revision.Label] {
			c.enqueueNamespace(n.Name)
		}
	}}); err != nil {
		return nil, err
	}
	c.synced = append(c.synced, nsInf.Informer().HasSynced)
	gws := c.gwFactory.Gateway().V1().Gateways()
	classes := c.gwFactory.Gateway().V1().GatewayClasses()
	c.gateways, c.classes = gws.Lister(), classes.Lister()
	c.configMaps = c.metaFactory.ForResource(configMapsGVR).Informer()
	c.synced = append(c.synced, gws.Informer().HasSynced, classes.Informer().HasSynced, c.configMaps.HasSynced)
	for _, k := range kinds {
		inf := c.ownFactory.ForResource(k.gvr).Informer()
		c.owned[k.gvr] = inf
		c.synced = append(c.synced, inf.HasSynced)
		gvr := k.gvr
		forget := func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			if m, ok := o.(metav1.Object); ok {
				c.mu.Lock()
				delete(c.applied, objKey{gvr: gvr, namespace: m.GetNamespace(), name: m.GetName()})
				c.mu.Unlock()
				c.enqueueOwner(m)
			}
		}
		h := handler(func(m metav1.Object) {
			c.enqueueOwner(m)
			if c.cfg.OnOwnedChange != nil {
				c.cfg.OnOwnedChange()
			}
		}).(cache.ResourceEventHandlerFuncs)
		h.DeleteFunc = func(o any) {
			forget(o)
			if c.cfg.OnOwnedChange != nil {
				c.cfg.OnOwnedChange()
			}
		}
		if _, err := inf.AddEventHandler(h); err != nil {
			return nil, err
		}
	}
	if _, err := gws.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) { c.enqueue(o) },
		UpdateFunc: func(old, cur any) {
			o, n := old.(*gwv1.Gateway), cur.(*gwv1.Gateway)
			// A status write changes none of these.
			if o.Generation != n.Generation || !maps.Equal(o.Labels, n.Labels) || !maps.Equal(o.Annotations, n.Annotations) || o.UID != n.UID {
				c.enqueue(cur)
			}
		},
		DeleteFunc: func(o any) { c.enqueue(o) },
	}); err != nil {
		return nil, err
	}
	if _, err := classes.Informer().AddEventHandler(handler(func(o metav1.Object) { c.enqueueClass(o.GetName()) })); err != nil {
		return nil, err
	}
	if _, err := c.configMaps.AddEventHandler(handler(c.enqueueConfigMap)); err != nil {
		return nil, err
	}
	return c, nil
}

// Run deploys until ctx is done.
func (c *Controller) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	withSets, ok := c.waitForAPI(ctx)
	if !ok {
		return nil
	}
	if withSets {
		sets := c.gwFactory.Gateway().V1().ListenerSets()
		c.listenerSets = sets.Lister()
		if _, err := sets.Informer().AddEventHandler(handler(c.enqueueParent)); err != nil {
			return err
		}
		c.synced = append(c.synced, sets.Informer().HasSynced)
	}
	c.gwFactory.Start(ctx.Done())
	c.nsFactory.Start(ctx.Done())
	c.ownFactory.Start(ctx.Done())
	c.metaFactory.Start(ctx.Done())
	defer func() {
		c.queue.ShutDown()
		c.gwFactory.Shutdown()
		c.nsFactory.Shutdown()
		c.ownFactory.Shutdown()
		c.metaFactory.Shutdown()
	}()
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return nil
	}
	if c.cfg.Ready != nil {
		select {
		case <-c.cfg.Ready:
		case <-ctx.Done():
			return nil
		}
	}
	c.log.Info("gateway deployment controller synced")
	c.Elected()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		<-ctx.Done()
		c.queue.ShutDown()
	})
	// A few Gateways at a time (the queue never hands one Gateway to two workers): each
	// reconcile waits on a few API round trips.
	for range workers {
		wg.Go(c.work(ctx))
	}
	wg.Wait()
	return nil
}

// workers is how many Gateways are reconciled at once.
const workers = 4

// work returns a worker: it reconciles what the queue hands it until the queue shuts down.
func (c *Controller) work(ctx context.Context) func() {
	return func() {
		for {
			key, quit := c.queue.Get()
			if quit {
				return
			}
			err := c.reconcile(ctx, key)
			if c.reconciled != nil {
				c.reconciled(key, err)
			}
			switch {
			case err == nil:
				c.queue.Forget(key)
			case ctx.Err() != nil:
			default:
				c.log.Warn("gateway deployment failed; retrying", "gateway", key.String(), "error", err)
				c.queue.AddRateLimited(key)
			}
			c.queue.Done(key)
		}
	}
}

// waitForAPI waits until the API server serves Gateways and GatewayClasses: the Gateway API
// CRDs are often installed after the control plane.
// It reports whether ListenerSets are served too (their CRD is newer).
func (c *Controller) waitForAPI(ctx context.Context) (listenerSets, ok bool) {
	tick := time.NewTicker(apiPoll)
	defer tick.Stop()
	for logged := false; ; {
		rl, err := c.kube.Discovery().ServerResourcesForGroupVersion(gwv1.GroupVersion.String())
		served := func(name string) bool {
			return err == nil && slices.ContainsFunc(rl.APIResources, func(r metav1.APIResource) bool { return r.Name == name })
		}
		if served("gateways") && served("gatewayclasses") {
			return served("listenersets"), true
		}
		if !logged {
			c.log.Info("the API server does not serve Gateway API v1 Gateways and GatewayClasses (CRDs not installed?); gateway deployment waits for them", "error", err)
			logged = true
		}
		select {
		case <-ctx.Done():
			return false, false
		case <-tick.C:
		}
	}
}

// apiPoll is how often waitForAPI asks.
var apiPoll = 10 * time.Second

// Elected re-checks every Gateway: called when this replica becomes the writer (what changed
// while it was not was not acted upon).
func (c *Controller) Elected() {
	gws, err := c.gateways.List(labels.Everything())
	if err != nil {
		return
	}
	for _, gw := range gws {
		c.queue.Add(types.NamespacedName{Namespace: gw.Namespace, Name: gw.Name})
	}
}

// Problem returns why a Gateway's objects could not be generated (wrapping
// ErrInvalidParameters), nil if they were or it is not this controller's.
func (c *Controller) Problem(namespace, name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.problems[types.NamespacedName{Namespace: namespace, Name: name}]
}

// setProblem records why a Gateway was not deployed (nil: it was); a change is announced
// (OnOwnedChange), as the Gateway's status reports it.
func (c *Controller) setProblem(key types.NamespacedName, err error) {
	c.mu.Lock()
	prev, had := c.problems[key]
	if err == nil {
		delete(c.problems, key)
	} else {
		c.problems[key] = err
	}
	c.mu.Unlock()
	changed := had != (err != nil) || (had && prev.Error() != err.Error())
	if changed && c.cfg.OnOwnedChange != nil {
		c.cfg.OnOwnedChange()
	}
}

// Ours reports whether a Gateway of that class is this controller's to deploy: its
// GatewayClass names one of Sailplane's controller names, or, for the class istiod serves
// built in ("istio"), there is no GatewayClass object.
func Ours(class *gwv1.GatewayClass, className string) bool {
	if class == nil {
		return className == gatewayapi.DefaultClassName
	}
	return class.Spec.ControllerName == gatewayapi.ControllerName || class.Spec.ControllerName == gatewayapi.SailplaneControllerName
}

// mine reports whether gw is this revision's to deploy.
func (c *Controller) mine(gw *gwv1.Gateway) bool {
	var nsLabels map[string]string
	if _, labelled := gw.Labels[revision.Label]; !labelled {
		if ns, err := c.namespaces.Get(gw.Namespace); err == nil {
			nsLabels = ns.Labels
		}
	}
	return c.cfg.Owner.Owns(revision.Of(gw.Labels, nsLabels))
}

func (c *Controller) reconcile(ctx context.Context, key types.NamespacedName) error {
	if !c.cfg.Leader() {
		return nil // the new leader re-checks everything (Elected)
	}
	c.log.Debug("reconciling", "gateway", key.String())
	if !c.cfg.Selected(key.Namespace) {
		return nil
	}
	gw, err := c.gateways.Gateways(key.Namespace).Get(key.Name)
	if apierrors.IsNotFound(err) {
		c.setProblem(key, nil)
		// Garbage collection removes them too; a cluster without it (or a slow one) does not
		// keep a deleted Gateway's Service answering.
		return c.prune(ctx, key, "", nil)
	}
	if err != nil {
		return err
	}
	if !c.mine(gw) {
		return nil // another revision deploys it (istiod's TagWatcher.IsMine)
	}
	class, err := c.classes.Get(string(gw.Spec.GatewayClassName))
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if !Ours(class, string(gw.Spec.GatewayClassName)) || Manual(gw) {
		c.setProblem(key, nil)
		return c.prune(ctx, key, gw.UID, nil)
	}
	overlays, err := c.overlays(ctx, gw)
	var objs []*unstructured.Unstructured
	if err == nil {
		objs, err = Render(Input{Gateway: gw, ListenerSets: c.attachedSets(gw), Overlays: overlays})
	}
	if errors.Is(err, ErrInvalidParameters) {
		// What runs keeps running; the status says why it is not updated.
		c.log.Error("gateway not deployed", "gateway", key.String(), "error", err)
		c.setProblem(key, err)
		return nil
	}
	if err != nil {
		return err
	}
	c.setProblem(key, nil)
	keep := map[objKey]bool{}
	for i, u := range objs {
		k := objKey{gvr: kinds[slices.IndexFunc(kinds, func(o object) bool { return o.kind == u.GetKind() })].gvr, namespace: u.GetNamespace(), name: u.GetName()}
		keep[k] = true
		if err := c.apply(ctx, k, u); err != nil {
			return fmt.Errorf("gateway %s: object %d (%s %s): %w", key, i, u.GetKind(), u.GetName(), err)
		}
	}
	return c.prune(ctx, key, gw.UID, keep)
}

// overlays are the class defaults, then the Gateway's parametersRef ConfigMap.
func (c *Controller) overlays(ctx context.Context, gw *gwv1.Gateway) ([]Overlay, error) {
	var out []Overlay
	var oldest *metav1.PartialObjectMetadata
	for _, o := range c.configMaps.GetIndexer().List() {
		m := o.(*metav1.PartialObjectMetadata)
		if m.Namespace != c.cfg.Namespace || m.Labels[ClassDefaultsLabel] != string(gw.Spec.GatewayClassName) {
			continue
		}
		if oldest == nil || m.CreationTimestamp.Before(&oldest.CreationTimestamp) ||
			(m.CreationTimestamp.Equal(&oldest.CreationTimestamp) && m.Name < oldest.Name) {
			oldest = m
		}
	}
	if oldest != nil {
		cm, err := c.kube.CoreV1().ConfigMaps(oldest.Namespace).Get(ctx, oldest.Name, metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, err
		}
		if err == nil {
			out = append(out, Overlay{Source: cm.Namespace + "/" + cm.Name, Data: cm.Data})
		}
	}
	if gw.Spec.Infrastructure == nil || gw.Spec.Infrastructure.ParametersRef == nil {
		return out, nil
	}
	ref := gw.Spec.Infrastructure.ParametersRef
	if ref.Group != "" || ref.Kind != "ConfigMap" {
		return nil, fmt.Errorf("%w: Gateway %s/%s spec.infrastructure.parametersRef: kind %q of group %q is not supported (only ConfigMap of the core group)",
			ErrInvalidParameters, gw.Namespace, gw.Name, ref.Kind, ref.Group)
	}
	cm, err := c.kube.CoreV1().ConfigMaps(gw.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("%w: Gateway %s/%s spec.infrastructure.parametersRef: ConfigMap %s/%s not found",
			ErrInvalidParameters, gw.Namespace, gw.Name, gw.Namespace, ref.Name)
	}
	if err != nil {
		return nil, err
	}
	return append(out, Overlay{Source: cm.Namespace + "/" + cm.Name, Data: cm.Data}), nil
}

// apply server-side applies u unless it is already what was last applied and nobody changed
// it since. An object of that name the controller does not manage is left alone.
func (c *Controller) apply(ctx context.Context, k objKey, u *unstructured.Unstructured) error {
	b, err := json.Marshal(u.Object)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(b)
	hash := hex.EncodeToString(sum[:])
	live, exists, err := c.owned[k.gvr].GetIndexer().GetByKey(k.namespace + "/" + k.name)
	if err != nil {
		return err
	}
	c.mu.Lock()
	last, ok := c.applied[k]
	c.mu.Unlock()
	cachedRV := ""
	if exists {
		cachedRV = live.(*unstructured.Unstructured).GetResourceVersion()
	}
	// The cache may not have seen the last apply yet (cachedRV is the version before it).
	if ok && last.hash == hash && (cachedRV == last.resourceVersion || cachedRV == last.before) {
		return nil // (not cached and before == "": created, not seen yet; a deletion forgets it)
	}
	if !exists {
		// Not among the managed objects: is there one of the user's by that name?
		got, err := c.dyn.Resource(k.gvr).Namespace(k.namespace).Get(ctx, k.name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return err
		case got.GetLabels()[ManagedLabel] == "":
			c.log.Warn("gateway object exists and is not managed by the gateway controller; left alone",
				"kind", u.GetKind(), "namespace", k.namespace, "name", k.name)
			return nil
		}
	}
	c.applies.Add(1)
	out, err := c.dyn.Resource(k.gvr).Namespace(k.namespace).Apply(ctx, k.name, u, metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	if err != nil {
		return err
	}
	c.log.Info("gateway object applied", "kind", u.GetKind(), "namespace", k.namespace, "name", k.name, "resourceVersion", out.GetResourceVersion())
	c.mu.Lock()
	c.applied[k] = appliedAs{hash: hash, resourceVersion: out.GetResourceVersion(), before: cachedRV}
	c.mu.Unlock()
	return nil
}

// prune deletes the managed objects of Gateway key that keep does not list. With uid set, only
// those owned by that Gateway; without, those owned by any Gateway of that name (it is gone).
func (c *Controller) prune(ctx context.Context, key types.NamespacedName, uid types.UID, keep map[objKey]bool) error {
	for _, k := range kinds {
		for _, o := range c.owned[k.gvr].GetIndexer().List() {
			u := o.(*unstructured.Unstructured)
			if u.GetNamespace() != key.Namespace || u.GetLabels()[GatewayNameLabel] != key.Name {
				continue
			}
			ok := objKey{gvr: k.gvr, namespace: u.GetNamespace(), name: u.GetName()}
			if keep[ok] || !ownedBy(u, key.Name, uid) {
				continue
			}
			err := c.dyn.Resource(k.gvr).Namespace(u.GetNamespace()).Delete(ctx, u.GetName(), metav1.DeleteOptions{
				Preconditions: &metav1.Preconditions{UID: ptr(u.GetUID())},
			})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return fmt.Errorf("gateway %s: deleting %s %s: %w", key, k.kind, u.GetName(), err)
			}
			c.log.Info("gateway object deleted", "kind", k.kind, "namespace", u.GetNamespace(), "name", u.GetName())
			c.mu.Lock()
			delete(c.applied, ok)
			c.mu.Unlock()
		}
	}
	return nil
}

func ownedBy(u *unstructured.Unstructured, gateway string, uid types.UID) bool {
	for _, r := range u.GetOwnerReferences() {
		if r.Kind == "Gateway" && r.APIVersion == gwv1.GroupVersion.String() && r.Name == gateway && (uid == "" || r.UID == uid) {
			return true
		}
	}
	return false
}

// attachedSets are the ListenerSets whose parentRef is gw and whose namespace gw's
// allowedListeners accept, oldest first.
func (c *Controller) attachedSets(gw *gwv1.Gateway) []*gwv1.ListenerSet {
	if c.listenerSets == nil {
		return nil
	}
	all, _ := c.listenerSets.List(labels.Everything())
	var out []*gwv1.ListenerSet
	for _, ls := range all {
		if !Attached(ls, gw) {
			continue
		}
		var nsLabels map[string]string
		if ns, err := c.namespaces.Get(ls.Namespace); err == nil {
			nsLabels = ns.Labels
		}
		if AcceptsListeners(gw, ls.Namespace, nsLabels) {
			out = append(out, ls)
		}
	}
	slices.SortFunc(out, func(a, b *gwv1.ListenerSet) int {
		return cmp.Or(a.CreationTimestamp.Compare(b.CreationTimestamp.Time), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return out
}

// Attached reports whether a ListenerSet's parentRef is the Gateway.
func Attached(ls *gwv1.ListenerSet, gw *gwv1.Gateway) bool {
	p := ls.Spec.ParentRef
	ns := ls.Namespace
	if p.Namespace != nil {
		ns = string(*p.Namespace)
	}
	return (p.Group == nil || *p.Group == gwv1.GroupName) && (p.Kind == nil || *p.Kind == "Gateway") &&
		string(p.Name) == gw.Name && ns == gw.Namespace
}

// AcceptsListeners reports whether a Gateway's allowedListeners admit ListenerSets of namespace
// ns (whose labels are nsLabels): none unless they say so, as the spec and istiod.
func AcceptsListeners(gw *gwv1.Gateway, ns string, nsLabels map[string]string) bool {
	a := gw.Spec.AllowedListeners
	if a == nil || a.Namespaces == nil || a.Namespaces.From == nil {
		return false
	}
	switch *a.Namespaces.From {
	case gwv1.NamespacesFromAll:
		return true
	case gwv1.NamespacesFromSame:
		return ns == gw.Namespace
	case gwv1.NamespacesFromSelector:
		if a.Namespaces.Selector == nil {
			return false
		}
		sel, err := metav1.LabelSelectorAsSelector(a.Namespaces.Selector)
		if err != nil {
			return false
		}
		l := maps.Clone(nsLabels)
		if l == nil {
			l = map[string]string{}
		}
		l[corev1.LabelMetadataName] = ns // set by the API server; not yet on a namespace just created
		return sel.Matches(labels.Set(l))
	}
	return false
}

func (c *Controller) enqueueParent(o metav1.Object) {
	ls, ok := o.(*gwv1.ListenerSet)
	if !ok {
		return
	}
	ns := ls.Namespace
	if p := ls.Spec.ParentRef.Namespace; p != nil {
		ns = string(*p)
	}
	c.queue.Add(types.NamespacedName{Namespace: ns, Name: string(ls.Spec.ParentRef.Name)})
}

// enqueueSelecting queues the Gateways admitting ListenerSets by namespace labels.
func (c *Controller) enqueueSelecting() {
	gws, _ := c.gateways.List(labels.Everything())
	for _, gw := range gws {
		if a := gw.Spec.AllowedListeners; a != nil && a.Namespaces != nil && a.Namespaces.From != nil && *a.Namespaces.From == gwv1.NamespacesFromSelector {
			c.queue.Add(types.NamespacedName{Namespace: gw.Namespace, Name: gw.Name})
		}
	}
}

// enqueueNamespace queues a namespace's Gateways.
func (c *Controller) enqueueNamespace(ns string) {
	gws, _ := c.gateways.Gateways(ns).List(labels.Everything())
	for _, gw := range gws {
		c.queue.Add(types.NamespacedName{Namespace: gw.Namespace, Name: gw.Name})
	}
}

func (c *Controller) enqueue(o any) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	if m, ok := o.(metav1.Object); ok {
		c.queue.Add(types.NamespacedName{Namespace: m.GetNamespace(), Name: m.GetName()})
	}
}

func (c *Controller) enqueueOwner(o metav1.Object) {
	if name := o.GetLabels()[GatewayNameLabel]; name != "" {
		c.queue.Add(types.NamespacedName{Namespace: o.GetNamespace(), Name: name})
	}
}

func (c *Controller) enqueueClass(class string) {
	gws, _ := c.gateways.List(labels.Everything())
	for _, gw := range gws {
		if string(gw.Spec.GatewayClassName) == class {
			c.queue.Add(types.NamespacedName{Namespace: gw.Namespace, Name: gw.Name})
		}
	}
}

func (c *Controller) enqueueConfigMap(o metav1.Object) {
	if class, ok := o.GetLabels()[ClassDefaultsLabel]; ok && o.GetNamespace() == c.cfg.Namespace {
		c.enqueueClass(class)
	}
	gws, _ := c.gateways.Gateways(o.GetNamespace()).List(labels.Everything())
	for _, gw := range gws {
		if i := gw.Spec.Infrastructure; i != nil && i.ParametersRef != nil && i.ParametersRef.Kind == "ConfigMap" && i.ParametersRef.Name == o.GetName() {
			c.queue.Add(types.NamespacedName{Namespace: gw.Namespace, Name: gw.Name})
		}
	}
}

// handler calls fn with the object of every event, tombstones unwrapped.
func handler(fn func(metav1.Object)) cache.ResourceEventHandler {
	call := func(o any) {
		if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
			o = d.Obj
		}
		if m, ok := o.(metav1.Object); ok {
			fn(m)
		}
	}
	return cache.ResourceEventHandlerFuncs{AddFunc: call, UpdateFunc: func(_, o any) { call(o) }, DeleteFunc: call}
}

func ptr[T any](v T) *T { return &v }
