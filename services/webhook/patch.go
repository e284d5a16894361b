package webhook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sschema "k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// FailOpenPrefix starts the name of a validating webhook that stays failurePolicy: Ignore: the
// one for the control plane's own namespace and kube-system, which must never depend on the
// webhook being up. Every other validating webhook of the revision is turned to Fail once the
// webhook has been reached through the API server.
const FailOpenPrefix = "control-plane."

// How long the patcher waits between failed attempts (conflicts with another writer, the API
// server away, the webhook not reached yet), doubling from the first to the last.
const (
	retryFirst = 100 * time.Millisecond
	retryMax   = time.Minute
)

// rootsCheckInterval is how often the roots are compared with the ones patched: the
// certificate sources have no change notification, comparing a few hundred bytes costs nothing
// and the API server is written to only on change.
const rootsCheckInterval = time.Second

// configPatcher keeps the caBundle of its revision's two webhook configurations equal to the
// roots of the serving certificate, and turns the validator's webhooks (but FailOpenPrefix's)
// from Ignore to Fail once a dry-run refusal showed the API server reaches this webhook, as
// istiod does. It touches only the configurations named for its revision and labelled with it.
// Every replica of a revision runs one; they agree on the roots, which come from the same ca.
type configPatcher struct {
	kube      kubernetes.Interface
	dyn       dynamic.Interface
	log       *slog.Logger
	revision  string
	namespace string
	roots     func() []byte
	certReady <-chan struct{}

	reached bool // the API server got a refusal from this webhook once (kept for the process)
}

func (p *configPatcher) Run(ctx context.Context) error {
	select {
	case <-p.certReady:
	case <-ctx.Done():
		return nil
	}
	// Watched only to learn when a configuration appears or is edited (kubectl apply resets
	// caBundle); each pass reads them afresh, so an update never starts from a stale copy. Each
	// is watched by its name, so RBAC can limit list and watch to these two names (owned checks
	// the revision label before anything is touched).
	byName := func(name string) informers.SharedInformerFactory {
		return informers.NewSharedInformerFactoryWithOptions(p.kube, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = "metadata.name=" + name
		}))
	}
	mutating := byName(ConfigName(InjectorConfigName, p.revision))
	validating := byName(ConfigName(ValidatorConfigName, p.revision))
	changed := make(chan struct{}, 1)
	kick := func(any) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	handler := cache.ResourceEventHandlerFuncs{AddFunc: kick, UpdateFunc: func(_, o any) { kick(o) }, DeleteFunc: kick}
	for _, inf := range []cache.SharedIndexInformer{
		mutating.Admissionregistration().V1().MutatingWebhookConfigurations().Informer(),
		validating.Admissionregistration().V1().ValidatingWebhookConfigurations().Informer(),
	} {
		if _, err := inf.AddEventHandler(handler); err != nil {
			return err
		}
	}
	for _, f := range []informers.SharedInformerFactory{mutating, validating} {
		f.Start(ctx.Done())
		defer f.Shutdown()
	}

	ticker := time.NewTicker(rootsCheckInterval)
	defer ticker.Stop()
	var (
		patched []byte
		retry   <-chan time.Time
		delay   = retryFirst
		dirty   = true
	)
	for {
		if roots := p.roots(); len(roots) > 0 && (dirty || !bytes.Equal(roots, patched)) && retry == nil {
			dirty = false
			if err := p.reconcile(ctx, roots); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				wait := delay/2 + rand.N(delay/2+1)
				if errors.Is(err, errNotReached) {
					p.log.Info("the API server does not reach the validator yet: it stays fail open", "reason", err.Error(), "retry-in", wait.Round(time.Millisecond))
				} else {
					p.log.Info("webhook configurations not current yet; retrying", "reason", err.Error(), "retry-in", wait.Round(time.Millisecond))
				}
				retry, delay, dirty = time.After(wait), min(2*delay, retryMax), true
			} else {
				patched, delay = roots, retryFirst
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
			dirty = true
		case <-retry:
			retry = nil
		case <-ticker.C:
		}
	}
}

// errNotReached: the validator has fail-open webhooks to turn to Fail, and the dry run did not
// show that the API server reaches this webhook yet.
var errNotReached = errors.New("the API server does not reach the validator yet")

