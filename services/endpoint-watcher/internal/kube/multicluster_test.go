package kube

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/tools/testenv"
)

// TestRemoteClusters registers real API servers through kubeconfig Secrets, rotates and
// removes them, all without restarting the controller.
func TestRemoteClusters(t *testing.T) {
	primary := sharedKube(t)
	pcs := clientFor(t, primary.RestConfig())
	r1, r2 := testenv.KubeForTest(t), testenv.KubeForTest(t)
	cs1, cs2 := clientFor(t, r1.RestConfig()), clientFor(t, r2.RestConfig())

	ctlNS := newNamespace(t, pcs, "cp")
	ns := newNamespace(t, pcs, "multi")
	createNamespace(t, cs1, ns)
	createNamespace(t, cs2, ns)
	httpPort := corev1.ServicePort{Name: "http", Port: 80}
	grpcPort := corev1.ServicePort{Name: "grpc-x", Port: 90}
	apiService := func(cs kubernetes.Interface, addr string, ports ...corev1.ServicePort) *corev1.Service {
		svc := createService(t, cs, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: ns},
			Spec: corev1.ServiceSpec{Ports: ports}})
		var sp []discovery.EndpointPort
		for _, p := range ports {
			sp = append(sp, slicePort(p.Name, p.Port))
		}
		createSlice(t, cs, newSlice(ns, "api-1", "api", sp, sliceEP(addr, "", "", true, true, false)))
		return svc
	}
	psvc := apiService(pcs, "198.18.2.1", httpPort)
	apiService(cs1, "198.18.2.2", httpPort, grpcPort)
	apiService(cs2, "198.18.2.3", httpPort)

	_, rec := startController(t, Config{ClusterID: "primary", Namespace: ctlNS}, Deps{Kube: primary.RestConfig()})

	host := "api." + ns + ".svc.cluster.local"
	name := ns + "/" + host
	ep := func(addr, cluster string, ports ...string) *discoveryv1.Endpoint {
		e := &discoveryv1.Endpoint{Address: addr, ClusterId: cluster, Ports: map[string]uint32{}}
		for _, p := range ports {
			e.Ports[p] = map[string]uint32{"http": 80, "grpc-x": 90}[p]
		}
		return e
	}
	endpoints := func(eps ...*discoveryv1.Endpoint) *discoveryv1.Endpoints {
		return &discoveryv1.Endpoints{Hostname: host, Namespace: ns, Endpoints: eps}
	}
	service := func(ports ...*discoveryv1.Port) *discoveryv1.Service {
		return &discoveryv1.Service{Hostname: host, Namespace: ns, Ports: ports, Addresses: psvc.Spec.ClusterIPs,
			Registry: "kubernetes", ClusterId: "primary"}
	}
	httpSP := &discoveryv1.Port{Name: "http", Number: 80, Protocol: "HTTP"}
	grpcSP := &discoveryv1.Port{Name: "grpc-x", Number: 90, Protocol: "GRPC"}
	waitEndpoints(t, rec, name, endpoints(ep("198.18.2.1", "primary", "http")))

	secrets := pcs.CoreV1().Secrets(ctlNS)
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "remotes", Namespace: ctlNS, Labels: map[string]string{LabelMultiCluster: "true"}},
		Data:       map[string][]byte{"remote-1": readFile(t, r1.KubeconfigPath())},
	}
	secret, err := secrets.Create(ctxFor(t), secret, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Merged: one Service with the ports' union and the primary's address; endpoints of both.
	waitService(t, rec, name, service(httpSP, grpcSP))
	waitEndpoints(t, rec, name, endpoints(ep("198.18.2.1", "primary", "http"), ep("198.18.2.2", "remote-1", "http", "grpc-x")))

	t.Run("kubeconfig rotated to another cluster", func(t *testing.T) {
		secret.Data = map[string][]byte{"remote-1": readFile(t, r2.KubeconfigPath())}
		if secret, err = secrets.Update(ctxFor(t), secret, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitService(t, rec, name, service(httpSP))
		waitEndpoints(t, rec, name, endpoints(ep("198.18.2.1", "primary", "http"), ep("198.18.2.3", "remote-1", "http")))
	})
	t.Run("cluster ID changed", func(t *testing.T) {
		secret.Data = map[string][]byte{"remote-2": readFile(t, r2.KubeconfigPath())}
		if secret, err = secrets.Update(ctxFor(t), secret, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitEndpoints(t, rec, name, endpoints(ep("198.18.2.1", "primary", "http"), ep("198.18.2.3", "remote-2", "http")))
	})
	t.Run("remote endpoints follow the remote cluster", func(t *testing.T) {
		sl, err := cs2.DiscoveryV1().EndpointSlices(ns).Get(ctxFor(t), "api-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sl.Endpoints = append(sl.Endpoints, sliceEP("198.18.2.4", "", "", true, true, false))
		updateSlice(t, cs2, sl)
		waitEndpoints(t, rec, name, endpoints(ep("198.18.2.1", "primary", "http"),
			ep("198.18.2.3", "remote-2", "http"), ep("198.18.2.4", "remote-2", "http")))
	})
	t.Run("secret deleted", func(t *testing.T) {
		if err := secrets.Delete(ctxFor(t), secret.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitEndpoints(t, rec, name, endpoints(ep("198.18.2.1", "primary", "http")))
	})
	t.Run("service only in a remote cluster", func(t *testing.T) {
		createService(t, cs1, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "only-remote", Namespace: ns},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{httpPort}}})
		s := secret.DeepCopy()
		s.ResourceVersion = ""
		s.Data = map[string][]byte{"remote-1": readFile(t, r1.KubeconfigPath())}
		if _, err := secrets.Create(ctxFor(t), s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		h := "only-remote." + ns + ".svc.cluster.local"
		waitFor(t, rec, "sailplane.dev/discovery/v1/Service", ns+"/"+h, func(s *discoveryv1.Service) bool {
			return s.ClusterId == "remote-1"
		})
	})
}
