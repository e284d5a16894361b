package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"sailplane.dev/shared/revision"
)

// tagCmd is istioctl's `tag`: a revision tag is a MutatingWebhookConfiguration
// istio-revision-tag-<tag> (labels istio.io/tag, istio.io/rev) copying the revision's rev.*
// injection webhooks with selectors for istio.io/rev=<tag>. Pods of namespaces labelled with
// the tag are injected by the revision it names, and config-ingest of that revision reads the
// same webhooks to own the tag's config and Gateway API status. istioctl's own tag command
// looks for webhooks named *sidecar-injector.istio.io, so Sailplane's needs this one.
func tagCmd() *cobra.Command {
	var (
		kubeconfig string
		timeout    time.Duration
	)
	cmd := &cobra.Command{
		Use:   "tag",
		Short: "Set, list and remove revision tags (istio.io/rev aliases)",
		Long: `A revision tag names a control plane revision: namespaces labelled istio.io/rev=<tag> are
injected, configured and given Gateway API status by the revision the tag points at, so that moving
the tag moves them all without relabelling (a canary upgrade, then a roll back). The tag is the
MutatingWebhookConfiguration istio-revision-tag-<tag>, in istioctl's layout.`,
	}
	cmd.PersistentFlags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
	cmd.PersistentFlags().DurationVar(&timeout, "timeout", 30*time.Second, "how long to wait for the API server")
	client := func(cmd *cobra.Command) (kubernetes.Interface, context.Context, context.CancelFunc, error) {
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		rules.ExplicitPath = kubeconfig
		rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
		if err != nil {
			return nil, nil, nil, fmt.Errorf("kubeconfig: %w", err)
		}
		kc, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return nil, nil, nil, err
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
		return kc, ctx, cancel, nil
	}

	var rev string
	var overwrite bool
	set := &cobra.Command{
		Use:   "set <tag> --revision <revision>",
		Short: "Point a tag at a revision (created, or moved with --overwrite)",
		Example: `  sailplanectl tag set prod --revision canary --overwrite
  sailplanectl tag set prod --revision default --overwrite   # roll back
  sailplanectl tag set default --revision canary             # canary injects unlabelled namespaces`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			kc, ctx, cancel, err := client(cmd)
			if err != nil {
				return err
			}
			defer cancel()
			return setTag(ctx, kc, args[0], rev, overwrite, cmd.OutOrStdout())
		},
	}
	set.Flags().StringVarP(&rev, "revision", "r", revision.Default, "the revision the tag names")
	set.Flags().BoolVar(&overwrite, "overwrite", false, "move an existing tag")

	var genRev string
	generate := &cobra.Command{
		Use:   "generate <tag> --revision <revision>",
		Short: "Print the tag's MutatingWebhookConfiguration instead of applying it (GitOps)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			kc, ctx, cancel, err := client(cmd)
			if err != nil {
				return err
			}
			defer cancel()
			wh, err := tagWebhook(ctx, kc, args[0], genRev)
			if err != nil {
				return err
			}
			return printYAML(cmd.OutOrStdout(), wh)
		},
	}
	generate.Flags().StringVarP(&genRev, "revision", "r", revision.Default, "the revision the tag names")

	list := &cobra.Command{
		Use:   "list",
		Short: "List the tags, the revision each names and the namespaces labelled with it",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			kc, ctx, cancel, err := client(cmd)
			if err != nil {
				return err
			}
			defer cancel()
			return listTags(ctx, kc, cmd.OutOrStdout())
		},
	}

	var force bool
	remove := &cobra.Command{
		Use:   "remove <tag>",
		Short: "Remove a tag; refused while namespaces are labelled with it, unless --force",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			kc, ctx, cancel, err := client(cmd)
			if err != nil {
				return err
			}
			defer cancel()
			return removeTag(ctx, kc, args[0], force, cmd.OutOrStdout())
		},
	}
	remove.Flags().BoolVar(&force, "force", false, "remove the tag even though namespaces are labelled with it (their pods will no longer be injected)")
	cmd.AddCommand(set, generate, list, remove)
	return cmd
}

