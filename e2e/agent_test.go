package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/tls/certprovider"
	_ "google.golang.org/grpc/credentials/tls/certprovider/pemfile" // registers file_watcher
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/peer"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/spiffe"
	"sailplane.dev/shared/telemetry/telemetrytest"
	"sailplane.dev/tools/testenv"
)

// TestAgentMTLS: the ca and two agents as real binaries; each agent gets its workload's
// certificate and writes it with a gRPC bootstrap. A grpc-go server and client load their
// credentials through the bootstrap's file_watcher certificate provider (what xDS credentials
// use) and each verifies the other's SPIFFE ID over mTLS; a client expecting another identity
// is refused. The certificates rotate every few seconds and new connections use the new ones.
func TestAgentMTLS(t *testing.T) {
	ca := framework.StartCA(t, t.TempDir())
	server := spiffe.ID{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "echo"}
	client := spiffe.ID{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "caller"}
	serverBootstrap := framework.StartAgent(t, ca, framework.Agent{ID: server, CertTTL: 8 * time.Second}).Bootstrap
	clientBootstrap := framework.StartAgent(t, ca, framework.Agent{ID: client, CertTTL: 8 * time.Second}).Bootstrap

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(mtlsConfig(t, serverBootstrap, client, true))))
	testpb.RegisterTestServiceServer(srv, &identityEcho{})
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })

	call := func(expect spiffe.ID) (*testpb.SimpleResponse, error) {
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(mtlsConfig(t, clientBootstrap, expect, false))))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return testpb.NewTestServiceClient(conn).UnaryCall(ctx, &testpb.SimpleRequest{})
	}
	first, err := call(server)
	if err != nil {
		t.Fatalf("mTLS call: %v", err)
	}
	if first.GetServerId() != client.String() {
		t.Errorf("the server saw %q, want %s", first.GetServerId(), client)
	}
	other := spiffe.ID{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "impostor"}
	if _, err := call(other); err == nil {
		t.Errorf("a client expecting %s reached a server that is %s", other, server)
	}

	// The certificates live a few seconds: the agents renew them, gRPC re-reads the files, and
	// new connections present the renewed ones, every call verified as before and none failing.
	framework.Eventually(t, 30*time.Second, func() error {
		resp, err := call(server)
		switch {
		case err != nil:
			t.Fatalf("mTLS call during rotation: %v", err) // none may fail
		case resp.GetServerId() != client.String():
			return fmt.Errorf("the server saw %q, want %s", resp.GetServerId(), client)
		case resp.GetHostname() == first.GetHostname():
			return fmt.Errorf("the client still presents certificate %s", first.GetHostname())
		}
		return nil
	})
}

// mtlsConfig is TLS from the bootstrap's "default" certificate provider (gRPC's file_watcher
// plugin, as xDS credentials build it), requiring the peer to be peerID.
func mtlsConfig(t *testing.T, bootstrap string, peerID spiffe.ID, isServer bool) *tls.Config {
	t.Helper()
	data, err := os.ReadFile(bootstrap)
	if err != nil {
		t.Fatal(err)
	}
	var b struct {
		CertificateProviders map[string]struct {
			PluginName string          `json:"plugin_name"`
			Config     json.RawMessage `json:"config"`
		} `json:"certificate_providers"`
	}
	if err := json.Unmarshal(data, &b); err != nil {
		t.Fatal(err)
	}
	p, ok := b.CertificateProviders["default"]
	if !ok {
		t.Fatalf("%s has no default certificate provider:\n%s", bootstrap, data)
	}
	cfg, err := certprovider.ParseConfig(p.PluginName, p.Config)
	if err != nil {
		t.Fatal(err)
	}
	provider, err := cfg.Build(certprovider.BuildOptions{WantIdentity: true, WantRoot: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(provider.Close)
	// Read at every handshake, as xDS credentials do: a rotated certificate is used as soon as
	// the provider has re-read the files.
	material := func() (*certprovider.KeyMaterial, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return provider.KeyMaterial(ctx)
	}
	if _, err := material(); err != nil {
		t.Fatalf("key material from %s: %v", bootstrap, err)
	}
	verify := func(raw [][]byte, _ [][]*x509.Certificate) error {
		if len(raw) == 0 {
			return errors.New("no peer certificate")
		}
		certs := make([]*x509.Certificate, len(raw))
		for i, r := range raw {
			if certs[i], err = x509.ParseCertificate(r); err != nil {
				return err
			}
		}
		inter := x509.NewCertPool()
		for _, c := range certs[1:] {
			inter.AddCert(c)
		}
		usage := x509.ExtKeyUsageServerAuth
		if isServer {
			usage = x509.ExtKeyUsageClientAuth
		}
		km, err := material()
		if err != nil {
			return err
		}
		if _, err := certs[0].Verify(x509.VerifyOptions{Roots: km.Roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			return err
		}
		if len(certs[0].URIs) != 1 || certs[0].URIs[0].String() != peerID.String() {
			return fmt.Errorf("peer is %v, want %s", certs[0].URIs, peerID)
		}
		return nil
	}
	c := &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			km, err := material()
			if err != nil {
				return nil, err
			}
			return &km.Certs[0], nil
		},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			km, err := material()
			if err != nil {
				return nil, err
			}
			return &km.Certs[0], nil
		},
		// Workload certificates name a SPIFFE ID, not a host: verified by verify.
		InsecureSkipVerify: true, VerifyPeerCertificate: verify,
	}
	if isServer {
		c.ClientAuth = tls.RequireAnyClientCert
	}
	return c
}

