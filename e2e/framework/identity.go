package framework

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	_ "google.golang.org/grpc/credentials/tls/certprovider/pemfile" // registers file_watcher
	xdscreds "google.golang.org/grpc/credentials/xds"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/xds"

	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/spiffe"
	"sailplane.dev/tools/testenv"
)

// CA is a ca binary running alone with its root in files: workload certificates for tests.
type CA struct {
	Addr     string // CreateCertificate, over TLS
	CertDir  string // its etc/certs, which testenv.ProvisionCert signs with
	RootFile string // the root that verifies it and its certificates
}

// StartCA runs the ca binary in dir until the test ends and waits for its root.
func StartCA(t testing.TB, dir string) CA {
	t.Helper()
	ca := CA{Addr: FreeAddr(t), CertDir: filepath.Join(dir, "etc/certs")}
	ca.RootFile = filepath.Join(ca.CertDir, pki.RootCertFile)
	Start(t, dir, Binary(t, "ca"), "--kubernetes=false", "--ca-listen", ca.Addr, "--ca-cert-dir", ca.CertDir,
		"--bus-listen", FreeAddr(t))
	Eventually(t, 30*time.Second, func() error { _, err := os.Stat(filepath.Join(ca.CertDir, pki.CAKeyFile)); return err })
	return ca
}

// Agent describes the workload an agent serves.
type Agent struct {
	ID      spiffe.ID
	XDSAddr string // in the gRPC bootstrap
	IP      string // in the node ID; 127.0.0.1 when empty
	Labels  map[string]string
	// CertTTL is the certificate lifetime asked for; 1 h when zero.
	CertTTL time.Duration
}

// StartAgent provisions a certificate for a.ID (as an operator does for a VM) and runs an
// agent binary with it in its own folder until the test ends; it returns the gRPC bootstrap
// the agent wrote (its "default" certificate provider watches the agent's files) once the
// agent is ready.
func StartAgent(t testing.TB, ca CA, a Agent) string {
	t.Helper()
	dir := t.TempDir()
	prov := testenv.ProvisionCert(t, ca.CertDir, a.ID)
	ready := FreeAddr(t)
	ttl := a.CertTTL
	if ttl == 0 {
		ttl = time.Hour
	}
	ip := a.IP
	if ip == "" {
		ip = "127.0.0.1"
	}
	xdsAddr := a.XDSAddr
	if xdsAddr == "" {
		xdsAddr = "127.0.0.1:15010"
	}
	args := []string{"--ca-address", ca.Addr, "--root-cert", ca.RootFile, "--provisioned-cert-dir", prov,
		"--token-file", filepath.Join(dir, "no-token"), "--readiness-address", ready,
		"--grpc-bootstrap", "grpc-bootstrap.json", "--xds-address", xdsAddr,
		"--pod", a.ID.ServiceAccount + "-0", "--ip", ip, "--cert-ttl", ttl.String(), "--file-refresh", "1s"}
	if len(a.Labels) > 0 {
		var kv []string
		for k, v := range a.Labels {
			kv = append(kv, k+"="+v)
		}
		sort.Strings(kv)
		args = append(args, "--labels", strings.Join(kv, ","))
	}
	Start(t, dir, Binary(t, "agent"), args...)
	Eventually(t, 30*time.Second, func() error {
		resp, err := http.Get("http://" + ready + "/healthz/ready")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readiness %d", resp.StatusCode)
		}
		return nil
	})
	return filepath.Join(dir, "grpc-bootstrap.json")
}

// ReadBootstrap reads a bootstrap file an agent wrote.
func ReadBootstrap(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// IdentityEcho answers UnaryCall with its ID (ServerId) and the caller's SPIFFE ID, empty
// over plaintext (Hostname).
type IdentityEcho struct {
	testpb.UnimplementedTestServiceServer
	ID string
}

// UnaryCall answers with the backend's ID and the caller's identity.
func (e *IdentityEcho) UnaryCall(ctx context.Context, _ *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	p, _ := peer.FromContext(ctx)
	caller, _ := PeerID(p)
	return &testpb.SimpleResponse{ServerId: e.ID, Hostname: caller}, nil
}

// PeerID is the SPIFFE ID of p's certificate; false over plaintext.
func PeerID(p *peer.Peer) (string, bool) {
	if p == nil {
		return "", false
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 || len(info.State.PeerCertificates[0].URIs) != 1 {
		return "", false
	}
	return info.State.PeerCertificates[0].URIs[0].String(), true
}

// StartMeshEchoOn serves an IdentityEcho on lis with a gRPC xDS server using xDS credentials
// (plaintext when its listener carries no TLS), bootstrapped with bootstrapJSON: it enforces
// the mTLS and RBAC of the server-side listener Sailplane sends, serving once it has it.
func StartMeshEchoOn(t testing.TB, id string, lis net.Listener, bootstrapJSON []byte) {
	t.Helper()
	creds, err := xdscreds.NewServerCredentials(xdscreds.ServerOptions{FallbackCreds: insecure.NewCredentials()})
	if err != nil {
		t.Fatal(err)
	}
	serveXDS(t, id, lis, bootstrapJSON, creds, &IdentityEcho{ID: id})
}

// MeshClient dials target through gRPC's xDS resolver with xDS credentials (mTLS when the
// cluster says so, else plaintext), bootstrapped with bootstrapJSON, e.g. an agent's.
func MeshClient(t testing.TB, target string, bootstrapJSON []byte) EchoClient {
	t.Helper()
	creds, err := xdscreds.NewClientCredentials(xdscreds.ClientOptions{FallbackCreds: insecure.NewCredentials()})
	if err != nil {
		t.Fatal(err)
	}
	builder, err := xds.NewXDSResolverWithConfigForTesting(bootstrapJSON)
	if err != nil {
		t.Fatalf("xds resolver: %v", err)
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(creds), grpc.WithResolvers(builder))
	if err != nil {
		t.Fatalf("dial %s: %v", target, err)
	}
	t.Cleanup(func() { conn.Close() })
	return testpb.NewTestServiceClient(conn)
}

// Identities is who took part in one call.
type Identities struct {
	Server string // the answering backend's ID
	Caller string // the caller's SPIFFE ID as the server saw it; empty over plaintext
	Peer   string // the server's SPIFFE ID as the client saw it; empty over plaintext
}

// CallIdentities sends one RPC to an IdentityEcho and reports the identities on both sides.
func CallIdentities(ctx context.Context, c EchoClient) (Identities, error) {
	var p peer.Peer
	resp, err := c.UnaryCall(ctx, &testpb.SimpleRequest{}, grpc.Peer(&p))
	if err != nil {
		return Identities{}, err
	}
	if resp.GetServerId() == "" {
		return Identities{}, errors.New("the backend is not an IdentityEcho")
	}
	server, _ := PeerID(&p)
	return Identities{Server: resp.GetServerId(), Caller: resp.GetHostname(), Peer: server}, nil
}
