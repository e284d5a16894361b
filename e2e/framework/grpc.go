package framework

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/xds"

	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/spiffe"
	"sailplane.dev/tools/demo/echo"
)

// Echo is a real gRPC backend answering grpc.testing.TestService/UnaryCall with its own ID (the
// quick start's demo server, tools/demo/echo), so a test can tell which backend served each RPC.
type Echo struct {
	echo.Server
	Addr string
}

// StartEcho serves an Echo backend on addr (e.g. "127.0.0.1:0") until the test ends.
func StartEcho(t testing.TB, id, addr string) *Echo {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("echo %s: %v", id, err)
	}
	return StartEchoOn(t, id, lis)
}

// StartEchoOn serves an Echo backend on lis (e.g. a TestHost's listener) until the test ends.
func StartEchoOn(t testing.TB, id string, lis net.Listener) *Echo {
	t.Helper()
	e := &Echo{Server: echo.Server{ID: id}, Addr: lis.Addr().String()}
	ServeTestService(t, lis, e)
	return e
}

// ServeTestService serves impl as grpc.testing.TestService on lis until the test ends or stop
// is called: for backends that misbehave or go away on purpose.
func ServeTestService(t testing.TB, lis net.Listener, impl testpb.TestServiceServer) (stop func()) {
	t.Helper()
	srv := grpc.NewServer()
	echo.Register(srv, impl)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	// Wait for Serve to return so no goroutine outlives the test (goleak).
	stop = func() {
		srv.Stop()
		<-done
	}
	t.Cleanup(stop)
	return stop
}

// GRPCBootstrap is the gRPC xDS bootstrap a proxyless client uses to reach Sailplane's xDS server.
func GRPCBootstrap(xdsAddr, nodeID string) []byte {
	return GRPCBootstrapIn(xdsAddr, nodeID, "", "")
}

// GRPCBootstrapIn is GRPCBootstrap for a client that says it runs in region and zone.
func GRPCBootstrapIn(xdsAddr, nodeID, region, zone string) []byte {
	return clientBootstrap(xdsAddr, nodeID, region, zone, insecureCreds)
}

// GRPCBootstrapTLS is GRPCBootstrap over TLS (istiod's 15012): the client verifies the xDS
// server's certificate with the roots in rootFile, and authenticates with the certificate and
// key in certFile and keyFile (the TLS port serves only authenticated clients).
func GRPCBootstrapTLS(xdsAddr, nodeID, rootFile, certFile, keyFile string) []byte {
	return clientBootstrap(xdsAddr, nodeID, "", "", map[string]any{"type": "tls", "config": map[string]any{
		"ca_certificate_file": rootFile, "certificate_file": certFile, "private_key_file": keyFile}})
}

var insecureCreds = map[string]any{"type": "insecure"}

// clientBootstrap is the bootstrap of a proxyless client in namespace demo, region and zone.
func clientBootstrap(xdsAddr, nodeID, region, zone string, creds map[string]any) []byte {
	locality := map[string]any{}
	if region != "" {
		locality["region"] = region
	}
	if zone != "" {
		locality["zone"] = zone
	}
	return bootstrap(xdsAddr, creds, map[string]any{
		"id":       nodeID,
		"locality": locality,
		"metadata": map[string]any{"GENERATOR": "grpc", "NAMESPACE": "demo", "CLUSTER_ID": "Kubernetes"},
	}, nil)
}

// GRPCServerBootstrap is the bootstrap of a proxyless gRPC server (xds.NewGRPCServer) in
// namespace demo with labels: it asks Sailplane for its server-side listener by the name
// istio-agent's bootstrap template gives, "xds.istio.io/grpc/lds/inbound/<ip>:<port>".
func GRPCServerBootstrap(xdsAddr, nodeID string, labels map[string]string) []byte {
	return bootstrap(xdsAddr, insecureCreds, map[string]any{
		"id":       nodeID,
		"locality": map[string]any{},
		"metadata": map[string]any{"GENERATOR": "grpc", "NAMESPACE": "demo", "CLUSTER_ID": "Kubernetes", "LABELS": labels},
	}, map[string]any{"server_listener_resource_name_template": "xds.istio.io/grpc/lds/inbound/%s"})
}

// bootstrap is a gRPC xDS bootstrap for node, to xdsAddr with creds, with extra top-level keys.
func bootstrap(xdsAddr string, creds, node, extra map[string]any) []byte {
	doc := map[string]any{
		"xds_servers": []any{map[string]any{
			"server_uri":      xdsAddr,
			"channel_creds":   []any{creds},
			"server_features": []string{"xds_v3"},
		}},
		"node": node,
	}
	maps.Copy(doc, extra)
	b, _ := json.Marshal(doc)
	return b
}

// StartXDSEchoOn serves an Echo backend on lis with a gRPC xDS server (xds.NewGRPCServer,
// plaintext) bootstrapped with bootstrapJSON, so it applies the server-side listener (and its RBAC
// filters) Sailplane sends; it serves only once it has that listener. Stopped when the test ends.
func StartXDSEchoOn(t testing.TB, id string, lis net.Listener, bootstrapJSON []byte) *Echo {
	t.Helper()
	e := &Echo{Server: echo.Server{ID: id}, Addr: lis.Addr().String()}
	serveXDS(t, id, lis, bootstrapJSON, e, grpc.Creds(insecure.NewCredentials()))
	return e
}

