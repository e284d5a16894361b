package e2e

import (
	"context"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/spiffe"
	"sailplane.dev/shared/workloadcert"
	"sailplane.dev/tools/testenv"
)

// sailplaneOnKube is Sailplane reading config and endpoints from a real API server.
type sailplaneOnKube struct {
	xds       string
	configBus string       // where the Istio config is published: hyper's bus or config-ingest's
	busSec    bus.Security // how a test consumes configBus
	// Microservices only: the ca, its root, and endpoint-watcher's bus.
	caAddr, rootFile, registryBus string
	procs                         []*framework.Process
}

// logSince returns what the processes logged after the offsets returned by logOffsets.
func (s sailplaneOnKube) logSince(offsets []int) string {
	var b strings.Builder
	for i, p := range s.procs {
		b.WriteString(p.Log()[offsets[i]:])
	}
	return b.String()
}

func (s sailplaneOnKube) logOffsets() []int {
	var offs []int
	for _, p := range s.procs {
		offs = append(offs, len(p.Log()))
	}
	return offs
}

// kubeTopologies start Sailplane against a Kubernetes API server, as one hyper process and as
// separate services.
var kubeTopologies = []struct {
	name  string
	start func(t *testing.T, k *testenv.Kube, kube *framework.Kube) sailplaneOnKube
}{
	{"hyper", startHyperOnKube},
	{"microservices", startMicroservicesOnKube},
}

// meshConfigMap is the mesh config as an Istio install keeps it: ConfigMap istio-system/istio,
// key "mesh". The control plane's namespace also holds its Lease (status writer election).
const meshConfigMap = `apiVersion: v1
kind: ConfigMap
metadata: {name: istio, namespace: istio-system}
data:
  mesh: |
    rootNamespace: istio-system
`

func startHyperOnKube(t *testing.T, k *testenv.Kube, kube *framework.Kube) sailplaneOnKube {
	t.Helper()
	bin := framework.Binary(t, "hyper")
	kube.Apply(t, meshConfigMap)
	dir := t.TempDir()
	// hyper is started in a folder holding a mesh file, as users run it; with Kubernetes the
	// mesh config comes from the ConfigMap unless --mesh-config is given.
	framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", "rootNamespace: istio-system\n")
	xds, busAddr := framework.FreeAddr(t), framework.FreeAddr(t)
	p := framework.Start(t, dir, bin,
		"--kubeconfig", k.KubeconfigPath(), "--config-source", "kubernetes",
		"--xds-listen", xds, "--bus-listen", busAddr, "--xds-tls-listen", framework.FreeAddr(t), "--webhook-listen", framework.FreeAddr(t),
		"--log-level", "debug")
	return sailplaneOnKube{xds: xds, configBus: busAddr, procs: []*framework.Process{p}}
}

