package kube

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
	"sailplane.dev/tools/testenv"
)

// TestNetworkGateways: a Service labelled with a network is that network's east-west gateway
// at its load balancer and external addresses, in each cluster that has it, as istiod reads
// it; without the gateway port it is none. A Service without the label lists its outside
// addresses with no network and port, for meshNetworks' registryServiceName.
func TestNetworkGateways(t *testing.T) {
	primary := sharedKube(t)
	pcs := clientFor(t, primary.RestConfig())
	remote := testenv.KubeForTest(t)
	rcs := clientFor(t, remote.RestConfig())
	ctlNS := newNamespace(t, pcs, "cp")
	ns := newNamespace(t, pcs, "gw")
	createNamespace(t, rcs, ns)

	gateway := func(cs kubernetes.Interface, name, network string, labels map[string]string, port int32, lb, external string) {
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{LabelNetwork: network}},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ExternalIPs: []string{external},
				Ports: []corev1.ServicePort{{Name: "tls", Port: port}}},
		}
		for k, v := range labels {
			svc.Labels[k] = v
		}
		svc = createService(t, cs, svc)
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lb}}
		if _, err := cs.CoreV1().Services(ns).UpdateStatus(ctxFor(t), svc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	gateway(pcs, "eastwest", "net1", nil, 15443, "198.18.1.100", "198.18.1.101")
	gateway(rcs, "eastwest", "net2", nil, 15443, "198.18.2.100", "198.18.2.101")
	gateway(pcs, "custom", "net1", map[string]string{LabelGatewayPort: "8443"}, 8443, "198.18.1.110", "198.18.1.111")
	gateway(pcs, "portless", "net1", map[string]string{LabelGatewayPort: "8443"}, 15443, "198.18.1.120", "198.18.1.121")
	gateway(pcs, "plain", "", nil, 80, "198.18.1.130", "198.18.1.131") // for meshNetworks' registryServiceName

	_, rec := startController(t, Config{ClusterID: "cluster1", Namespace: ctlNS}, Deps{Kube: primary.RestConfig()})
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "remotes", Namespace: ctlNS, Labels: map[string]string{LabelMultiCluster: "true"}},
		Data:       map[string][]byte{"cluster2": readFile(t, remote.KubeconfigPath())},
	}
	if _, err := pcs.CoreV1().Secrets(ctlNS).Create(ctxFor(t), secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	gws := func(name string, want ...*discoveryv1.NetworkGateway) {
		t.Helper()
		host := name + "." + ns + ".svc.cluster.local"
		var got []*discoveryv1.NetworkGateway
		rec.WaitForState(t, timeout, func(st map[string]map[string]*bus.Resource) bool {
			r, ok := st[schema.Service.TypeURL][ns+"/"+host]
			if !ok {
				return false
			}
			got = r.Body.(*discoveryv1.Service).GetNetworkGateways()
			if len(got) != len(want) {
				return false
			}
			for i := range got {
				if !proto.Equal(got[i], want[i]) {
					return false
				}
			}
			return true
		})
	}
	gw := func(network, cluster, addr string, port uint32) *discoveryv1.NetworkGateway {
		return &discoveryv1.NetworkGateway{Network: network, ClusterId: cluster, Address: addr, Port: port}
	}
	gws("eastwest", gw("net1", "cluster1", "198.18.1.100", 15443), gw("net1", "cluster1", "198.18.1.101", 15443),
		gw("net2", "cluster2", "198.18.2.100", 15443), gw("net2", "cluster2", "198.18.2.101", 15443))
	gws("custom", gw("net1", "cluster1", "198.18.1.110", 8443), gw("net1", "cluster1", "198.18.1.111", 8443))
	gws("portless")
	gws("plain", gw("", "cluster1", "198.18.1.130", 0), gw("", "cluster1", "198.18.1.131", 0))
}

// TestClusterNetwork: a cluster's endpoints whose Pod has no network label are in the network
// its control-plane namespace is labelled with, as in istiod; relabelling the namespace moves
// them, and the Pod's own label wins.
func TestClusterNetwork(t *testing.T) {
	k := sharedKube(t)
	cs := clientFor(t, k.RestConfig())
	ctlNS := newNamespace(t, cs, "cp")
	ns := newNamespace(t, cs, "app")
	createService(t, cs, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: ns},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}})
	createPod(t, cs, podSpec{ns: ns, name: "plain", ip: "198.18.4.1", ready: true})
	createPod(t, cs, podSpec{ns: ns, name: "own", ip: "198.18.4.2", ready: true, labels: map[string]string{LabelNetwork: "own"}})
	createSlice(t, cs, newSlice(ns, "api-1", "api", []discovery.EndpointPort{slicePort("http", 80)},
		sliceEP("198.18.4.1", "plain", "", true, true, false), sliceEP("198.18.4.2", "own", "", true, true, false)))

	_, rec := startController(t, Config{ClusterID: "cluster1", Namespace: ctlNS}, Deps{Kube: k.RestConfig()})
	name := ns + "/api." + ns + ".svc.cluster.local"
	networks := func(want ...string) {
		t.Helper()
		waitFor(t, rec, schema.Endpoints.TypeURL, name, func(e *discoveryv1.Endpoints) bool {
			var got []string
			for _, ep := range e.GetEndpoints() {
				got = append(got, ep.GetNetwork())
			}
			return slices.Equal(got, want)
		})
	}
	networks("", "own")
	label := func(network string) {
		t.Helper()
		n, err := cs.CoreV1().Namespaces().Get(ctxFor(t), ctlNS, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		n.Labels[LabelNetwork] = network
		if _, err := cs.CoreV1().Namespaces().Update(ctxFor(t), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	label("net1")
	networks("net1", "own")
	label("net2")
	networks("net2", "own")
}
