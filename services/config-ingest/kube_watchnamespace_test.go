package configingest_test

import (
	"testing"

	"google.golang.org/protobuf/proto"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	configingest "sailplane.dev/services/config-ingest"
	"sailplane.dev/shared/schema"
)

// TestKubeWatchNamespace runs config-ingest as a service account bound only to a Role in its
// namespace (as deploy/single-namespace grants): with WatchNamespace it becomes ready, publishes
// that namespace's config and the namespace itself, and nothing of another namespace. Without
// WatchNamespace the same account could not list Namespaces or config cluster-wide and would
// never become ready.
func TestKubeWatchNamespace(t *testing.T) {
	e := newKenv(t, sharedKube(t))
	ctx := e.ctx()
	other := e.ns("other", nil)
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update"}},
	}
	for _, k := range append(schema.IstioConfig, schema.GatewayAPI...) {
		rules = append(rules,
			rbacv1.PolicyRule{APIGroups: []string{k.Group}, Resources: []string{k.Plural}, Verbs: []string{"get", "list", "watch"}},
			rbacv1.PolicyRule{APIGroups: []string{k.Group}, Resources: []string{k.Plural + "/status"}, Verbs: []string{"patch", "update"}})
	}
	if _, err := e.kube.RbacV1().Roles(e.cp).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "sailplane", Namespace: e.cp}, Rules: rules,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.kube.RbacV1().RoleBindings(e.cp).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "sailplane", Namespace: e.cp},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "sailplane"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "sailplane", Namespace: e.cp}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.createVS(e.cp, "reviews", vsSpec("reviews", 0))
	e.createVS(other, "reviews", vsSpec("reviews-other", 0))

	in := e.start("pod-0", func(c *configingest.Config) {
		c.Kube = rest.CopyConfig(c.Kube)
		c.Kube.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + e.cp + ":sailplane",
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + e.cp, "system:authenticated"}}
		c.WatchNamespace = e.cp
	})
	if got := in.rec.body(schema.VirtualService, e.cp+"/reviews"); !proto.Equal(got, vsSpec("reviews", 0)) {
		t.Errorf("%s/reviews: got %v", e.cp, got)
	}
	if got := in.rec.body(schema.VirtualService, other+"/reviews"); got != nil {
		t.Errorf("%s/reviews published, outside the watched namespace %s", other, e.cp)
	}
	if in.rec.body(schema.Namespace, e.cp) == nil {
		t.Errorf("namespace %s not published", e.cp)
	}
	if in.rec.body(schema.Namespace, other) != nil {
		t.Errorf("namespace %s published, outside the watched namespace", other)
	}
}
