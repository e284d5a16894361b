package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sailplane.dev/e2e/framework"
	sailplaneschema "sailplane.dev/shared/schema"
	"sailplane.dev/tools/testenv"
)

// singleNamespace is deploy/single-namespace's namespace, hyper's account's only one.
const singleNamespace = "sailplane"

// singleNamespaceNeeds is what hyper's services do with the Kubernetes client when scoped to
// ns: the namespaced part of serviceNeeds, in ns (the cluster-scoped features are off).
func singleNamespaceNeeds(ns string) []access {
	read := []string{"list", "watch"}
	var needs []access
	for _, k := range sailplaneschema.IstioConfig {
		needs = append(needs, each(read, access{group: k.Group, resource: k.Plural, namespace: ns})...)
		needs = append(needs, access{verb: "patch", group: k.Group, resource: k.Plural, subresource: "status", namespace: ns, name: "any"})
	}
	for _, k := range sailplaneschema.GatewayAPI {
		if k.Kind == "GatewayClass" { // cluster-scoped: off
			continue
		}
		needs = append(needs, each([]string{"get", "list", "watch"}, access{group: k.Group, resource: k.Plural, namespace: ns})...)
		if k.Kind != "ReferenceGrant" {
			needs = append(needs, access{verb: "update", group: k.Group, resource: k.Plural, subresource: "status", namespace: ns, name: "any"})
		}
	}
	for _, r := range []access{{resource: "services"}, {resource: "pods"}, {resource: "secrets"}, {group: "discovery.k8s.io", resource: "endpointslices"}} {
		r.namespace = ns
		needs = append(needs, each(read, r)...)
	}
	needs = append(needs, each(read, access{resource: "configmaps", namespace: ns, name: "istio"})...)
	needs = append(needs, each(read, access{resource: "configmaps", namespace: ns, name: "istio-sidecar-injector"})...)
	needs = append(needs, each([]string{"get", "update"}, access{group: "coordination.k8s.io", resource: "leases", namespace: ns, name: "sailplane-config-ingest-status"})...)
	needs = append(needs, access{verb: "create", group: "coordination.k8s.io", resource: "leases", namespace: ns})
	// The ca.
	needs = append(needs,
		access{verb: "get", resource: "secrets", namespace: ns, name: "cacerts"},
		access{verb: "get", resource: "secrets", namespace: ns, name: "istio-ca-secret"},
		access{verb: "update", resource: "secrets", namespace: ns, name: "istio-ca-secret"},
		access{verb: "create", resource: "secrets", namespace: ns},
		access{verb: "create", resource: "configmaps", namespace: ns})
	needs = append(needs, each([]string{"get", "list", "watch", "update"}, access{resource: "configmaps", namespace: ns, name: "istio-ca-root-cert"})...)
	// The webhook's dry-run Gateway.
	needs = append(needs, access{verb: "create", group: "networking.istio.io", resource: "gateways", namespace: ns})
	return needs
}

// clusterScopedReads are the cluster-scoped reads of the other overlays, off in a single-namespace
// install: none may be granted.
var clusterScopedReads = []access{
	{verb: "list", resource: "namespaces"},
	{verb: "list", resource: "namespaces", name: singleNamespace},
	{verb: "list", resource: "nodes"},
	{verb: "list", group: "apiextensions.k8s.io", resource: "customresourcedefinitions"},
	{verb: "list", group: "gateway.networking.k8s.io", resource: "gatewayclasses"},
	{verb: "list", group: "admissionregistration.k8s.io", resource: "mutatingwebhookconfigurations"},
	{verb: "get", group: "admissionregistration.k8s.io", resource: "mutatingwebhookconfigurations", name: "sailplane-sidecar-injector"},
	{verb: "update", group: "admissionregistration.k8s.io", resource: "validatingwebhookconfigurations", name: "sailplane-validator"},
	{verb: "create", group: "apps", resource: "deployments", namespace: singleNamespace},
}

// TestDeploySingleNamespaceRBAC applies deploy/single-namespace to a real API server and asks its
// authorizer: hyper's account may do, in its namespace, everything the services do there; the
// same requests in any other namespace or cluster-wide are refused, and so is every cluster-scoped
// read; the one cluster-wide grant is TokenReview and SubjectAccessReview.
func TestDeploySingleNamespaceRBAC(t *testing.T) {
	k := testenv.KubeForTest(t)
	kube := framework.NewKube(t, k.RestConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, obj := range kustomizeBuild(t, "single-namespace") {
		if obj.GetNamespace() != "" && obj.GetNamespace() != singleNamespace {
			t.Errorf("deploy/single-namespace: %s is outside namespace %s", ref(obj), singleNamespace)
		}
		if obj.GetKind() == "ClusterRole" || obj.GetKind() == "Role" && obj.GetNamespace() != singleNamespace {
			t.Errorf("deploy/single-namespace: %s: only Roles in %s", ref(obj), singleNamespace)
		}
		if err := serverSideApply(ctx, kube, obj, false); err != nil {
			t.Fatalf("deploy/single-namespace: %s: %v", ref(obj), err)
		}
	}
	allowed := func(a access) bool {
		t.Helper()
		review, err := kube.Clientset.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{
			Spec: authzv1.SubjectAccessReviewSpec{
				User:   "system:serviceaccount:" + singleNamespace + ":" + sailName,
				Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + singleNamespace, "system:authenticated"},
				ResourceAttributes: &authzv1.ResourceAttributes{
					Verb: a.verb, Group: a.group, Resource: a.resource, Subresource: a.subresource,
					Namespace: a.namespace, Name: a.name,
				},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("SubjectAccessReview: %v", err)
		}
		return review.Status.Allowed
	}
	for _, a := range singleNamespaceNeeds(singleNamespace) {
		if !allowed(a) {
			t.Errorf("deploy/single-namespace: %s/%s may not %s; the code needs it", singleNamespace, sailName, a)
		}
		for _, elsewhere := range []string{"default", "istio-system", ""} {
			b := a
			b.namespace = elsewhere
			if allowed(b) {
				t.Errorf("deploy/single-namespace: %s/%s may %s", singleNamespace, sailName, b)
			}
		}
	}
	for _, a := range slices.Concat(clusterScopedReads, neverAllowed) {
		if allowed(a) {
			t.Errorf("deploy/single-namespace: %s/%s may %s (cluster-scoped or never granted)", singleNamespace, sailName, a)
		}
	}
	for _, a := range []access{
		{verb: "create", group: "authentication.k8s.io", resource: "tokenreviews"},
		{verb: "create", group: "authorization.k8s.io", resource: "subjectaccessreviews"},
	} {
		if !allowed(a) {
			t.Errorf("deploy/single-namespace: %s/%s may not %s; the ca and xds-server need it", singleNamespace, sailName, a)
		}
	}
}
