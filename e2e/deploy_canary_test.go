package e2e

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/tools/testenv"
)

// deploy/hyper-canary installed beside deploy/hyper: the shared account may do what the canary
// revision does with its own names (and not the default revision's Lease... nor more than its
// own webhook configurations), and `sailplanectl tag generate` finds the canary's injector and
// points the tag at the canary's webhook Service.
func TestDeployCanaryOverlay(t *testing.T) {
	k := testenv.KubeForTest(t, testenv.WithoutIstioCRDs())
	kube := framework.NewKube(t, k.RestConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, overlay := range []string{"hyper", "hyper-canary"} {
		for _, obj := range kustomizeBuild(t, overlay) {
			if err := serverSideApply(ctx, kube, obj, false); err != nil {
				t.Fatalf("deploy/%s: %s: %v", overlay, ref(obj), err)
			}
		}
	}
	may := func(a access) bool {
		t.Helper()
		review, err := kube.Clientset.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{
			Spec: authzv1.SubjectAccessReviewSpec{
				User:   "system:serviceaccount:istio-system:sailplane",
				Groups: []string{"system:serviceaccounts", "system:serviceaccounts:istio-system", "system:authenticated"},
				ResourceAttributes: &authzv1.ResourceAttributes{
					Verb: a.verb, Group: a.group, Resource: a.resource, Namespace: a.namespace, Name: a.name,
				},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return review.Status.Allowed
	}
	adm := "admissionregistration.k8s.io"
	var needs []access
	needs = append(needs, each([]string{"get", "list", "watch", "update"}, access{group: adm, resource: "mutatingwebhookconfigurations", name: "sailplane-sidecar-injector-canary"})...)
	needs = append(needs, each([]string{"get", "list", "watch", "update"}, access{group: adm, resource: "validatingwebhookconfigurations", name: "sailplane-validator-canary"})...)
	needs = append(needs, each([]string{"list", "watch"}, access{resource: "configmaps", namespace: "istio-system", name: "istio-canary"})...)
	needs = append(needs, each([]string{"list", "watch"}, access{resource: "configmaps", namespace: "istio-system", name: "istio-sidecar-injector-canary"})...)
	needs = append(needs, each([]string{"get", "update"}, access{group: "coordination.k8s.io", resource: "leases", namespace: "istio-system", name: "sailplane-config-ingest-status-canary"})...)
	needs = append(needs, each([]string{"list", "watch"}, access{group: adm, resource: "mutatingwebhookconfigurations"})...)
	for _, a := range needs {
		if !may(a) {
			t.Errorf("deploy/hyper-canary: istio-system/sailplane may not %s; the canary revision needs it", a)
		}
	}
	for _, a := range []access{
		{verb: "update", group: adm, resource: "mutatingwebhookconfigurations", name: "istio-revision-tag-prod"},
		{verb: "update", group: adm, resource: "mutatingwebhookconfigurations", name: "someone-else"},
	} {
		if may(a) {
			t.Errorf("deploy/hyper-canary: istio-system/sailplane may %s", a)
		}
	}

	out, err := exec.Command(framework.Binary(t, "sailplanectl"), "tag", "generate", "prod", "--revision", "canary", "--kubeconfig", k.KubeconfigPath()).CombinedOutput()
	if err != nil {
		t.Fatalf("sailplanectl tag generate: %v\n%s", err, out)
	}
	for _, want := range []string{"name: istio-revision-tag-prod", "istio.io/tag: prod", "istio.io/rev: canary", "name: sailplane-webhook-canary", "- prod"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the tag webhook lacks %q:\n%s", want, out)
		}
	}
}
