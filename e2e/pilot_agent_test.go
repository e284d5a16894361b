package e2e

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	_ "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3" // resource types ADS answers with
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/spiffe"
	"sailplane.dev/tools/testenv"
)

// securedOnKube is Sailplane on a real API server with the ca in Kubernetes mode (root in the
// istio-ca-secret Secret, tokens checked with TokenReview) and xDS only over TLS.
type securedOnKube struct {
	ca, xds string             // CA_ADDR and the discovery address (both TLS)
	xdsLog  *framework.Process // the process serving xDS
}

var securedKubeTopologies = []struct {
	name  string
	start func(t *testing.T, k *testenv.Kube, kube *framework.Kube) securedOnKube
}{
	// As istiod: CreateCertificate and xDS on one TLS port (15012).
	{"hyper", func(t *testing.T, k *testenv.Kube, kube *framework.Kube) securedOnKube {
		kube.Apply(t, meshConfigMap)
		dir := t.TempDir()
		framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", "rootNamespace: istio-system\n")
		secure := framework.GatewayAddr(t)
		p := framework.Start(t, dir, framework.Binary(t, "hyper"),
			"--kubeconfig", k.KubeconfigPath(), "--config-source", "kubernetes",
			"--xds-listen=", "--xds-tls-listen", secure, "--bus-listen", framework.FreeAddr(t), "--webhook-listen", framework.FreeAddr(t),
			"--log-level", "debug")
		return securedOnKube{ca: secure, xds: secure, xdsLog: p}
	}},
	// The ca on its own port; each service gets its certificate from it with its service
	// account's token (mTLS buses), xds-server serves 15012 with its own (istiod's names) and
	// verifies client certificates with the trust bundle from the ca's bus.
	{"microservices", func(t *testing.T, k *testenv.Kube, kube *framework.Kube) securedOnKube {
		kube.Apply(t, meshConfigMap)
		dir := t.TempDir()
		configBus, registryBus, caBus := framework.FreeAddr(t), framework.FreeAddr(t), framework.FreeAddr(t)
		caAddr, secure := framework.GatewayAddr(t), framework.GatewayAddr(t)
		framework.Start(t, dir, framework.Binary(t, "ca"), "--kubernetes=true", "--kubeconfig", k.KubeconfigPath(),
			"--ca-listen", caAddr, "--bus-listen", caBus)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		rootPEM, _ := meshRoot(ctx, t, kube, "istio-system")
		framework.WriteFile(t, dir, "root-cert.pem", rootPEM)
		identity := func(sa string) []string {
			token := "var/run/secrets/" + sa + "/istio-token"
			framework.WriteFile(t, dir, token, kube.ServiceAccountToken(t, "istio-system", sa, "istio-ca"))
			return []string{"--ca-address", caAddr, "--ca-root-cert", "root-cert.pem", "--ca-token-file", token}
		}
		framework.Start(t, dir, framework.Binary(t, "config-ingest"), append(identity("config-ingest"),
			"--kubeconfig", k.KubeconfigPath(), "--config-source", "kubernetes", "--bus-listen", configBus)...)
		framework.Start(t, dir, framework.Binary(t, "endpoint-watcher"), append(identity("endpoint-watcher"),
			"--kubeconfig", k.KubeconfigPath(), "--kubernetes", "on", "--config-bus", configBus, "--bus-listen", registryBus)...)
		p := framework.Start(t, dir, framework.Binary(t, "xds-server"), append(identity("xds-server"),
			"--config-bus", configBus, "--registry-bus", registryBus, "--ca-bus", caBus,
			"--kubernetes=true", "--kubeconfig", k.KubeconfigPath(), // reviews the TLS clients' tokens
			"--xds-listen=", "--xds-tls-listen", secure, "--log-level", "debug")...)
		return securedOnKube{ca: caAddr, xds: secure, xdsLog: p}
	}},
}

// TestIstioPilotAgent: Istio's own pilot-agent (built by tools/testenv from Istio's module),
// started outside Kubernetes as a VM's agent is — the root from the istio-ca-root-cert
// ConfigMap, a service-account token (TokenRequest, audience istio-ca) — gets its workload
// certificate from Sailplane's ca, then proxies a sidecar's ADS stream to Sailplane over mTLS
// with that certificate. The sidecar's side is a gRPC ADS client on pilot-agent's local socket,
// as Envoy would be: it receives the mesh's clusters and listeners, and xds-server names the
// upstream connection by the certificate's SPIFFE ID.
func TestIstioPilotAgent(t *testing.T) {
	pilotAgent := testenv.PilotAgentForTest(t)
	for _, topo := range securedKubeTopologies {
		t.Run(topo.name, func(t *testing.T) { testIstioPilotAgent(t, pilotAgent, topo.start, false) })
	}
}

