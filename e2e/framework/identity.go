package framework

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
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

// StartCA runs the ca binary in dir until the test ends and waits for its root and readiness.
func StartCA(t testing.TB, dir string) CA {
	t.Helper()
	ca := CA{Addr: FreeAddr(t), CertDir: filepath.Join(dir, "etc/certs")}
	ca.RootFile = filepath.Join(ca.CertDir, pki.RootCertFile)
	p := Start(t, dir, Binary(t, "ca"), "--kubernetes=false", "--ca-listen", ca.Addr, "--ca-cert-dir", ca.CertDir,
		"--bus-listen", FreeAddr(t))
	Eventually(t, 30*time.Second, func() error { _, err := os.Stat(filepath.Join(ca.CertDir, pki.CAKeyFile)); return err })
	WaitReady(t, p)
	return ca
}

// Agent describes the workload an agent serves.
type Agent struct {
	ID      spiffe.ID
	XDSAddr string // in the gRPC bootstrap
	IP      string // in the node ID; 127.0.0.1 when empty
	Labels  map[string]string
	// CertTTL is the certificate lifetime asked for; 1 h when zero. FileRefresh is how often
	// gRPC re-reads the files (the agent renews two of them before expiry); 1 s when zero.
	CertTTL, FileRefresh time.Duration
	// XDSOverTLS: the xDS proxy reaches XDSAddr over mTLS with the workload certificate (as
	// Istio's agent reaches 15012), and so does the bootstrap's channel.
	XDSOverTLS bool
	// Env and Args are added to the agent's environment (KEY=value) and flags.
	Env, Args []string
}

// AgentProcess is a running agent and what it writes.
type AgentProcess struct {
	*Process
	ID        spiffe.ID
	Bootstrap string // the gRPC xDS bootstrap
	OutputDir string // cert-chain.pem, key.pem, root-cert.pem
	Readiness string // the address serving /healthz/ready and the metrics (/stats/prometheus)
	XDSProxy  string // the Unix socket forwarding ADS streams to the xDS server (Envoy's)
	SDS       string // the Unix socket serving SDS (Envoy's)
}

// StartAgent provisions a certificate for a.ID (as an operator does for a VM) and runs an
// agent binary with it in its own folder until the test ends; it returns once the agent is
// ready, with the gRPC bootstrap written (its "default" certificate provider watches the
// agent's files).
func StartAgent(t testing.TB, ca CA, a Agent) *AgentProcess {
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
	refresh := a.FileRefresh
	if refresh == 0 {
		refresh = time.Second
	}
	args := []string{"--ca-address", ca.Addr, "--root-cert", ca.RootFile, "--provisioned-cert-dir", prov,
		"--token-file", filepath.Join(dir, "no-token"), "--readiness-address", ready,
		"--grpc-bootstrap", "grpc-bootstrap.json", "--output-dir", "creds", "--xds-address", xdsAddr,
		"--pod", a.ID.ServiceAccount + "-0", "--ip", ip, "--cert-ttl", ttl.String(), "--file-refresh", refresh.String(),
		// Short paths: a Unix socket's is limited to 107 bytes.
		"--xds-proxy-socket", filepath.Join(dir, "XDS"), "--sds-socket", filepath.Join(dir, "SDS")}
	if a.XDSOverTLS {
		args = append(args, "--xds-tls")
	}
	if len(a.Labels) > 0 {
		var kv []string
		for k, v := range a.Labels {
			kv = append(kv, k+"="+v)
		}
		sort.Strings(kv)
		args = append(args, "--labels", strings.Join(kv, ","))
	}
	args = append(args, a.Args...)
	p := StartEnv(t, a.Env, dir, Binary(t, "agent"), args...)
	// The agent alone: /healthz/ready also waits for Envoy when the agent serves one.
	Eventually(t, 30*time.Second, func() error {
		resp, err := http.Get("http://" + ready + "/healthz/agent")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readiness %d", resp.StatusCode)
		}
		return nil
	})
	return &AgentProcess{Process: p, ID: a.ID, Bootstrap: filepath.Join(dir, "grpc-bootstrap.json"), OutputDir: filepath.Join(dir, "creds"), Readiness: ready,
		XDSProxy: filepath.Join(dir, "XDS"), SDS: filepath.Join(dir, "SDS")}
}

// BootstrapJSON is the gRPC bootstrap the agent wrote.
func (a *AgentProcess) BootstrapJSON(t testing.TB) []byte {
	t.Helper()
	b, err := os.ReadFile(a.Bootstrap)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Roots are the roots the agent wrote for its workload to trust.
func (a *AgentProcess) Roots(t testing.TB) []*x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(a.OutputDir, pki.RootCertFile))
	if err != nil {
		t.Fatal(err)
	}
	roots, err := pki.ParseCerts(data)
	if err != nil {
		t.Fatal(err)
	}
	return roots
}