// startMicroservicesOnKube runs the services as deploy/microservices does: the ca reviews
// service-account tokens with the API server, each service gets its certificate with its own
// account's token (audience istio-ca, from TokenRequest as the kubelet projects it), and every
// bus is mTLS between Sailplane's identities. The test consumes the config bus with a
// certificate the ca issued for xds-server's account.
func startMicroservicesOnKube(t *testing.T, k *testenv.Kube, kube *framework.Kube) sailplaneOnKube {
	t.Helper()
	ingestBin, watcherBin := framework.Binary(t, "config-ingest"), framework.Binary(t, "endpoint-watcher")
	kube.Apply(t, meshConfigMap)
	dir := t.TempDir()
	configBus, registryBus, xds, caAddr := framework.FreeAddr(t), framework.FreeAddr(t), framework.FreeAddr(t), framework.FreeAddr(t)
	ca := framework.Start(t, dir, framework.Binary(t, "ca"), "--kubernetes=true", "--kubeconfig", k.KubeconfigPath(),
		"--ca-listen", caAddr, "--ca-cert-dir", "etc/certs", "--bus-listen=")
	rootFile := filepath.Join(dir, "etc/certs/root-cert.pem")
	framework.Eventually(t, time.Minute, func() error {
		_, err := os.Stat(rootFile)
		return err
	})
	tokens := map[string]string{}
	for _, sa := range []string{"config-ingest", "endpoint-watcher", "xds-server"} {
		tokens[sa] = filepath.Join(dir, "var/run/secrets", sa, "istio-token")
		framework.WriteFile(t, dir, "var/run/secrets/"+sa+"/istio-token", kube.ServiceAccountToken(t, "istio-system", sa, "istio-ca"))
	}
	identity := func(sa string) []string {
		return []string{"--ca-address", caAddr, "--ca-root-cert", rootFile, "--ca-token-file", tokens[sa]}
	}
	ingest := framework.Start(t, dir, ingestBin, append(identity("config-ingest"), "--kubeconfig", k.KubeconfigPath(),
		"--config-source", "kubernetes", "--bus-listen", configBus, "--log-level", "debug")...)
	watcher := framework.Start(t, dir, watcherBin, append(identity("endpoint-watcher"), "--kubeconfig", k.KubeconfigPath(),
		"--kubernetes", "on", "--config-bus", configBus, "--bus-listen", registryBus, "--log-level", "debug")...)
	xdsServer := framework.Start(t, dir, framework.Binary(t, "xds-server"), append(identity("xds-server"),
		"--config-bus", configBus, "--registry-bus", registryBus, "--xds-listen", xds)...)
	me := framework.WorkloadCert(t, workloadcert.Config{CAAddress: caAddr, RootCertFile: rootFile, TokenFile: tokens["xds-server"]})
	return sailplaneOnKube{xds: xds, configBus: configBus, caAddr: caAddr, rootFile: rootFile, registryBus: registryBus,
		busSec: bus.Security{Identity: me, Peers: bus.SailplanePeers("cluster.local", "istio-system")},
		procs:  []*framework.Process{ingest, watcher, xdsServer, ca}}
}

// echoPort is the port every echo backend listens on inside its test host, and the Service's.
const echoPort = 7070

// echoBackends are echo servers in test hosts, published to Kubernetes as Pods of Service
// demo/echo; the EndpointSlice lists the first `ready` of them.
type echoBackends struct {
	kube  *framework.Kube
	hosts []*framework.TestHost
	ids   []string
}

func startEchoBackends(t *testing.T, kube *framework.Kube, n int) *echoBackends {
	t.Helper()
	b := &echoBackends{kube: kube}
	for i := range n {
		id := fmt.Sprintf("echo-%d", i)
		h := framework.NewTestHost(t, id)
		framework.StartEchoOn(t, id, h.Listen(t, echoPort))
		b.hosts = append(b.hosts, h)
		b.ids = append(b.ids, id)
	}
	return b
}

