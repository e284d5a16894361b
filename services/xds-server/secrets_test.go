package xdsserver

import (
	"bytes"
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	securityv1 "sailplane.dev/proto/security/v1"
	"sailplane.dev/services/xds-server/internal/fakebus"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/schema"
	"sailplane.dev/tools/testenv"
)

// TestCredentialSecrets: against a real API server, over real ADS streams on the TLS port, a
// gateway asking for kubernetes://gw-cert gets the Secret's key pair and, when the Secret
// changes, the new one; "-cacert" gives a validation context (to a service account without
// RBAC too: a CA is public within the namespace); a proxy of another namespace, one whose
// service account may not read Secrets, a proxy of another cluster and a plaintext stream get
// nothing; a malformed Secret
// is reported naming the Secret and the key, and not served.
func TestCredentialSecrets(t *testing.T) {
	kube := testenv.KubeForTest(t)
	client, err := kubernetes.NewForConfig(kube.RestConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx := streamContext(t)
	for _, ns := range []string{"gw", "other"} {
		if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The gateway's account may read the Secrets of its namespace, as Istio's gateway charts
	// grant; gw/norbac and other/ingress may not.
	if _, err := client.RbacV1().Roles("gw").Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "gateway"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list", "watch"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.RbacV1().RoleBindings("gw").Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "gateway"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "gateway"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "ingress", Namespace: "gw"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	gwCA, err := pki.NewSelfSigned(pki.ECDSAP256, "gateway-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM := keyPairPEM(t, gwCA, "www.example.com")
	caPEM := pki.EncodeCerts(gwCA.Cert)
	secrets := client.CoreV1().Secrets("gw")
	gwCert := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "gw-cert"}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM, "ca.crt": caPEM}}
	if _, err := secrets.Create(ctx, gwCert, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bad-cert"}, Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{"tls.crt": []byte("not a certificate"), "tls.key": keyPEM}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	srv, mesh := secureServerWith(t, Deps{Credentials: client})
	creds := func(ns, sa string) credentials.TransportCredentials {
		return credentials.NewTLS(&tls.Config{RootCAs: mesh.RootPool(), ServerName: "istiod.istio-system.svc",
			Certificates: []tls.Certificate{issueFor(t, mesh, ns, sa)}})
	}
	gateway := sdsStream(t, srv.SecureAddr().String(), creds("gw", "ingress"), gatewayNode("gw", "ingress"))

	// The key pair, as the Secret holds it.
	resp := gateway.ask(t, "kubernetes://gw-cert")
	if got := secretsOf(t, resp); len(got) != 1 || !bytes.Equal(got[0].GetTlsCertificate().GetCertificateChain().GetInlineBytes(), certPEM) ||
		!bytes.Equal(got[0].GetTlsCertificate().GetPrivateKey().GetInlineBytes(), keyPEM) || got[0].GetName() != "kubernetes://gw-cert" {
		t.Fatalf("kubernetes://gw-cert: got %d secrets, want the Secret's key pair", len(got))
	}
	// A Gateway API listener's name for it (kubernetes-gateway://<ns>/<name>), on its own stream.
	gwAPI := sdsStream(t, srv.SecureAddr().String(), creds("gw", "ingress"), gatewayNode("gw", "ingress"))
	if got := secretsOf(t, gwAPI.ask(t, "kubernetes-gateway://gw/gw-cert")); len(got) != 1 ||
		!bytes.Equal(got[0].GetTlsCertificate().GetPrivateKey().GetInlineBytes(), keyPEM) || got[0].GetName() != "kubernetes-gateway://gw/gw-cert" {
		t.Fatalf("kubernetes-gateway://gw/gw-cert: got %d secrets, want the Secret's key pair under that name", len(got))
	}
	// The Secret changes: the new pair is pushed.
	certPEM2, keyPEM2 := keyPairPEM(t, gwCA, "www.example.com")
	gwCert.Data = map[string][]byte{"tls.crt": certPEM2, "tls.key": keyPEM2, "ca.crt": caPEM}
	if _, err := secrets.Update(ctx, gwCert, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	resp = gateway.ackAndRecv(t, resp)
	if got := secretsOf(t, resp); len(got) != 1 || !bytes.Equal(got[0].GetTlsCertificate().GetCertificateChain().GetInlineBytes(), certPEM2) {
		t.Fatalf("after the update: got %d secrets, want the new key pair", len(got))
	}

	// Delta ADS (Istio's proxies' default): the same, and a name that cannot be served is
	// answered as removed (not there), so the proxy waits for it.
	delta := deltaStream(t, srv.SecureAddr().String(), creds("gw", "ingress"))
	dresp, err := delta.send(t, &discoverygrpc.DeltaDiscoveryRequest{TypeUrl: resourcev3.SecretType, Node: gatewayNode("gw", "ingress"),
		ResourceNamesSubscribe: []string{"kubernetes://gw-cert", "kubernetes://bad-cert"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(dresp.GetResources()) == 0 {
		dresp, err = delta.recv() // the removal may come first
		if err != nil {
			t.Fatal(err)
		}
	}
	var dsec tlsv3.Secret
	if len(dresp.GetResources()) != 1 || dresp.GetResources()[0].GetResource().UnmarshalTo(&dsec) != nil ||
		!bytes.Equal(dsec.GetTlsCertificate().GetCertificateChain().GetInlineBytes(), certPEM2) {
		t.Fatalf("delta: got %d resources, want the key pair of kubernetes://gw-cert", len(dresp.GetResources()))
	}

	// The Secret goes bad: reported, and the proxy keeps what it holds (no removal, nothing
	// weaker); fixed, the new pair is the next thing it is sent.
	gwCert.Data = map[string][]byte{"tls.crt": []byte("garbage"), "tls.key": keyPEM2, "ca.crt": caPEM}
	if gwCert, err = secrets.Update(ctx, gwCert, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool {
		return strings.Contains(srv.pushStatus()["sailplane_credential_not_served"]["kubernetes://gw/gw-cert"].Message, `key "tls.crt"`)
	})
	certPEM3, keyPEM3 := keyPairPEM(t, gwCA, "www.example.com")
	gwCert.Data = map[string][]byte{"tls.crt": certPEM3, "tls.key": keyPEM3, "ca.crt": caPEM}
	if _, err := secrets.Update(ctx, gwCert, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if dresp, err = delta.recv(); err != nil {
		t.Fatal(err)
	}
	if len(dresp.GetRemovedResources()) > 0 || len(dresp.GetResources()) != 1 || dresp.GetResources()[0].GetResource().UnmarshalTo(&dsec) != nil ||
		!bytes.Equal(dsec.GetTlsCertificate().GetCertificateChain().GetInlineBytes(), certPEM3) {
		t.Fatalf("delta after the Secret went bad and was fixed: removed %v, %d resources; want only the new pair",
			dresp.GetRemovedResources(), len(dresp.GetResources()))
	}
	// The state-of-the-world stream was sent nothing while the Secret was bad, then the new pair.
	resp = gateway.ackAndRecv(t, resp)
	if got := secretsOf(t, resp); len(got) != 1 || !bytes.Equal(got[0].GetTlsCertificate().GetCertificateChain().GetInlineBytes(), certPEM3) {
		t.Fatalf("SotW after the Secret went bad and was fixed: got %d secrets, want the new pair", len(got))
	}

	// "-cacert": the validation context of the Secret's ca.crt, to an account without RBAC too.
	for _, sa := range []string{"ingress", "norbac"} {
		s := sdsStream(t, srv.SecureAddr().String(), creds("gw", sa), gatewayNode("gw", sa))
		got := secretsOf(t, s.ask(t, "kubernetes://gw-cert-cacert", "kubernetes://gw/gw-cert-cacert"))
		if len(got) != 2 {
			t.Fatalf("%s: %d -cacert secrets, want 2", sa, len(got))
		}
		for _, g := range got {
			if !bytes.Equal(g.GetValidationContext().GetTrustedCa().GetInlineBytes(), caPEM) {
				t.Errorf("%s: %s is not the Secret's CA: %v", sa, g.GetName(), g)
			}
		}
	}

	// Refused: the key pair to an account that may not read Secrets, a Secret of another
	// namespace (its CA included), anything over plaintext, and a malformed Secret.
	refused := []struct {
		name, key  string
		stream     *sds
		resources  []string
		wantReason string
	}{
		{"no RBAC", "kubernetes://gw/gw-cert", sdsStream(t, srv.SecureAddr().String(), creds("gw", "norbac"), gatewayNode("gw", "norbac")),
			[]string{"kubernetes://gw-cert"}, "may not list Secrets in gw"},
		{"other namespace", "kubernetes://gw/gw-cert", sdsStream(t, srv.SecureAddr().String(), creds("other", "ingress"), gatewayNode("other", "ingress")),
			[]string{"kubernetes://gw/gw-cert", "kubernetes://gw/gw-cert-cacert", "kubernetes-gateway://gw/gw-cert"}, "only Secrets of its own namespace"},
		{"plaintext", "kubernetes://gw-cert (ingress-1.gw)", sdsStream(t, srv.Addr().String(), insecure.NewCredentials(), gatewayNode("gw", "ingress")),
			[]string{"kubernetes://gw-cert"}, "not authenticated"},
		{"another cluster", "kubernetes://gw-cert (ingress-1.gw)", sdsStream(t, srv.SecureAddr().String(), creds("gw", "ingress"), remoteNode("gw", "ingress")),
			[]string{"kubernetes://gw-cert"}, "the proxy is of cluster remote"},
		{"malformed", "kubernetes://gw/bad-cert", gateway, []string{"kubernetes://gw-cert", "kubernetes://bad-cert"}, `Secret gw/bad-cert: key "tls.crt": no PEM certificate`},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			var got []*tlsv3.Secret
			if tc.stream == gateway {
				got = secretsOf(t, gateway.ackAndAsk(t, resp, tc.resources...))
			} else {
				got = secretsOf(t, tc.stream.ask(t, tc.resources...))
			}
			for _, g := range got {
				if g.GetName() != "kubernetes://gw-cert" || tc.stream != gateway {
					t.Errorf("served %s", g.GetName())
				}
			}
			waitUntil(t, func() bool {
				p, ok := srv.pushStatus()["sailplane_credential_not_served"][tc.key]
				return ok && strings.Contains(p.Message, tc.wantReason)
			})
			if msg := srv.pushStatus()["sailplane_credential_not_served"][tc.key].Message; strings.Contains(msg, "BEGIN") {
				t.Errorf("the report carries key material: %s", msg)
			}
		})
	}
}

type deltaSDS struct {
	stream discoverygrpc.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
}

func deltaStream(t *testing.T, addr string, creds credentials.TransportCredentials) *deltaSDS {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	stream, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(streamContext(t))
	if err != nil {
		t.Fatal(err)
	}
	return &deltaSDS{stream: stream}
}

func (d *deltaSDS) send(t *testing.T, req *discoverygrpc.DeltaDiscoveryRequest) (*discoverygrpc.DeltaDiscoveryResponse, error) {
	t.Helper()
	if err := d.stream.Send(req); err != nil {
		return nil, err
	}
	return d.recv()
}

func (d *deltaSDS) recv() (*discoverygrpc.DeltaDiscoveryResponse, error) { return d.stream.Recv() }

// keyPairPEM is a serving certificate for host from ca, and its key, in PEM.
func keyPairPEM(t *testing.T, ca *pki.Authority, host string) (cert, key []byte) {
	t.Helper()
	k, err := pki.GenerateKey(pki.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(k.Public(), pki.LeafOptions{DNSNames: []string{host}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	key, err = pki.EncodeKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pki.EncodeCerts(leaf), key
}

func gatewayNode(ns, sa string) *corev3.Node {
	return &corev3.Node{Id: "router~198.18.0.1~ingress-1." + ns + "~" + ns + ".svc.cluster.local",
		Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			"NAMESPACE": structpb.NewStringValue(ns), "SERVICE_ACCOUNT": structpb.NewStringValue(sa)}}}
}

// remoteNode is gatewayNode of another cluster (CLUSTER_ID).
func remoteNode(ns, sa string) *corev3.Node {
	n := gatewayNode(ns, sa)
	n.Metadata.Fields["CLUSTER_ID"] = structpb.NewStringValue("remote")
	return n
}

// sds is a state-of-the-world ADS stream asking for secrets, as Envoy's SDS over ADS.
type sds struct {
	stream discoverygrpc.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	node   *corev3.Node
}

func sdsStream(t *testing.T, addr string, creds credentials.TransportCredentials, node *corev3.Node) *sds {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	stream, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(streamContext(t))
	if err != nil {
		t.Fatal(err)
	}
	return &sds{stream: stream, node: node}
}

// ask subscribes to names and returns the answer.
func (s *sds) ask(t *testing.T, names ...string) *discoverygrpc.DiscoveryResponse {
	t.Helper()
	return s.send(t, &discoverygrpc.DiscoveryRequest{TypeUrl: resourcev3.SecretType, Node: s.node, ResourceNames: names})
}

// ackAndRecv acknowledges last and waits for the next response (a push).
func (s *sds) ackAndRecv(t *testing.T, last *discoverygrpc.DiscoveryResponse) *discoverygrpc.DiscoveryResponse {
	t.Helper()
	if err := s.stream.Send(&discoverygrpc.DiscoveryRequest{TypeUrl: resourcev3.SecretType, VersionInfo: last.GetVersionInfo(),
		ResponseNonce: last.GetNonce(), ResourceNames: s.names(last)}); err != nil {
		t.Fatal(err)
	}
	return s.recv(t)
}

// ackAndAsk acknowledges last while changing the subscription to names.
func (s *sds) ackAndAsk(t *testing.T, last *discoverygrpc.DiscoveryResponse, names ...string) *discoverygrpc.DiscoveryResponse {
	t.Helper()
	return s.send(t, &discoverygrpc.DiscoveryRequest{TypeUrl: resourcev3.SecretType, VersionInfo: last.GetVersionInfo(),
		ResponseNonce: last.GetNonce(), ResourceNames: names})
}

func (s *sds) names(resp *discoverygrpc.DiscoveryResponse) []string {
	var out []string
	for _, r := range resp.GetResources() {
		var sec tlsv3.Secret
		if err := r.UnmarshalTo(&sec); err == nil {
			out = append(out, sec.GetName())
		}
	}
	return out
}

func (s *sds) send(t *testing.T, req *discoverygrpc.DiscoveryRequest) *discoverygrpc.DiscoveryResponse {
	t.Helper()
	if err := s.stream.Send(req); err != nil {
		t.Fatal(err)
	}
	return s.recv(t)
}

func (s *sds) recv(t *testing.T) *discoverygrpc.DiscoveryResponse {
	t.Helper()
	resp, err := s.stream.Recv()
	if err != nil {
		t.Fatalf("SDS stream: %v", err)
	}
	if resp.GetTypeUrl() != resourcev3.SecretType {
		t.Fatalf("answered %s", resp.GetTypeUrl())
	}
	return resp
}

func secretsOf(t *testing.T, resp *discoverygrpc.DiscoveryResponse) []*tlsv3.Secret {
	t.Helper()
	var out []*tlsv3.Secret
	for _, r := range resp.GetResources() {
		var s tlsv3.Secret
		if err := r.UnmarshalTo(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, &s)
	}
	return out
}

// secureServerWith is secureServer with more dependencies.
func secureServerWith(t *testing.T, extra Deps) (*Server, *pki.Authority) {
	t.Helper()
	mesh, serving := servingCert(t)
	store := bus.NewStore()
	if err := store.Replace(schema.TrustBundle.TypeURL, []*bus.Resource{{Name: "cluster.local", Body: &securityv1.TrustBundle{
		TrustDomain: "cluster.local", RootCertificates: []string{string(pki.EncodeCerts(mesh.Cert))}}}}); err != nil {
		t.Fatal(err)
	}
	deps := extra
	deps.Logger, deps.Config, deps.Registry, deps.Bundle = testLogger(t), fakebus.New(), fakebus.New(), bus.Local(store)
	deps.TLS = ServingTLS(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &serving, nil })
	srv, err := New(Config{Listen: "127.0.0.1:0", SecureListen: "127.0.0.1:0", PodName: "xds-0", Debounce: 10 * time.Millisecond}, deps)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case <-srv.Ready():
	case <-time.After(waitFor):
		t.Fatal("server not ready")
	}
	waitUntil(t, func() bool { return srv.TrustBundle("cluster.local") != nil })
	if srv.secrets != nil {
		waitUntil(t, srv.secrets.HasSynced)
	}
	return srv, mesh
}