// tagWebhook builds tag's webhook configuration from rev's own injector configuration.
func tagWebhook(ctx context.Context, kc kubernetes.Interface, tag, rev string) (*admissionregistrationv1.MutatingWebhookConfiguration, error) {
	whs, err := kc.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{
		LabelSelector: revision.Label + "=" + tag + ",!" + revision.TagLabel})
	if err != nil {
		return nil, fmt.Errorf("list MutatingWebhookConfigurations: %w", err)
	}
	// The default tag may share the default revision's name: it takes over from it.
	if len(whs.Items) > 0 && tag != revision.Default {
		return nil, fmt.Errorf("cannot create revision tag %q: a control plane revision has that name (MutatingWebhookConfiguration %s)", tag, whs.Items[0].Name)
	}
	whs, err = kc.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{
		LabelSelector: revision.Label + "=" + rev + ",!" + revision.TagLabel})
	if err != nil {
		return nil, fmt.Errorf("list MutatingWebhookConfigurations: %w", err)
	}
	switch len(whs.Items) {
	case 0:
		return nil, fmt.Errorf("revision %q not found: no MutatingWebhookConfiguration labelled %s=%s (is it installed?)", rev, revision.Label, rev)
	case 1:
	default:
		var names []string
		for _, w := range whs.Items {
			names = append(names, w.Name)
		}
		return nil, fmt.Errorf("revision %q: several MutatingWebhookConfigurations are labelled %s=%s (%s); keep one", rev, revision.Label, rev, strings.Join(names, ", "))
	}
	wh, err := revision.TagWebhook(tag, &whs.Items[0])
	if err != nil {
		return nil, err
	}
	return wh, nil
}

func setTag(ctx context.Context, kc kubernetes.Interface, tag, rev string, overwrite bool, out io.Writer) error {
	wh, err := tagWebhook(ctx, kc, tag, rev)
	if err != nil {
		return err
	}
	api := kc.AdmissionregistrationV1().MutatingWebhookConfigurations()
	old, err := api.Get(ctx, wh.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if _, err := api.Create(ctx, wh, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create %s: %w", wh.Name, err)
		}
		fmt.Fprintf(out, "tag %s now names revision %s\n", tag, rev)
		return deactivateDefault(ctx, kc, tag, out)
	case err != nil:
		return fmt.Errorf("read %s: %w", wh.Name, err)
	case !overwrite && old.Labels[revision.Label] != rev:
		return fmt.Errorf("revision tag %q already names revision %q; --overwrite moves it", tag, old.Labels[revision.Label])
	}
	wh.ResourceVersion = old.ResourceVersion
	if _, err := api.Update(ctx, wh, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update %s: %w", wh.Name, err)
	}
	fmt.Fprintf(out, "tag %s now names revision %s (was %s); restart the pods of its namespaces to inject the new revision's proxies\n", tag, rev, old.Labels[revision.Label])
	return deactivateDefault(ctx, kc, tag, out)
}

// defaultInjectors are the default revision's own injector configurations (not a tag's).
func defaultInjectors(ctx context.Context, kc kubernetes.Interface) ([]admissionregistrationv1.MutatingWebhookConfiguration, error) {
	whs, err := kc.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{
		LabelSelector: revision.Label + "=" + revision.Default + ",!" + revision.TagLabel})
	if err != nil {
		return nil, fmt.Errorf("list MutatingWebhookConfigurations: %w", err)
	}
	return whs.Items, nil
}

// deactivateDefault turns the default revision's injector off once the default tag exists, as
// istioctl does: otherwise it would inject the pods the tag's revision injects too.
func deactivateDefault(ctx context.Context, kc kubernetes.Interface, tag string, out io.Writer) error {
	if tag != revision.Default {
		return nil
	}
	injectors, err := defaultInjectors(ctx, kc)
	if err != nil {
		return err
	}
	for i := range injectors {
		wh := &injectors[i]
		changed, err := revision.Deactivate(wh)
		if err != nil || !changed {
			return err
		}
		if _, err := kc.AdmissionregistrationV1().MutatingWebhookConfigurations().Update(ctx, wh, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("deactivate %s: %w", wh.Name, err)
		}
		fmt.Fprintf(out, "%s deactivated (the default tag injects instead; removing the tag reactivates it)\n", wh.Name)
	}
	return nil
}