// reconcile brings both configurations up to date with roots.
func (p *configPatcher) reconcile(ctx context.Context, roots []byte) error {
	mutating := p.kube.AdmissionregistrationV1().MutatingWebhookConfigurations()
	mwc, err := owned(ctx, p, mutating.Get, ConfigName(InjectorConfigName, p.revision))
	if err != nil {
		return err
	}
	if mwc != nil && setBundle(mwc.Webhooks, func(w *admissionregistrationv1.MutatingWebhook) *[]byte { return &w.ClientConfig.CABundle }, roots) {
		if _, err := mutating.Update(ctx, mwc, metav1.UpdateOptions{FieldManager: ServiceName}); err != nil {
			return fmt.Errorf("caBundle of %s: %w", mwc.Name, err)
		}
		p.log.Info("caBundle patched", "configuration", mwc.Name)
	}

	validating := p.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	vwc, err := owned(ctx, p, validating.Get, ConfigName(ValidatorConfigName, p.revision))
	if err != nil || vwc == nil {
		return err
	}
	if setBundle(vwc.Webhooks, func(w *admissionregistrationv1.ValidatingWebhook) *[]byte { return &w.ClientConfig.CABundle }, roots) {
		if vwc, err = validating.Update(ctx, vwc, metav1.UpdateOptions{FieldManager: ServiceName}); err != nil {
			return fmt.Errorf("caBundle of %s: %w", ConfigName(ValidatorConfigName, p.revision), err)
		}
		p.log.Info("caBundle patched", "configuration", vwc.Name)
	}
	var failOpen []int
	for i, w := range vwc.Webhooks {
		if !strings.HasPrefix(w.Name, FailOpenPrefix) && (w.FailurePolicy == nil || *w.FailurePolicy != admissionregistrationv1.Fail) {
			failOpen = append(failOpen, i)
		}
	}
	if len(failOpen) == 0 {
		return nil
	}
	if !p.reached {
		if err := p.checkReached(ctx); err != nil {
			return err
		}
		p.reached = true
		p.log.Info("the API server reaches the validator: turning it to fail closed", "configuration", vwc.Name)
	}
	fail := admissionregistrationv1.Fail
	for _, i := range failOpen {
		vwc.Webhooks[i].FailurePolicy = &fail
	}
	if _, err := validating.Update(ctx, vwc, metav1.UpdateOptions{FieldManager: ServiceName}); err != nil {
		return fmt.Errorf("failurePolicy of %s: %w", vwc.Name, err)
	}
	p.log.Info("failurePolicy set to Fail", "configuration", vwc.Name)
	return nil
}

// owned reads a configuration by name; nil when it does not exist or belongs to another
// revision (its label says so), which this webhook never touches.
func owned[T metav1.Object](ctx context.Context, p *configPatcher, read func(context.Context, string, metav1.GetOptions) (T, error), name string) (T, error) {
	var none T
	obj, err := read(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		p.log.Debug("webhook configuration absent", "configuration", name)
		return none, nil
	case err != nil:
		return none, fmt.Errorf("read %s: %w", name, err)
	case obj.GetLabels()[RevisionLabel] != p.revision:
		p.log.Warn("webhook configuration not labelled with this revision: left alone", "configuration", name,
			"label", RevisionLabel+"="+obj.GetLabels()[RevisionLabel])
		return none, nil
	}
	return obj, nil
}

// setBundle sets every webhook's caBundle to roots; whether one changed.
func setBundle[W any](webhooks []W, bundle func(*W) *[]byte, roots []byte) bool {
	changed := false
	for i := range webhooks {
		if b := bundle(&webhooks[i]); !bytes.Equal(*b, roots) {
			*b, changed = roots, true
		}
	}
	return changed
}

var gatewayResource = k8sschema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "gateways"}

// checkReached dry-runs the creation of a Gateway in the control plane's namespace that this
// revision's validator always refuses (ReadinessCheckAnnotation; otherwise valid, so other
// revisions' validators admit it): refused by this webhook, the API server reaches it with the
// caBundle patched. Without the Gateway CRD nothing can be checked, and the validator is taken
// as reached (istiod does the same).
func (p *configPatcher) checkReached(ctx context.Context) error {
	gw := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.istio.io/v1",
		"kind":       "Gateway",
		"metadata": map[string]any{
			"generateName": ServiceName + "-readiness-check-",
			"labels":       map[string]any{RevisionLabel: p.revision},
			"annotations":  map[string]any{ReadinessCheckAnnotation: p.revision},
		},
		"spec": map[string]any{"servers": []any{map[string]any{
			"port":  map[string]any{"number": int64(80), "name": "http", "protocol": "HTTP"},
			"hosts": []any{"*"},
		}}},
	}}
	_, err := p.dyn.Resource(gatewayResource).Namespace(p.namespace).Create(ctx, gw, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	switch {
	case err == nil:
		return errNotReached
	case strings.Contains(err.Error(), ReadinessCheckAnnotation):
		return nil
	case apierrors.IsNotFound(err):
		p.log.Warn("no Gateway CRD: cannot check that the API server reaches the validator; taking it as reached")
		return nil
	}
	return fmt.Errorf("%w: %w", errNotReached, err)
}
