// Package revision is Istio's model of control plane revisions and revision tags: an object
// (or its namespace) labelled istio.io/rev=<value> belongs to the revision that value names,
// either a revision itself or a tag pointing at one; an unlabelled object belongs to the
// default revision, unless a tag named "default" points elsewhere.
//
// Tags live where istiod and istioctl keep them: a MutatingWebhookConfiguration labelled
// istio.io/tag=<tag> and istio.io/rev=<revision> (istioctl's istio-revision-tag-<tag>) says
// that <tag> names <revision>. Tags watches them, as istiod's TagWatcher, so that moving a
// tag moves its namespaces' config, status and injection without relabelling them.
package revision

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Labels and names of Istio's revision model.
const (
	// Label binds an object, a namespace or a webhook configuration to a revision (or tag).
	Label = "istio.io/rev"
	// TagLabel marks a tag's webhook configuration with the tag's name.
	TagLabel = "istio.io/tag"
	// Default is the revision of a control plane installed without one, and the tag whose
	// revision owns unlabelled objects.
	Default = "default"
	// TagWebhookPrefix begins the name of a tag's MutatingWebhookConfiguration (istioctl's).
	TagWebhookPrefix = "istio-revision-tag-"
)

// TagWebhookName is the name of tag's MutatingWebhookConfiguration.
func TagWebhookName(tag string) string { return TagWebhookPrefix + tag }

// Owner decides which objects are a revision's.
type Owner interface {
	// Owns reports whether an istio.io/rev value ("" for none) names this revision.
	Owns(value string) bool
}

// Static is a revision without tags.
type Static string

// Owns is true for the revision's name, and for "" when it is the default revision.
func (r Static) Owns(value string) bool {
	if value == "" {
		value = Default
	}
	rev := string(r)
	if rev == "" {
		rev = Default
	}
	return value == rev
}

// Of returns the istio.io/rev value an object carries, else its namespace's ("" for none).
func Of(objLabels, nsLabels map[string]string) string {
	if v, ok := objLabels[Label]; ok {
		return v
	}
	return nsLabels[Label]
}

// ConfigIn reports whether a config object with these labels is read by o's revision, as
// istiod's config client: unlabelled config is every revision's; labelled, only the revision
// (or a tag of it) it names.
func ConfigIn(o Owner, objLabels map[string]string) bool {
	v, ok := objLabels[Label]
	return !ok || o.Owns(v)
}

// Tags follows the tags of one revision from their webhook configurations.
type Tags struct {
	revision string
	kc       kubernetes.Interface
	log      *slog.Logger
	inf      cache.SharedIndexInformer
	factory  informers.SharedInformerFactory
	synced   chan struct{}
	ready    atomic.Bool

	mu       sync.Mutex
	onChange []func()
}

// NewTags returns the tags of revision ("" is Default); nothing is read before Run. log
// (nil: discarded) hears when the tags cannot be read.
func NewTags(kc kubernetes.Interface, revision string, log *slog.Logger) *Tags {
	if revision == "" {
		revision = Default
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := informers.NewSharedInformerFactoryWithOptions(kc, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = TagLabel
	}))
	return &Tags{revision: revision, kc: kc, log: log, factory: f, inf: f.Admissionregistration().V1().MutatingWebhookConfigurations().Informer(), synced: make(chan struct{})}
}

// OnChange registers fn, called (it must not block) when the tags may have changed; before Run.
func (t *Tags) OnChange(fn func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.onChange = append(t.onChange, fn)
}

// Run watches the tag webhooks until ctx ends. Without the right to list them, the revision has
// no tags (said once in the log), rather than waiting for them for ever.
func (t *Tags) Run(ctx context.Context) error {
	_, err := t.kc.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{LabelSelector: TagLabel, Limit: 1})
	if apierrors.IsForbidden(err) {
		t.log.Warn("cannot read the revision tags (list MutatingWebhookConfigurations): none is followed", "revision", t.revision, "error", err)
		t.ready.Store(true)
		close(t.synced)
		<-ctx.Done()
		return nil
	}
	notify := func(any) {
		if !t.ready.Load() {
			return
		}
		t.mu.Lock()
		fns := slices.Clone(t.onChange)
		t.mu.Unlock()
		for _, fn := range fns {
			fn()
		}
	}
	_, _ = t.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: notify, DeleteFunc: notify, UpdateFunc: func(_, n any) { notify(n) },
	})
	t.factory.Start(ctx.Done())
	defer t.factory.Shutdown()
	if cache.WaitForCacheSync(ctx.Done(), t.inf.HasSynced) {
		t.ready.Store(true)
		close(t.synced)
		notify(nil)
	}
	<-ctx.Done()
	return nil
}

// Synced is closed once the tags were read.
func (t *Tags) Synced() <-chan struct{} { return t.synced }

// Revision is the revision whose tags these are.
func (t *Tags) Revision() string { return t.revision }

// All maps every tag to the revision it names.
func (t *Tags) All() map[string]string {
	out := map[string]string{}
	for _, o := range t.inf.GetStore().List() {
		if wh, ok := o.(*admissionregistrationv1.MutatingWebhookConfiguration); ok {
			if tag := wh.Labels[TagLabel]; tag != "" {
				out[tag] = wh.Labels[Label]
			}
		}
	}
	return out
}

// Mine lists the revision and the tags naming it, sorted.
func (t *Tags) Mine() []string {
	mine := map[string]bool{t.revision: true}
	for tag, rev := range t.All() {
		if rev == t.revision {
			mine[tag] = true
		}
	}
	return slices.Sorted(maps.Keys(mine))
}

// Owns is istiod's TagWatcher.IsMine for a label value: the revision's name or one of its
// tags; "" (unlabelled) and "default" when the revision is the default one or the default tag
// names it, and the default revision gives them up only to a default tag naming another.
func (t *Tags) Owns(value string) bool {
	all := t.All()
	// "default", like no label, is the default tag's revision when there is one.
	if value != "" && value != Default {
		return value == t.revision || (all[value] == t.revision && all[value] != "")
	}
	if rev, ok := all[Default]; ok {
		return rev == t.revision
	}
	return t.revision == Default
}

var _ Owner = (*Tags)(nil)
var _ Owner = Static("")