// reactivateDefault gives the default revision's injector its selectors back; false when none
// was deactivated.
func reactivateDefault(ctx context.Context, kc kubernetes.Interface, out io.Writer) (bool, error) {
	injectors, err := defaultInjectors(ctx, kc)
	if err != nil {
		return false, err
	}
	done := false
	for i := range injectors {
		wh := &injectors[i]
		changed, err := revision.Reactivate(wh)
		if err != nil {
			return done, err
		}
		if !changed {
			continue
		}
		if _, err := kc.AdmissionregistrationV1().MutatingWebhookConfigurations().Update(ctx, wh, metav1.UpdateOptions{}); err != nil {
			return done, fmt.Errorf("reactivate %s: %w", wh.Name, err)
		}
		fmt.Fprintf(out, "%s reactivated\n", wh.Name)
		done = true
	}
	return done, nil
}

func listTags(ctx context.Context, kc kubernetes.Interface, out io.Writer) error {
	whs, err := kc.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{LabelSelector: revision.TagLabel})
	if err != nil {
		return fmt.Errorf("list MutatingWebhookConfigurations: %w", err)
	}
	slices.SortFunc(whs.Items, func(a, b admissionregistrationv1.MutatingWebhookConfiguration) int {
		return strings.Compare(a.Labels[revision.TagLabel], b.Labels[revision.TagLabel])
	})
	t := table{header: []string{"TAG", "REVISION", "NAMESPACES"}}
	for _, w := range whs.Items {
		tag := w.Labels[revision.TagLabel]
		ns, err := taggedNamespaces(ctx, kc, tag)
		if err != nil {
			return err
		}
		t.add(tag, w.Labels[revision.Label], strings.Join(ns, ","))
	}
	return writeOutput(out, formatTable, t, nil)
}

func taggedNamespaces(ctx context.Context, kc kubernetes.Interface, tag string) ([]string, error) {
	nss, err := kc.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: revision.Label + "=" + tag})
	if err != nil {
		return nil, fmt.Errorf("list namespaces: %w", err)
	}
	var out []string
	for _, n := range nss.Items {
		out = append(out, n.Name)
	}
	slices.Sort(out)
	return out, nil
}

func removeTag(ctx context.Context, kc kubernetes.Interface, tag string, force bool, out io.Writer) error {
	name := revision.TagWebhookName(tag)
	api := kc.AdmissionregistrationV1().MutatingWebhookConfigurations()
	wh, err := api.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || (err == nil && wh.Labels[revision.TagLabel] != tag) {
		return fmt.Errorf("revision tag %q not found (no MutatingWebhookConfiguration %s labelled %s=%s)", tag, name, revision.TagLabel, tag)
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", name, err)
	}
	// Without the default tag, the default revision injects its namespaces again, if installed.
	var ns []string
	if tag != revision.Default || !hasDeactivatedDefault(ctx, kc) {
		if ns, err = taggedNamespaces(ctx, kc, tag); err != nil {
			return err
		}
	}
	if len(ns) > 0 && !force {
		return fmt.Errorf("revision tag %q is still used by namespaces %s: their new pods would no longer be injected; relabel them, or --force", tag, strings.Join(ns, ", "))
	}
	if err := api.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &wh.ResourceVersion}}); err != nil {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	fmt.Fprintf(out, "tag %s removed\n", tag)
	if tag == revision.Default {
		_, err := reactivateDefault(ctx, kc, out)
		return err
	}
	return nil
}

func hasDeactivatedDefault(ctx context.Context, kc kubernetes.Interface) bool {
	injectors, err := defaultInjectors(ctx, kc)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(injectors, func(wh admissionregistrationv1.MutatingWebhookConfiguration) bool {
		_, ok := wh.Annotations[revision.SelectorsAnnotation]
		return ok
	})
}

func printYAML(w io.Writer, obj any) error {
	js, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	b, err := yaml.JSONToYAML(js)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}