// certificateLine is the agent's log line for each certificate it gets.
var certificateLine = regexp.MustCompile(`msg=certificate .*serial=([0-9a-f]+)`)

// SerialsSince are the serial numbers (hex) of the certificates the agent logged it got after
// the first offset bytes of its log.
func (a *AgentProcess) SerialsSince(offset int) []string {
	var serials []string
	for _, m := range certificateLine.FindAllStringSubmatch(a.Log()[offset:], -1) {
		serials = append(serials, m[1])
	}
	return serials
}

// IdentityEcho answers UnaryCall with its ID (ServerId), the caller's SPIFFE ID (Hostname) and
// certificate (Payload), empty over plaintext.
type IdentityEcho struct {
	testpb.UnimplementedTestServiceServer
	ID string
}

// UnaryCall answers with the backend's ID and the caller's identity.
func (e *IdentityEcho) UnaryCall(ctx context.Context, _ *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	p, _ := peer.FromContext(ctx)
	caller, leaf := PeerID(p)
	resp := &testpb.SimpleResponse{ServerId: e.ID, Hostname: caller}
	if leaf != nil {
		resp.Payload = &testpb.Payload{Body: leaf.Raw}
	}
	return resp, nil
}

// PeerID is the SPIFFE ID of p's certificate and the certificate; nil over plaintext.
func PeerID(p *peer.Peer) (string, *x509.Certificate) {
	if p == nil {
		return "", nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 || len(info.State.PeerCertificates[0].URIs) != 1 {
		return "", nil
	}
	leaf := info.State.PeerCertificates[0]
	return leaf.URIs[0].String(), leaf
}

// StartMeshEchoOn serves an IdentityEcho on lis with a gRPC xDS server using xDS credentials
// (plaintext when its listener carries no TLS) and opts, bootstrapped with bootstrapJSON: it
// enforces the mTLS and RBAC of the server-side listener Sailplane sends, serving once it has it.
func StartMeshEchoOn(t testing.TB, id string, lis net.Listener, bootstrapJSON []byte, opts ...grpc.ServerOption) {
	t.Helper()
	creds, err := xdscreds.NewServerCredentials(xdscreds.ServerOptions{FallbackCreds: insecure.NewCredentials()})
	if err != nil {
		t.Fatal(err)
	}
	serveXDS(t, id, lis, bootstrapJSON, &IdentityEcho{ID: id}, append(opts, grpc.Creds(creds))...)
}

// MeshClient dials target through gRPC's xDS resolver with xDS credentials (mTLS when the
// cluster says so, else plaintext) and opts, bootstrapped with bootstrapJSON, e.g. an agent's.
func MeshClient(t testing.TB, target string, bootstrapJSON []byte, opts ...grpc.DialOption) EchoClient {
	t.Helper()
	creds, err := xdscreds.NewClientCredentials(xdscreds.ClientOptions{FallbackCreds: insecure.NewCredentials()})
	if err != nil {
		t.Fatal(err)
	}
	return DialXDS(t, target, bootstrapJSON, append(opts, grpc.WithTransportCredentials(creds))...)
}

// Identities is who took part in one call.
type Identities struct {
	Server string // the answering backend's ID
	Caller string // the caller's SPIFFE ID as the server saw it; empty over plaintext
	Peer   string // the server's SPIFFE ID as the client saw it; empty over plaintext
	// CallerCert and PeerCert are the certificates behind Caller and Peer; nil over plaintext.
	CallerCert, PeerCert *x509.Certificate
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
	id := Identities{Server: resp.GetServerId(), Caller: resp.GetHostname()}
	id.Peer, id.PeerCert = PeerID(&p)
	if der := resp.GetPayload().GetBody(); der != nil {
		if id.CallerCert, err = x509.ParseCertificate(der); err != nil {
			return Identities{}, fmt.Errorf("the caller's certificate as the server saw it: %w", err)
		}
	}
	return id, nil
}

// PluggedInRoot makes a self-signed root and writes it in Istio's cacerts layout (ca-cert.pem,
// ca-key.pem, root-cert.pem, cert-chain.pem) to a folder of its own, which Sailplane's ca
// (--cacerts-dir) and istiod (ROOT_CA_DIR) both sign from.
func PluggedInRoot(t testing.TB, name string) (*pki.Authority, string) {
	t.Helper()
	auth, err := pki.NewSelfSigned(pki.ECDSAP256, name, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	layout, err := pki.IstioLayout(auth)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for file, data := range layout {
		WriteFile(t, dir, file, string(data))
	}
	return auth, dir
}
