package configingest_test

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	configingest "sailplane.dev/services/config-ingest"
)

// TestKubeGatewayDeployment: with GatewayDeployment, the replica holding the status Lease
// deploys a Gateway's objects; when it stops, the new leader catches up with what changed.
func TestKubeGatewayDeployment(t *testing.T) {
	e := newKenv(t, sharedKube(t))
	installGatewayCRDs(t, e)
	ns := e.ns("gw", nil)
	on := func(c *configingest.Config) { c.GatewayDeployment = true }
	ins := map[string]*kingest{"pod-a": e.start("pod-a", on), "pod-b": e.start("pod-b", on)}
	var leader string
	waitFor(t, "a leader", func() bool {
		for name, in := range ins {
			if in.svc.StatusLeader() {
				leader = name
				return true
			}
		}
		return false
	})
	gc := gwclient.NewForConfigOrDie(e.k.RestConfig())
	gw := &gwv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: "edge", Namespace: ns},
		Spec:       gwv1.GatewaySpec{GatewayClassName: "istio", Listeners: []gwv1.Listener{{Name: "http", Port: 80, Protocol: gwv1.HTTPProtocolType}}},
	}
	if _, err := gc.GatewayV1().Gateways(ns).Create(e.ctx(), gw, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	servicePorts := func() []int32 {
		s, err := e.kube.CoreV1().Services(ns).Get(e.ctx(), "edge-istio", metav1.GetOptions{})
		if err != nil {
			return nil
		}
		var out []int32
		for _, p := range s.Spec.Ports {
			out = append(out, p.Port)
		}
		return out
	}
	waitFor(t, "the gateway's Service", func() bool { return slices.Equal(servicePorts(), []int32{15021, 80}) })
	if _, err := e.kube.AppsV1().Deployments(ns).Get(e.ctx(), "edge-istio", metav1.GetOptions{}); err != nil {
		t.Fatalf("the gateway's Deployment: %v", err)
	}

	ins[leader].stop()
	cur, err := gc.GatewayV1().Gateways(ns).Get(e.ctx(), "edge", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.Listeners = append(cur.Spec.Listeners, gwv1.Listener{Name: "alt", Port: 8080, Protocol: gwv1.HTTPProtocolType})
	if _, err := gc.GatewayV1().Gateways(ns).Update(e.ctx(), cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the new leader applies the edit", func() bool { return slices.Equal(servicePorts(), []int32{15021, 80, 8080}) })
}

// TestKubeGatewayDeploymentDiscoverySelectors: a Gateway of a namespace the discoverySelectors
// leave out of the mesh is not deployed; once its namespace is selected, it is.
func TestKubeGatewayDeploymentDiscoverySelectors(t *testing.T) {
	e := newKenv(t, sharedKube(t))
	installGatewayCRDs(t, e)
	out := e.ns("gwout", nil)
	e.setMesh("discoverySelectors:\n- matchLabels: {mesh-" + e.id + ": \"yes\"}\n")
	gc := gwclient.NewForConfigOrDie(e.k.RestConfig())
	gw := &gwv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: "edge", Namespace: out},
		Spec:       gwv1.GatewaySpec{GatewayClassName: "istio", Listeners: []gwv1.Listener{{Name: "http", Port: 80, Protocol: gwv1.HTTPProtocolType}}},
	}
	if _, err := gc.GatewayV1().Gateways(out).Create(e.ctx(), gw, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ing := e.start("pod-0", func(c *configingest.Config) { c.GatewayDeployment = true })
	waitFor(t, "the leader", ing.svc.StatusLeader)
	waitFor(t, "the controller started", func() bool { return ing.logs.Count("gateway deployment controller synced") > 0 })
	deployedIn := func(ns string) func() bool {
		return func() bool {
			_, err := e.kube.CoreV1().Services(ns).Get(e.ctx(), "edge-istio", metav1.GetOptions{})
			return err == nil
		}
	}
	deployed := deployedIn(out)
	// A barrier: a Gateway of the control plane's namespace (always in the mesh), queued after
	// the one above (queued once the controller started), is deployed. (The controller's own
	// tests check the negative exactly: TestNotSelected.)
	cpGW := gw.DeepCopy()
	cpGW.Namespace = e.cp
	if _, err := gc.GatewayV1().Gateways(e.cp).Create(e.ctx(), cpGW, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the control plane namespace's Gateway deployed", deployedIn(e.cp))
	n, err := e.kube.CoreV1().Namespaces().Get(e.ctx(), out, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if deployed() {
		t.Fatal("a Gateway outside the discoverySelectors was deployed")
	}
	n.Labels = map[string]string{"mesh-" + e.id: "yes"}
	if _, err := e.kube.CoreV1().Namespaces().Update(e.ctx(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "deployed once its namespace is selected", deployed)
}

// installGatewayCRDs installs the Gateway API CRDs on the shared API server (already installed
// is fine).
func installGatewayCRDs(t *testing.T, e *kenv) {
	t.Helper()
	if err := e.k.InstallGatewayAPICRDs(e.ctx()); err != nil {
		t.Fatal(err)
	}
}

// TestKubeGatewayProgrammed: a deployed Gateway is Programmed only once its generated
// Deployment has a ready replica, and then carries its Service's host name, as istiod writes it:
// the status writer follows the deployment controller's objects.
func TestKubeGatewayProgrammed(t *testing.T) {
	e := newKenv(t, sharedKube(t))
	installGatewayCRDs(t, e)
	ns := e.ns("gwprog", nil)
	ing := e.start("pod-0", func(c *configingest.Config) { c.GatewayDeployment = true })
	waitFor(t, "the leader", ing.svc.StatusLeader)
	gc := gwclient.NewForConfigOrDie(e.k.RestConfig())
	gw := &gwv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: "edge", Namespace: ns,
			Annotations: map[string]string{"networking.istio.io/service-type": "ClusterIP"}},
		Spec: gwv1.GatewaySpec{GatewayClassName: "istio", Listeners: []gwv1.Listener{{Name: "http", Port: 80, Protocol: gwv1.HTTPProtocolType}}},
	}
	if _, err := gc.GatewayV1().Gateways(ns).Create(e.ctx(), gw, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	programmed := func() (metav1.Condition, []gwv1.GatewayStatusAddress) {
		cur, err := gc.GatewayV1().Gateways(ns).Get(e.ctx(), "edge", metav1.GetOptions{})
		if err != nil {
			return metav1.Condition{}, nil
		}
		for _, c := range cur.Status.Conditions {
			if c.Type == string(gwv1.GatewayConditionProgrammed) {
				return c, cur.Status.Addresses
			}
		}
		return metav1.Condition{}, nil
	}
	waitFor(t, "Programmed False while no replica is ready", func() bool {
		c, _ := programmed()
		return c.Status == metav1.ConditionFalse && strings.Contains(c.Message, "no instances found")
	})
	dep, err := e.kube.AppsV1().Deployments(ns).Get(e.ctx(), "edge-istio", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dep.Status.Replicas, dep.Status.ReadyReplicas = 1, 1
	if _, err := e.kube.AppsV1().Deployments(ns).UpdateStatus(e.ctx(), dep, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A ClusterIP Service has no external address: istiod reports its host name (class istio's
	// address type), not its cluster IP (e2e TestGatewayStatusMatchesIstiod).
	host := "edge-istio." + ns + ".svc.cluster.local"
	waitFor(t, "Programmed True with the Service's host name once a replica is ready", func() bool {
		c, addrs := programmed()
		return c.Status == metav1.ConditionTrue && len(addrs) == 1 && addrs[0].Value == host
	})
}

// TestKubeGatewayInvalidParameters: a Gateway whose parametersRef names a ConfigMap that does
// not exist, or a kind other than ConfigMap, is Accepted=False with reason InvalidParameters
// (the deployment controller's verdict in the status); once the ConfigMap exists, Accepted.
func TestKubeGatewayInvalidParameters(t *testing.T) {
	e := newKenv(t, sharedKube(t))
	installGatewayCRDs(t, e)
	ns := e.ns("gwparams", nil)
	ing := e.start("pod-0", func(c *configingest.Config) { c.GatewayDeployment = true })
	waitFor(t, "the leader", ing.svc.StatusLeader)
	gc := gwclient.NewForConfigOrDie(e.k.RestConfig())
	gw := &gwv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: "edge", Namespace: ns},
		Spec: gwv1.GatewaySpec{GatewayClassName: "istio", Listeners: []gwv1.Listener{{Name: "http", Port: 80, Protocol: gwv1.HTTPProtocolType}},
			Infrastructure: &gwv1.GatewayInfrastructure{ParametersRef: &gwv1.LocalParametersReference{Group: "invalid.io", Kind: "InvalidParameters", Name: "params"}}},
	}
	if _, err := gc.GatewayV1().Gateways(ns).Create(e.ctx(), gw, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	accepted := func() metav1.Condition {
		cur, err := gc.GatewayV1().Gateways(ns).Get(e.ctx(), "edge", metav1.GetOptions{})
		if err != nil {
			return metav1.Condition{}
		}
		for _, c := range cur.Status.Conditions {
			if c.Type == string(gwv1.GatewayConditionAccepted) {
				return c
			}
		}
		return metav1.Condition{}
	}
	invalid := func(what string) func() bool {
		return func() bool {
			c := accepted()
			return c.Status == metav1.ConditionFalse && c.Reason == string(gwv1.GatewayReasonInvalidParameters) && strings.Contains(c.Message, what)
		}
	}
	waitFor(t, "Accepted False for a parametersRef of another kind", invalid(`kind "InvalidParameters" of group "invalid.io" is not supported`))

	cur, err := gc.GatewayV1().Gateways(ns).Get(e.ctx(), "edge", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.Infrastructure.ParametersRef = &gwv1.LocalParametersReference{Kind: "ConfigMap", Name: "params"}
	if _, err := gc.GatewayV1().Gateways(ns).Update(e.ctx(), cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "Accepted False for a missing ConfigMap", invalid("ConfigMap "+ns+"/params not found"))

	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "params", Namespace: ns}}
	if _, err := e.kube.CoreV1().ConfigMaps(ns).Create(e.ctx(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "Accepted True once the ConfigMap exists", func() bool { return accepted().Status == metav1.ConditionTrue })
}
