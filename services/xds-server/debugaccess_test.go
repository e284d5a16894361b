package xdsserver

import (
	"context"
	"crypto/tls"
	"net"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	securityv1 "sailplane.dev/proto/security/v1"
	"sailplane.dev/services/xds-server/internal/fakebus"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/schema"
)

const typeSyncz = "istio.io/debug/syncz"

// TestDebugAccessRule: who may read proxy status and config dumps. Over TLS, a certificate the
// trust bundle verifies, of the control plane's namespace; over plaintext, anyone when the
// listener is loopback (or --debug-plaintext), no one otherwise.
func TestDebugAccessRule(t *testing.T) {
	mesh, err := pki.NewSelfSigned(pki.ECDSAP256, "cluster.local", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := pki.NewSelfSigned(pki.ECDSAP256, "cluster.local", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{Namespace: "mesh-cp"}, Deps{Logger: testLogger(t), Config: fakebus.New(), Registry: fakebus.New()})
	if err != nil {
		t.Fatal(err)
	}
	srv.bundles.bundles["cluster.local"] = &securityv1.TrustBundle{
		TrustDomain: "cluster.local", RootCertificates: []string{string(pki.EncodeCerts(mesh.Cert))},
	}
	plaintext := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}})
	for _, tc := range []struct {
		name           string
		ctx            context.Context
		plaintextDebug bool
		want           codes.Code
	}{
		{"TLS, control plane's namespace", tlsPeer(issueFor(t, mesh, "mesh-cp", "admin")), false, codes.OK},
		{"TLS, another namespace", tlsPeer(issueFor(t, mesh, "demo", "admin")), false, codes.PermissionDenied},
		{"TLS, a certificate of another root", tlsPeer(issueFor(t, foreign, "mesh-cp", "admin")), false, codes.Unauthenticated},
		{"TLS, no certificate", tlsPeer(), false, codes.Unauthenticated},
		{"plaintext, loopback listener", plaintext, true, codes.OK},
		{"plaintext, other listener", plaintext, false, codes.PermissionDenied},
		{"no peer", context.Background(), true, codes.Unauthenticated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv.plaintextDebug = tc.plaintextDebug
			if got := status.Code(srv.debugAccess(tc.ctx, srv.peerIdentity(tc.ctx))); got != tc.want {
				t.Errorf("debugAccess: %v, want %v", got, tc.want)
			}
		})
	}

	for addr, want := range map[string]bool{"127.0.0.1:15010": true, "[::1]:15010": true, "0.0.0.0:15010": false, "198.18.0.1:15010": false} {
		a, err := net.ResolveTCPAddr("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := isLoopback(a); got != want {
			t.Errorf("isLoopback(%s) = %v, want %v", addr, got, want)
		}
	}
}

// secureServer is a running xds-server with plaintext and TLS listeners on loopback, trusting
// the returned mesh root.
// secureServer runs a server with a plaintext and a TLS listener whose clients' certificates the
// returned root verifies; opts adjust its config and deps first.
func secureServer(t testing.TB, opts ...func(*Config, *Deps)) (*Server, *pki.Authority) {
	t.Helper()
	mesh, serving := servingCert(t)
	store := bus.NewStore()
	if err := store.Replace(schema.TrustBundle.TypeURL, []*bus.Resource{{Name: "cluster.local", Body: &securityv1.TrustBundle{
		TrustDomain: "cluster.local", RootCertificates: []string{string(pki.EncodeCerts(mesh.Cert))}}}}); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Listen: "127.0.0.1:0", SecureListen: "127.0.0.1:0", PodName: "xds-0"}
	deps := Deps{
		Logger: testLogger(t), Config: fakebus.New(), Registry: fakebus.New(), Bundle: bus.Local(store),
		TLS: ServingTLS(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &serving, nil }),
	}
	for _, o := range opts {
		o(&cfg, &deps)
	}
	srv, err := New(cfg, deps)
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
	return srv, mesh
}

// TestDebugOverTLS: on a real TLS listener, proxy status is answered to a client certificate of
// the control plane's namespace and refused to one of another namespace; the loopback
// plaintext listener answers anyone.
func TestDebugOverTLS(t *testing.T) {
	srv, mesh := secureServer(t)

	syncz := func(creds credentials.TransportCredentials, addr net.Addr) error {
		t.Helper()
		resp, err := firstResponse(t, addr.String(), creds, &discoverygrpc.DiscoveryRequest{
			TypeUrl: typeSyncz, Node: &corev3.Node{Id: "sidecar~~debug.istio-system~istio-system.svc.cluster.local"}})
		if err == nil && resp.GetTypeUrl() != typeSyncz {
			t.Errorf("answered %s", resp.GetTypeUrl())
		}
		return err
	}
	clientTLS := func(ns string) credentials.TransportCredentials {
		return credentials.NewTLS(&tls.Config{RootCAs: mesh.RootPool(), ServerName: "istiod.istio-system.svc",
			Certificates: []tls.Certificate{issueFor(t, mesh, ns, "admin")}})
	}
	if err := syncz(clientTLS("istio-system"), srv.SecureAddr()); err != nil {
		t.Errorf("TLS, certificate of istio-system: %v", err)
	}
	if err := syncz(clientTLS("demo"), srv.SecureAddr()); status.Code(err) != codes.PermissionDenied {
		t.Errorf("TLS, certificate of demo: %v, want PermissionDenied", err)
	}
	if err := syncz(insecure.NewCredentials(), srv.Addr()); err != nil {
		t.Errorf("plaintext on loopback: %v", err)
	}
}
