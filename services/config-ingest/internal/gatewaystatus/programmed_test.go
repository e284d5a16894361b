package gatewaystatus

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"sailplane.dev/shared/gatewayapi"
	"sailplane.dev/shared/testwait"
)

// A manually deployed Gateway is Programmed, as in istiod, only once its Service has endpoints
// and, for a LoadBalancer, an address; its status.addresses are the Service's host name, or the
// LoadBalancer's address once it has one (not the cluster IP), and are never emptied once set.
func TestWriterProgrammedFollowsService(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	e.start(Config{Translate: gatewayapi.Translate}, true, nil)
	svcAPI := e.kube.CoreV1().Services(e.ns)
	svc, err := svcAPI.Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "gw-svc"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hostname := gwv1.HostnameAddressType
	if _, err := e.gw.GatewayV1().Gateways(e.ns).Create(ctx, &gwv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: "manual"},
		Spec: gwv1.GatewaySpec{GatewayClassName: gwv1.ObjectName(e.class),
			Addresses: []gwv1.GatewaySpecAddress{{Type: &hostname, Value: "gw-svc"}},
			Listeners: []gwv1.Listener{{Name: "http", Port: 80, Protocol: gwv1.HTTPProtocolType}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitProgrammed := func(what, status, reason string, addrs ...string) {
		t.Helper()
		testwait.Until(t, waitTimeout, "Gateway manual: "+what, func() bool {
			g, err := e.gw.GatewayV1().Gateways(e.ns).Get(ctx, "manual", metav1.GetOptions{})
			if err != nil {
				return false
			}
			c, _ := findCondition(g.Status.Conditions, "Programmed")
			var got []string
			for _, a := range g.Status.Addresses {
				got = append(got, a.Value)
			}
			return string(c.Status) == status && c.Reason == reason && equalStrings(got, addrs)
		})
	}
	waitProgrammed("no endpoints", "False", "AddressNotAssigned")

	ready := true
	if _, err := e.kube.DiscoveryV1().EndpointSlices(e.ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "gw-svc-1", Labels: map[string]string{discoveryv1.LabelServiceName: "gw-svc"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"198.18.0.5"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitProgrammed("endpoints", "True", "Programmed", "gw-svc."+e.ns+".svc.cluster.local")

	svc, err = svcAPI.Get(ctx, svc.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Spec.Type = corev1.ServiceTypeLoadBalancer
	if svc, err = svcAPI.Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Not Programmed, but the address once reported stays, as in istiod.
	waitProgrammed("LoadBalancer address pending", "False", "AddressNotAssigned", "gw-svc."+e.ns+".svc.cluster.local")

	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.18.9.1"}}
	if _, err := svcAPI.UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitProgrammed("LoadBalancer address", "True", "Programmed", "198.18.9.1")
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
