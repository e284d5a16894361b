package revision

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ErrTag marks a tag that cannot be set as asked.
var ErrTag = errors.New("revision tag")

// TagWebhook returns the MutatingWebhookConfiguration that makes tag name the revision whose
// own injector configuration is injector, in istioctl's layout: named istio-revision-tag-<tag>,
// labelled istio.io/tag=<tag> and istio.io/rev=<revision>, holding the revision's webhooks that
// select by istio.io/rev (rev.*), pointed at the same service (or URL) with the same caBundle,
// their selectors matching istio.io/rev=<tag> instead. Pods of namespaces (or pods) labelled
// with the tag are injected by that revision, and config-ingest reads the same webhooks to
// learn what the tag names.
//
// The default tag (which would take over unlabelled namespaces and istio-injection=enabled) is
// refused: the default revision's own webhooks would inject those pods too.
func TagWebhook(tag string, injector *admissionregistrationv1.MutatingWebhookConfiguration) (*admissionregistrationv1.MutatingWebhookConfiguration, error) {
	rev := injector.Labels[Label]
	switch {
	case tag == "":
		return nil, fmt.Errorf("%w: empty name", ErrTag)
	case tag == Default:
		return nil, fmt.Errorf("%w %q: the default tag is not supported (the default revision's webhooks would inject its namespaces too); use a named tag", ErrTag, tag)
	case rev == "":
		return nil, fmt.Errorf("%w %q: MutatingWebhookConfiguration %s has no %s label: not a revision's injector", ErrTag, tag, injector.Name, Label)
	case injector.Labels[TagLabel] != "":
		return nil, fmt.Errorf("%w %q: MutatingWebhookConfiguration %s is itself the webhook of tag %q", ErrTag, tag, injector.Name, injector.Labels[TagLabel])
	case tag == rev:
		return nil, fmt.Errorf("%w %q: a tag cannot have its revision's name", ErrTag, tag)
	}
	labels := map[string]string{}
	for k, v := range injector.Labels {
		if k != "app" { // istioctl keeps the installer's labels but the app's
			labels[k] = v
		}
	}
	labels[TagLabel], labels[Label] = tag, rev
	out := &admissionregistrationv1.MutatingWebhookConfiguration{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "MutatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{Name: TagWebhookName(tag), Labels: labels},
	}
	for _, wh := range injector.Webhooks {
		if !strings.HasPrefix(wh.Name, "rev.") {
			continue
		}
		wh = *wh.DeepCopy()
		for _, sel := range []*metav1.LabelSelector{wh.NamespaceSelector, wh.ObjectSelector} {
			retarget(sel, rev, tag)
		}
		out.Webhooks = append(out.Webhooks, wh)
	}
	if len(out.Webhooks) == 0 {
		return nil, fmt.Errorf("%w %q: MutatingWebhookConfiguration %s has no rev.* webhook (selecting by %s) to copy", ErrTag, tag, injector.Name, Label)
	}
	return out, nil
}

// retarget makes a selector that matches istio.io/rev=rev match istio.io/rev=tag.
func retarget(sel *metav1.LabelSelector, rev, tag string) {
	if sel == nil {
		return
	}
	if sel.MatchLabels[Label] == rev {
		sel.MatchLabels = maps.Clone(sel.MatchLabels)
		sel.MatchLabels[Label] = tag
	}
	for i, e := range sel.MatchExpressions {
		if e.Key == Label && e.Operator == metav1.LabelSelectorOpIn && slices.Contains(e.Values, rev) {
			sel.MatchExpressions[i].Values = []string{tag}
		}
	}
}