// serveXDS serves impl on lis with a gRPC xDS server built with opts (its credentials among
// them) until the test ends.
func serveXDS(t testing.TB, id string, lis net.Listener, bootstrapJSON []byte, impl testpb.TestServiceServer, opts ...grpc.ServerOption) {
	t.Helper()
	srv, err := xds.NewGRPCServer(append(opts, xds.BootstrapContentsForTesting(bootstrapJSON))...)
	if err != nil {
		t.Fatalf("xds server %s: %v", id, err)
	}
	echo.Register(srv, impl)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
}

// XDSClient dials target (e.g. "xds:///echo.demo.svc.cluster.local:7070") through gRPC's xDS
// resolver, bootstrapped against xdsAddr. Each client has its own xDS connection.
func XDSClient(t testing.TB, xdsAddr, target string) EchoClient {
	t.Helper()
	nodeID := fmt.Sprintf("sidecar~127.0.0.1~%s.demo~demo.svc.cluster.local", t.Name())
	return xdsClient(t, target, GRPCBootstrap(xdsAddr, nodeID))
}

// XDSClientIn is XDSClient for a client in region and zone (its xDS node's locality). Its node
// IP is 192.0.2.1, which no backend has, so the registry cannot place it elsewhere.
func XDSClientIn(t testing.TB, xdsAddr, target, region, zone string) EchoClient {
	t.Helper()
	nodeID := fmt.Sprintf("sidecar~192.0.2.1~%s-%s.demo~demo.svc.cluster.local", strings.ReplaceAll(t.Name(), "/", "-"), region)
	return xdsClient(t, target, GRPCBootstrapIn(xdsAddr, nodeID, region, zone))
}

// XDSClientTLS is XDSClient for an xDS server over TLS, verified with the roots in
// certDir/root-cert.pem; the client authenticates with a certificate of demo/default that it
// issues itself with the ca's key in certDir (the self-signed root's folder, istio-ca-secret's
// file names).
func XDSClientTLS(t testing.TB, xdsAddr, target, certDir string) EchoClient {
	t.Helper()
	nodeID := fmt.Sprintf("sidecar~127.0.0.1~%s.demo~demo.svc.cluster.local", strings.ReplaceAll(t.Name(), "/", "-"))
	certFile, keyFile := ClientCertFrom(t, certDir, spiffe.ID{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "default"})
	return xdsClient(t, target, GRPCBootstrapTLS(xdsAddr, nodeID, filepath.Join(certDir, pki.RootCertFile), certFile, keyFile))
}

// ClientCertFrom issues a client certificate of id with the CA in certDir (Istio's layout:
// ca-cert.pem, ca-key.pem, root-cert.pem) and writes it and its key to a temporary folder,
// returning their paths.
func ClientCertFrom(t testing.TB, certDir string, id spiffe.ID) (certFile, keyFile string) {
	t.Helper()
	files := map[string][]byte{}
	for _, name := range []string{pki.CACertFile, pki.CAKeyFile, pki.CertChainFile, pki.RootCertFile} {
		data, err := os.ReadFile(filepath.Join(certDir, name))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		files[name] = data
	}
	auth, err := pki.FromIstioLayout(files)
	if err != nil {
		t.Fatalf("CA in %s: %v", certDir, err)
	}
	key, err := pki.GenerateKey(pki.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := auth.Issue(key.Public(), pki.LeafOptions{URIs: []*url.URL{id.URL()}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := pki.EncodeKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert-chain.pem"), filepath.Join(dir, "key.pem")
	WriteFile(t, dir, "cert-chain.pem", string(pki.EncodeCerts(append([]*x509.Certificate{leaf}, auth.Chain()...)...)))
	WriteFile(t, dir, "key.pem", string(keyPEM))
	return certFile, keyFile
}

func xdsClient(t testing.TB, target string, bootstrap []byte) EchoClient {
	t.Helper()
	return DialXDS(t, target, bootstrap, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// DialXDS dials target through gRPC's xDS resolver bootstrapped with bootstrapJSON, with opts
// (the transport credentials among them); closed when the test ends.
func DialXDS(t testing.TB, target string, bootstrapJSON []byte, opts ...grpc.DialOption) EchoClient {
	t.Helper()
	builder, err := xds.NewXDSResolverWithConfigForTesting(bootstrapJSON)
	if err != nil {
		t.Fatalf("xds resolver: %v", err)
	}
	conn, err := grpc.NewClient(target, append(opts, grpc.WithResolvers(builder))...)
	if err != nil {
		t.Fatalf("dial %s: %v", target, err)
	}
	t.Cleanup(func() { conn.Close() })
	return echo.NewClient(conn)
}

// Call sends one RPC, with optional header key/value pairs, and returns the ID of the backend
// that answered.
func Call(ctx context.Context, c EchoClient, headers ...string) (string, error) {
	return echo.Call(ctx, c, headers...)
}

// WaitServing waits, up to a minute, until an RPC through c succeeds: an xDS client has its
// routes and an endpoint to send to.
func WaitServing(ctx context.Context, t testing.TB, c EchoClient) {
	t.Helper()
	Eventually(t, time.Minute, func() error {
		_, err := Call(ctx, c)
		return err
	})
}

// EchoClient calls Echo backends.
type EchoClient = echo.Client

// DialEcho connects straight to one Echo backend at addr, without xDS.
func DialEcho(t testing.TB, addr string) EchoClient {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	return echo.NewClient(conn)
}