// identityEcho answers with the SPIFFE ID of the client's certificate.
type identityEcho struct {
	testpb.UnimplementedTestServiceServer
}

func (identityEcho) UnaryCall(ctx context.Context, _ *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	p, _ := peer.FromContext(ctx)
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 || len(info.State.PeerCertificates[0].URIs) != 1 {
		return nil, errors.New("no client certificate with one URI")
	}
	leaf := info.State.PeerCertificates[0]
	return &testpb.SimpleResponse{ServerId: leaf.URIs[0].String(), Hostname: leaf.SerialNumber.Text(16)}, nil
}

// TestAgentTokenAuth: the ca in Kubernetes mode on a real API server and the agent binary with
// a service-account token file, as in a pod (TokenRequest, audience istio-ca, and the
// istio-ca-root-cert ConfigMap as its root). The ca reviews the token and signs the token's
// identity; the agent writes the certificate and renews it before it expires (with the
// certificate it holds), every certificate naming that identity and chaining to the root.
func TestAgentTokenAuth(t *testing.T) {
	k := testenv.KubeForTest(t)
	kube := framework.NewKube(t, k.RestConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	id := spiffe.ID{TrustDomain: "cluster.local", Namespace: "shop", ServiceAccount: "cart"}
	kube.EnsureNamespace(t, "istio-system") // where the ca keeps istio-ca-secret
	token := kube.ServiceAccountToken(t, id.Namespace, id.ServiceAccount, "istio-ca")
	caAddr := framework.FreeAddr(t)
	ca := framework.Start(t, t.TempDir(), framework.Binary(t, "ca"), "--kubernetes=true", "--kubeconfig", k.KubeconfigPath(),
		"--ca-listen", caAddr, "--bus-listen", framework.FreeAddr(t), "--log-level", "debug")

	// The pod's mounts: the projected token and the namespace's istio-ca-root-cert.
	dir := t.TempDir()
	rootPEM, roots := meshRoot(ctx, t, kube, id.Namespace)
	framework.WriteFile(t, dir, "var/run/secrets/istio/root-cert.pem", rootPEM)
	framework.WriteFile(t, dir, "var/run/secrets/tokens/istio-token", token)

	ready := framework.FreeAddr(t)
	framework.Start(t, dir, framework.Binary(t, "agent"),
		"--ca-address", caAddr, "--root-cert", "var/run/secrets/istio/root-cert.pem",
		"--token-file", "var/run/secrets/tokens/istio-token", "--readiness-address", ready,
		"--output-dir", "certs", "--xds-address", "127.0.0.1:15010",
		"--pod", "cart-0", "--ip", "127.0.0.1", "--cert-ttl", "8s", "--file-refresh", "1s")

	// Each certificate written: the token's identity, the root's signature, a fresh serial.
	certFile := filepath.Join(dir, "certs", pki.CertChainFile)
	serials := map[string]bool{}
	framework.Eventually(t, time.Minute, func() error {
		data, err := os.ReadFile(certFile)
		if err != nil {
			return err
		}
		chain, err := pki.ParseCerts(data)
		if err != nil {
			return err
		}
		if err := checkWorkloadCert(chain, roots, id); err != nil {
			t.Fatal(err)
		}
		leaf := chain[0]
		serials[leaf.SerialNumber.Text(16)] = true
		if len(serials) < 3 {
			return fmt.Errorf("%d certificate(s) seen, waiting for two renewals", len(serials))
		}
		return nil
	})

	// The first signature was for the reviewed token, renewals for the agent's certificate.
	var viaToken, viaCert int
	for line := range strings.Lines(ca.Log()) {
		if !strings.Contains(line, "msg=signed") || !strings.Contains(line, "identity="+id.String()) {
			continue
		}
		switch {
		case strings.Contains(line, "auth=token"):
			viaToken++
		case strings.Contains(line, "auth=certificate"):
			viaCert++
		}
	}
	if viaToken == 0 || viaCert == 0 {
		t.Errorf("the ca signed %d time(s) for the token and %d for a certificate, want both:\n%s", viaToken, viaCert, ca.Log())
	}
}

// TestAgentStatsEndpoint: the agent binary serves its metrics, named as pilot-agent's, on its
// readiness port at /stats/prometheus in the Prometheus text format, once it holds a
// certificate.
func TestAgentStatsEndpoint(t *testing.T) {
	ca := framework.StartCA(t, t.TempDir())
	a := framework.StartAgent(t, ca, framework.Agent{ID: spiffe.ID{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "echo"}})
	resp, err := http.Get("http://" + a.Readiness + "/stats/prometheus")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if mt, params, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); resp.StatusCode != http.StatusOK || mt != "text/plain" || params["version"] != "0.0.4" {
		t.Fatalf("GET /stats/prometheus: %s, Content-Type %q; want 200 in the Prometheus text format 0.0.4", resp.Status, resp.Header.Get("Content-Type"))
	}
	stats, err := telemetrytest.Parse(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct {
		name   string
		labels []string
	}{
		{"istio_agent_cert_expiry_seconds", []string{"resource_name", "default"}},
		{"istio_agent_num_outgoing_requests", []string{"request_type", "csr"}},
		{"istio_agent_startup_duration_seconds", nil},
		{"istio_agent_go_goroutines", nil},
	} {
		if v, _ := stats.Value(m.name, m.labels...); v <= 0 {
			t.Errorf("%s%v = %v, want > 0", m.name, m.labels, v)
		}
	}
}
