package revision

import (
	"encoding/json"
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
// The default tag takes over what the default revision injects: besides istio.io/rev=default,
// namespaces labelled istio-injection=enabled and pods labelled sidecar.istio.io/inject=true in
// unlabelled namespaces, with webhooks built from the rev.* ones (istioctl's layout). The
// default revision's own injector must then be deactivated (Deactivate), as istioctl does.
func TagWebhook(tag string, injector *admissionregistrationv1.MutatingWebhookConfiguration) (*admissionregistrationv1.MutatingWebhookConfiguration, error) {
	rev := injector.Labels[Label]
	switch {
	case tag == "":
		return nil, fmt.Errorf("%w: empty name", ErrTag)
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
		if tag == Default {
			if d, ok := defaultWebhook(wh); ok {
				out.Webhooks = append(out.Webhooks, d)
			}
		}
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

// defaultWebhook derives, from a rev.* webhook retargeted to the default tag, the one that
// injects what unlabelled installs inject: rev.namespace.* gives namespace.* (namespaces
// labelled istio-injection=enabled), rev.object.* gives object.* (pods labelled
// sidecar.istio.io/inject=true where neither namespace label is set).
func defaultWebhook(wh admissionregistrationv1.MutatingWebhook) (admissionregistrationv1.MutatingWebhook, bool) {
	wh = *wh.DeepCopy()
	switch {
	case strings.HasPrefix(wh.Name, "rev.namespace."):
		wh.Name = strings.TrimPrefix(wh.Name, "rev.")
		if wh.NamespaceSelector == nil {
			wh.NamespaceSelector = &metav1.LabelSelector{}
		}
		delete(wh.NamespaceSelector.MatchLabels, Label)
		var exprs []metav1.LabelSelectorRequirement
		for _, e := range wh.NamespaceSelector.MatchExpressions {
			if e.Key != Label && e.Key != InjectionLabel {
				exprs = append(exprs, e)
			}
		}
		wh.NamespaceSelector.MatchExpressions = append([]metav1.LabelSelectorRequirement{
			{Key: InjectionLabel, Operator: metav1.LabelSelectorOpIn, Values: []string{"enabled"}}}, exprs...)
	case strings.HasPrefix(wh.Name, "rev.object."):
		wh.Name = strings.TrimPrefix(wh.Name, "rev.")
		if wh.ObjectSelector == nil {
			wh.ObjectSelector = &metav1.LabelSelector{}
		}
		delete(wh.ObjectSelector.MatchLabels, Label)
		var exprs []metav1.LabelSelectorRequirement
		for _, e := range wh.ObjectSelector.MatchExpressions {
			if e.Key != Label && e.Key != InjectLabel {
				exprs = append(exprs, e)
			}
		}
		wh.ObjectSelector.MatchExpressions = append([]metav1.LabelSelectorRequirement{
			{Key: InjectLabel, Operator: metav1.LabelSelectorOpIn, Values: []string{"true"}},
			{Key: Label, Operator: metav1.LabelSelectorOpDoesNotExist}}, exprs...)
	default:
		return wh, false
	}
	return wh, true
}

// Labels the default tag's webhooks select by, and the mark of a deactivated injector.
const (
	InjectionLabel = "istio-injection"
	InjectLabel    = "sidecar.istio.io/inject"
	// DeactivatedLabel is istioctl's never-matching namespace selector of a deactivated
	// injector's webhooks.
	DeactivatedLabel = "istio.io/deactivated"
	// SelectorsAnnotation keeps a deactivated injector's selectors, for Reactivate.
	SelectorsAnnotation = "sailplane.dev/deactivated-selectors"
)

type savedSelectors struct {
	Namespace *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	Object    *metav1.LabelSelector `json:"objectSelector,omitempty"`
}

// Deactivate makes the default revision's injector select nothing once a default tag names
// another revision (else both would inject the same pods), as istioctl does; its selectors are
// kept in an annotation for Reactivate. false when it was deactivated already.
func Deactivate(injector *admissionregistrationv1.MutatingWebhookConfiguration) (bool, error) {
	if _, done := injector.Annotations[SelectorsAnnotation]; done {
		return false, nil
	}
	saved := map[string]savedSelectors{}
	for i := range injector.Webhooks {
		wh := &injector.Webhooks[i]
		saved[wh.Name] = savedSelectors{wh.NamespaceSelector, wh.ObjectSelector}
		wh.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{DeactivatedLabel: "never-match"}}
		wh.ObjectSelector = nil
	}
	raw, err := json.Marshal(saved)
	if err != nil {
		return false, fmt.Errorf("%w: deactivate %s: %w", ErrTag, injector.Name, err)
	}
	if injector.Annotations == nil {
		injector.Annotations = map[string]string{}
	}
	injector.Annotations[SelectorsAnnotation] = string(raw)
	return true, nil
}

// Reactivate gives a deactivated injector its selectors back (when the default tag is
// removed). false when it was not deactivated.
func Reactivate(injector *admissionregistrationv1.MutatingWebhookConfiguration) (bool, error) {
	raw, ok := injector.Annotations[SelectorsAnnotation]
	if !ok {
		return false, nil
	}
	saved := map[string]savedSelectors{}
	if err := json.Unmarshal([]byte(raw), &saved); err != nil {
		return false, fmt.Errorf("%w: reactivate %s: annotation %s: %w", ErrTag, injector.Name, SelectorsAnnotation, err)
	}
	for i := range injector.Webhooks {
		wh := &injector.Webhooks[i]
		if s, ok := saved[wh.Name]; ok {
			wh.NamespaceSelector, wh.ObjectSelector = s.Namespace, s.Object
		}
	}
	delete(injector.Annotations, SelectorsAnnotation)
	return true, nil
}
