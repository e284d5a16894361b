package kube

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/shared/schema"
)

// TestWatchNamespace runs the controller as a service account bound only to a Role in its
// namespace (as deploy/single-namespace grants): with WatchNamespace it syncs, becomes ready and
// publishes that namespace's Services and endpoints, and nothing of another namespace. Without
// WatchNamespace the same account could not list Services, Pods or Nodes cluster-wide and would
// never become ready.
func TestWatchNamespace(t *testing.T) {
	k := sharedKube(t)
	cs := clientFor(t, k.RestConfig())
	ns, other := newNamespace(t, cs, "team"), newNamespace(t, cs, "other")
	_, err := cs.RbacV1().Roles(ns).Create(ctxFor(t), &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "sailplane", Namespace: ns},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"services", "pods", "secrets"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = cs.RbacV1().RoleBindings(ns).Create(ctxFor(t), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "sailplane", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "sailplane"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "sailplane", Namespace: ns}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{ns, other} {
		createService(t, cs, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: n},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}})
		createSlice(t, cs, newSlice(n, "api-1", "api", []discovery.EndpointPort{slicePort("http", 80)},
			sliceEP("198.18.5.1", "", "", true, true, false)))
	}
	// A barrier after the other namespace's objects: once it is published, they were seen (or not).
	createService(t, cs, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "barrier", Namespace: ns},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "tcp", Port: 1}}}})

	cfg := rest.CopyConfig(k.RestConfig())
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":sailplane",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}}
	_, rec := startController(t, Config{ClusterID: "c1", Namespace: ns, WatchNamespace: ns}, Deps{Kube: cfg})

	host := func(n, svc string) string { return n + "/" + svc + "." + n + ".svc.cluster.local" }
	waitFor(t, rec, schema.Endpoints.TypeURL, host(ns, "api"), func(e *discoveryv1.Endpoints) bool {
		return len(e.GetEndpoints()) == 1 && e.GetEndpoints()[0].GetAddress() == "198.18.5.1"
	})
	waitFor(t, rec, schema.Service.TypeURL, host(ns, "barrier"), func(*discoveryv1.Service) bool { return true })
	if _, ok := rec.State(schema.Service.TypeURL)[host(other, "api")]; ok {
		t.Errorf("published %s, outside the watched namespace %s", host(other, "api"), ns)
	}
}