// TestIstioPilotAgentToken: pilot-agent as a pod's agent without a provisioned certificate
// (no PROV_CERT) connects to the TLS xDS port with no client certificate, only its
// service-account token (authorization: Bearer, audience istio-ca) and ClusterID, as it does to
// istiod's 15012: the token is reviewed (TokenReview) and the sidecar served, named by the
// token's identity; a sidecar claiming another namespace through it is refused, as istiod
// refuses it (PermissionDenied).
func TestIstioPilotAgentToken(t *testing.T) {
	pilotAgent := testenv.PilotAgentForTest(t)
	for _, topo := range securedKubeTopologies {
		t.Run(topo.name, func(t *testing.T) { testIstioPilotAgent(t, pilotAgent, topo.start, true) })
	}
}

func testIstioPilotAgent(t *testing.T, pilotAgent string, start func(*testing.T, *testenv.Kube, *framework.Kube) securedOnKube, viaToken bool) {
	k := testenv.KubeForTest(t)
	kube := framework.NewKube(t, k.RestConfig())
	// pilot-agent's status server listens on every interface and cannot be told otherwise, so
	// the agent runs in a test host and reaches Sailplane on the bridge's address.
	host := framework.NewTestHost(t, "pilot-agent")
	sp := start(t, k, kube)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	id := spiffe.ID{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "web"}
	token := kube.ServiceAccountToken(t, id.Namespace, id.ServiceAccount, "istio-ca")
	if _, err := kube.Clientset.CoreV1().Services(id.Namespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: id.Namespace},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "echo"},
			Ports:    []corev1.ServicePort{{Name: "grpc", Port: echoPort, TargetPort: intstr.FromInt32(echoPort)}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// What a pod would have mounted: the namespace's istio-ca-root-cert, which the ca writes.
	rootPEM, roots := meshRoot(ctx, t, kube, id.Namespace)

	// pilot-agent's default paths are relative to its working folder, as in its container.
	dir := t.TempDir()
	framework.WriteFile(t, dir, "var/run/secrets/istio/root-cert.pem", rootPEM)
	framework.WriteFile(t, dir, "var/run/secrets/tokens/istio-token", token)
	if err := os.MkdirAll(filepath.Join(dir, "etc/certs"), 0o755); err != nil { // pilot-agent writes into it
		t.Fatal(err)
	}
	proxyConfig, err := json.Marshal(map[string]any{
		"discoveryAddress":       sp.xds,
		"controlPlaneAuthPolicy": "MUTUAL_TLS",
	})
	if err != nil {
		t.Fatal(err)
	}
	pilotAgentBin, pilotAgentArgs := host.Command(pilotAgent, "proxy", "sidecar")
	env := []string{
		"PROXY_CONFIG=" + string(proxyConfig),
		"CA_ADDR=" + sp.ca,
		"POD_NAME=web-0", "POD_NAMESPACE=" + id.Namespace, "SERVICE_ACCOUNT=" + id.ServiceAccount,
		"INSTANCE_IP=" + host.IP(), "ISTIO_META_CLUSTER_ID=Kubernetes",
		// No Envoy binary here: the agent runs alone (Istio's proxyless mode), fetching the
		// certificate eagerly and writing it out.
		"DISABLE_ENVOY=true",
		"OUTPUT_CERTS=./etc/certs",
		"CA_ROOT_CA=./var/run/secrets/istio/root-cert.pem", "XDS_ROOT_CA=./var/run/secrets/istio/root-cert.pem",
	}
	if !viaToken {
		// PROV_CERT finds the certificate written out, so the xDS connection presents it
		// (Istio's VM setup); without it, the connection carries the token only.
		env = append(env, "PROV_CERT=./etc/certs")
	}
	agent := framework.StartEnv(t, env, dir, pilotAgentBin, pilotAgentArgs...)

	// The workload certificate: the token's identity, signed by Sailplane's root.
	certFile := filepath.Join(dir, "etc/certs", pki.CertChainFile)
	var chain []*x509.Certificate
	framework.Eventually(t, 2*time.Minute, func() error {
		if exited, err := agent.Exited(); exited {
			t.Fatalf("pilot-agent exited: %v", err)
		}
		data, err := os.ReadFile(certFile)
		if err != nil {
			return err
		}
		chain, err = pki.ParseCerts(data)
		return err
	})
	if err := checkWorkloadCert(chain, roots, id); err != nil {
		t.Errorf("pilot-agent's workload certificate: %v", err)
	}

	// Envoy's side: ADS on the agent's socket, with a sidecar's node.
	node := &corev3.Node{
		Id: "sidecar~" + host.IP() + "~web-0." + id.Namespace + "~" + id.Namespace + ".svc.cluster.local",
		Metadata: mustStruct(t, map[string]any{
			"NAMESPACE": id.Namespace, "SERVICE_ACCOUNT": id.ServiceAccount, "CLUSTER_ID": "Kubernetes",
			"LABELS": map[string]any{"app": "web"}, "NAME": "web-0", "INSTANCE_IPS": host.IP(),
		}),
	}
	socket := filepath.Join(dir, "etc/istio/proxy/XDS")
	framework.Eventually(t, time.Minute, func() error { _, err := os.Stat(socket); return err })
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A stream opened before xds-server has its first full state is refused (Unavailable), as
	// istiod's would be; Envoy retries, and so does this.
	var stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	var clusters []string
	framework.Eventually(t, 2*time.Minute, func() error {
		var err error
		if stream, err = discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx); err != nil {
			return err
		}
		clusters, err = adsNames(stream, node, "type.googleapis.com/envoy.config.cluster.v3.Cluster")
		return err
	})
	wantCluster := fmt.Sprintf("outbound|%d||echo.%s.svc.cluster.local", echoPort, id.Namespace)
	if !slices.Contains(clusters, wantCluster) || !slices.Contains(clusters, "PassthroughCluster") {
		t.Errorf("clusters through pilot-agent %v, want %s and PassthroughCluster among them", clusters, wantCluster)
	}
	listeners, err := adsNames(stream, node, "type.googleapis.com/envoy.config.listener.v3.Listener")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(listeners, "virtualOutbound") || !slices.Contains(listeners, "virtualInbound") {
		t.Errorf("listeners through pilot-agent %v, want virtualOutbound and virtualInbound among them", listeners)
	}

	// xds-server verified the client certificate of pilot-agent's upstream connection.
	var connected string
	framework.Eventually(t, time.Minute, func() error {
		for line := range strings.Lines(sp.xdsLog.Log()) {
			if strings.Contains(line, `"proxy connected"`) && strings.Contains(line, node.Id) {
				connected = line
				return nil
			}
		}
		return errors.New("xds-server has not logged the sidecar's connection")
	})
	if !strings.Contains(connected, "peer="+id.String()) {
		t.Errorf("xds-server did not name the sidecar's connection by its identity %s: %s", id, connected)
	}
	if !viaToken {
		return
	}
	// The identity came from the token: the upstream connection had no certificate.
	var authenticated string
	for line := range strings.Lines(sp.xdsLog.Log()) {
		if strings.Contains(line, `"xDS client authenticated"`) {
			authenticated = line
		}
	}
	if !strings.Contains(authenticated, "auth=token") || !strings.Contains(authenticated, "identity="+id.String()) {
		t.Errorf("xds-server did not authenticate pilot-agent's stream by its token: %q", authenticated)
	}
	if strings.Contains(sp.xdsLog.Log(), token) {
		t.Error("xds-server logged the token")
	}
	// A sidecar behind this agent claiming another namespace is refused, not served its config.
	other := proto.CloneOf(node)
	other.Id = "sidecar~" + host.IP() + "~web-0.payments~payments.svc.cluster.local"
	other.Metadata.Fields["NAMESPACE"] = structpb.NewStringValue("payments")
	refusedCtx, cancelRefused := context.WithTimeout(ctx, time.Minute)
	defer cancelRefused()
	if s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(refusedCtx); err == nil {
		if names, err := adsNames(s, other, "type.googleapis.com/envoy.config.cluster.v3.Cluster"); err == nil {
			t.Errorf("a sidecar claiming namespace payments with demo's token was served %d clusters", len(names))
		}
	}
	framework.Eventually(t, time.Minute, func() error {
		for line := range strings.Lines(sp.xdsLog.Log()) {
			if strings.Contains(line, `"proxy refused"`) && strings.Contains(line, other.Id) && strings.Contains(line, "authenticated as "+id.String()) {
				return nil
			}
		}
		return errors.New("xds-server has not logged refusing the sidecar claiming namespace payments")
	})
}

// adsNames asks for every resource of typeURL on stream and returns the names of the first
// answer, ACKing it.
func adsNames(stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient,
	node *corev3.Node, typeURL string) ([]string, error) {
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: typeURL}); err != nil {
		return nil, err
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return nil, fmt.Errorf("ADS through pilot-agent: %w", err)
		}
		if resp.GetTypeUrl() != typeURL {
			continue
		}
		var names []string
		for _, a := range resp.GetResources() {
			m, err := a.UnmarshalNew()
			if err != nil {
				return nil, fmt.Errorf("%s: %w", typeURL, err)
			}
			named, ok := m.(interface{ GetName() string })
			if !ok {
				return nil, fmt.Errorf("%s answered with %T", typeURL, m)
			}
			names = append(names, named.GetName())
		}
		return names, stream.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: typeURL,
			VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
	}
}

func mustStruct(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