// publish creates Service demo/echo and one running, ready Pod per backend (no kubelet would).
func (b *echoBackends) publish(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs := b.kube.Clientset
	b.kube.EnsureNamespace(t, "demo")
	_, err := cs.CoreV1().Services("demo").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: "demo", Labels: map[string]string{"app": "echo"}},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "echo"},
			Ports: []corev1.ServicePort{{
				Name: "grpc", Port: echoPort, TargetPort: intstr.FromInt32(echoPort), Protocol: corev1.ProtocolTCP,
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("service demo/echo: %v", err)
	}
	for i, h := range b.hosts {
		pod, err := cs.CoreV1().Pods("demo").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: b.ids[i], Namespace: "demo",
				Labels: map[string]string{"app": "echo", "version": "v1"}},
			Spec: corev1.PodSpec{
				ServiceAccountName: "echo",
				Containers: []corev1.Container{{Name: "echo", Image: "example.invalid/echo",
					Ports: []corev1.ContainerPort{{Name: "grpc", ContainerPort: echoPort}}}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("pod %s: %v", b.ids[i], err)
		}
		now := metav1.Now()
		pod.Status = corev1.PodStatus{
			Phase:  corev1.PodRunning,
			HostIP: "198.18.0.1",
			PodIP:  h.IP(), PodIPs: []corev1.PodIP{{IP: h.IP()}},
			StartTime: &now,
			Conditions: []corev1.PodCondition{
				{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
				{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			},
		}
		if _, err := cs.CoreV1().Pods("demo").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("pod %s status: %v", b.ids[i], err)
		}
	}
}

// setReady writes the EndpointSlice of demo/echo with the first n backends as ready endpoints.
func (b *echoBackends) setReady(t *testing.T, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	api := b.kube.Clientset.DiscoveryV1().EndpointSlices("demo")
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "echo-e2e", Namespace: "demo", Labels: map[string]string{
			discoveryv1.LabelServiceName: "echo",
			discoveryv1.LabelManagedBy:   "sailplane-e2e",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{
			Name: ptr("grpc"), Port: ptr(int32(echoPort)), Protocol: ptr(corev1.ProtocolTCP),
		}},
	}
	for i := range n {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{b.hosts[i].IP()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "demo", Name: b.ids[i]},
		})
	}
	cur, err := api.Get(ctx, es.Name, metav1.GetOptions{})
	if err == nil {
		es.ResourceVersion = cur.ResourceVersion
		_, err = api.Update(ctx, es, metav1.UpdateOptions{})
	} else {
		_, err = api.Create(ctx, es, metav1.CreateOptions{})
	}
	if err != nil {
		t.Fatalf("endpointslice demo/echo-e2e with %d endpoints: %v", n, err)
	}
}

func ptr[T any](v T) *T { return &v }

// reached sends n RPCs and returns which backends answered; an RPC error is returned as is.
func reached(ctx context.Context, c framework.EchoClient, n int) (map[string]int, error) {
	counts := map[string]int{}
	for range n {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		id, err := framework.Call(ctx, c)
		cancel()
		if err != nil {
			return counts, err
		}
		counts[id]++
	}
	return counts, nil
}

// onlyFrom returns an error naming the backends in counts that are not in ids.
func onlyFrom(counts map[string]int, ids ...string) error {
	for id := range counts {
		if !slices.Contains(ids, id) {
			return fmt.Errorf("RPCs reached %s, want only %v (got %v)", id, ids, counts)
		}
	}
	return nil
}

// allOf returns an error unless every one of ids answered.
func allOf(counts map[string]int, ids ...string) error {
	for _, id := range ids {
		if counts[id] == 0 {
			return fmt.Errorf("no RPC reached %s (got %v)", id, counts)
		}
	}
	return nil
}

// meshRoot waits for the istio-ca-root-cert ConfigMap the ca writes in ns and returns its root,
// as PEM and as a pool.
func meshRoot(ctx context.Context, t *testing.T, kube *framework.Kube, ns string) (string, *x509.CertPool) {
	t.Helper()
	var rootPEM string
	framework.Eventually(t, time.Minute, func() error {
		cm, err := kube.Clientset.CoreV1().ConfigMaps(ns).Get(ctx, "istio-ca-root-cert", metav1.GetOptions{})
		if err != nil {
			return err
		}
		rootPEM = cm.Data[pki.RootCertFile]
		return nil
	})
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM([]byte(rootPEM)) {
		t.Fatalf("ConfigMap %s/istio-ca-root-cert holds no root:\n%s", ns, rootPEM)
	}
	return rootPEM, roots
}

// checkWorkloadCert reports whether chain (leaf first) is a client certificate for id alone
// that roots verify.
func checkWorkloadCert(chain []*x509.Certificate, roots *x509.CertPool, id spiffe.ID) error {
	leaf := chain[0]
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != id.String() {
		return fmt.Errorf("certificate URI SANs %v, want [%s]", leaf.URIs, id)
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return fmt.Errorf("certificate does not verify with istio-ca-root-cert: %w", err)
	}
	return nil
}
