package e2e

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/spiffe"
)

// The shared harness of the security tests: Sailplane with its ca (securityMesh), proxyless gRPC
// workloads in test hosts using the bootstraps and certificates of real agents (workload, on
// framework.StartAgent, StartMeshEchoOn and MeshClient), and RPCs flowing between them with
// every failure counted (rpcLoad).

// securityMesh is Sailplane with its ca, serving plaintext xDS from the config under
// dir/etc/sailplane, its root kept in dir/etc/certs.
type securityMesh struct {
	dir     string
	xdsAddr string // plaintext xDS, named in the workloads' bootstraps
	caAddr  string // CreateCertificate over TLS
	caBin   string
	caArgs  []string
	ca      *framework.Process // hyper, or the ca alone
	// owner is the test the mesh lives as long as: a ca restarted in a subtest outlives it.
	owner *testing.T
}

// securityTopologies start a securityMesh; caArgs are the ca's flags, on every (re)start.
var securityTopologies = []struct {
	name  string
	start func(t *testing.T, dir string, caArgs ...string) *securityMesh
}{
	// The ca is in hyper: killing the ca kills xDS too, as a crashed istiod does.
	{"hyper", func(t *testing.T, dir string, caArgs ...string) *securityMesh {
		m := &securityMesh{dir: dir, xdsAddr: framework.FreeAddr(t), caAddr: framework.FreeAddr(t), caBin: framework.Binary(t, "hyper"), owner: t}
		m.caArgs = append([]string{"--config-source", "files", "--xds-listen", m.xdsAddr, "--xds-tls-listen", m.caAddr,
			"--bus-listen", framework.FreeAddr(t)}, caArgs...)
		m.startCA(t)
		return m
	}},
	// The ca runs alone beside config-ingest, endpoint-watcher and xds-server.
	{"microservices", func(t *testing.T, dir string, caArgs ...string) *securityMesh {
		m := &securityMesh{dir: dir, xdsAddr: framework.FreeAddr(t), caAddr: framework.FreeAddr(t), caBin: framework.Binary(t, "ca"), owner: t}
		configBus, registryBus, caBus := framework.FreeAddr(t), framework.FreeAddr(t), framework.FreeAddr(t)
		m.caArgs = append([]string{"--kubernetes=false", "--ca-listen", m.caAddr, "--bus-listen", caBus}, caArgs...)
		m.startCA(t)
		xdsServer := framework.Start(t, dir, framework.Binary(t, "xds-server"), "--config-bus", configBus, "--registry-bus", registryBus,
			"--ca-bus", caBus, "--xds-listen", m.xdsAddr)
		watcher := framework.Start(t, dir, framework.Binary(t, "endpoint-watcher"), "--config-bus", configBus, "--bus-listen", registryBus)
		framework.Start(t, dir, framework.Binary(t, "config-ingest"), "--mesh-config", "etc/sailplane/mesh.yaml", "--bus-listen", configBus)
		// Subscribers stop before the buses they read: a bus server stopping waits up to 5 s
		// for its streams to end.
		t.Cleanup(func() { xdsServer.Stop(); watcher.Stop() })
		return m
	}},
}

// startCA starts the ca's process with its flags and extra ones, and waits for its root.
func (m *securityMesh) startCA(t *testing.T, extra ...string) {
	t.Helper()
	m.ca = framework.Start(m.owner, m.dir, m.caBin, append(slices.Clone(m.caArgs), extra...)...)
	framework.Eventually(t, time.Minute, func() error {
		_, err := os.Stat(filepath.Join(m.certDir(), pki.CAKeyFile))
		return err
	})
}

func (m *securityMesh) certDir() string  { return filepath.Join(m.dir, "etc/certs") }
func (m *securityMesh) rootFile() string { return filepath.Join(m.certDir(), pki.RootCertFile) }

// Workload certificates in the security tests live 6 s and gRPC re-reads them every 2 s: the
// agent renews 2 refreshes before expiry, every 2 s, so each workload has 4 s to get a
// renewed certificate in use. The ca caps certificates to the same 6 s, so a root rotation's
// last step (the old root leaves the bundle once every leaf it signed has expired) comes 6 s
// after the switch, and workloads get 6 s of grace to learn the new root before it signs.
const (
	securityCertTTL     = 6 * time.Second
	securityFileRefresh = 2 * time.Second
)

// meshEchoServiceEntry is echoServiceEntry inside the mesh (a ServiceEntry is outside by
// default, and clients never use mesh mTLS to services outside).
var meshEchoServiceEntry = strings.Replace(echoServiceEntry, "resolution: STATIC", "resolution: STATIC\n  location: MESH_INTERNAL", 1)

// tlsModeLabel marks workloads holding mesh certificates, as Istio's injector does.
const tlsModeLabel = "security.istio.io/tlsMode"

var securityCAArgs = []string{"--default-cert-ttl", securityCertTTL.String(), "--max-cert-ttl", securityCertTTL.String()}

// securityMeshWithEcho starts a mesh serving the echo service from one xDS gRPC server at
// server (a test host) labelled with echoLabels, with the service account echo. It returns
// the mesh and the server's listener; policies under etc/sailplane/conf/ beside echo.yaml apply.
func securityMeshWithEcho(t *testing.T, start func(*testing.T, string, ...string) *securityMesh, server *framework.TestHost, echoLabels map[string]string) (*securityMesh, net.Listener) {
	t.Helper()
	lis := server.Listen(t, 0)
	dir := t.TempDir()
	framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", meshYAML)
	framework.WriteFile(t, dir, "etc/sailplane/conf/echo.yaml", echoEntryYAML(server.IP(), lis.Addr().String(), echoID.ServiceAccount, echoLabels))
	return start(t, dir, securityCAArgs...), lis
}

// echoEntryYAML is the echo service with one endpoint, at ip and lis's port. A WorkloadEntry
// with a service account is in the mesh (Istio mTLS) unless its tlsMode label says otherwise,
// as istiod has it: a server not labelled in the mesh says so.
func echoEntryYAML(ip, lis, serviceAccount string, labels map[string]string) string {
	if _, ok := labels[tlsModeLabel]; !ok {
		labels = maps.Clone(labels)
		labels[tlsModeLabel] = "disabled"
	}
	var l []string
	for k, v := range labels {
		l = append(l, k+": "+v)
	}
	slices.Sort(l)
	return meshEchoServiceEntry + fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: echo-server, namespace: demo}
spec: {address: %s, ports: {grpc: %s}, labels: {%s}, serviceAccount: %s}
`, ip, port(lis), strings.Join(l, ", "), serviceAccount)
}

// startWorkload runs an agent for id in host, labelled labels in its xDS node.
func (m *securityMesh) startWorkload(t *testing.T, id spiffe.ID, host *framework.TestHost, labels map[string]string) *workload {
	t.Helper()
	ca := framework.CA{Addr: m.caAddr, CertDir: m.certDir(), RootFile: m.rootFile()}
	a := framework.StartAgent(t, ca, framework.Agent{ID: id, XDSAddr: m.xdsAddr, IP: host.IP(), Labels: labels,
		CertTTL: securityCertTTL, FileRefresh: securityFileRefresh})
	return &workload{agent: a, host: host}
}

// inMesh are the labels of a workload holding mesh certificates, with app: name.
func inMesh(name string) map[string]string {
	return map[string]string{"app": name, tlsModeLabel: "istio"}
}

var (
	echoID   = spiffe.ID{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "echo"}
	callerID = spiffe.ID{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "caller"}
	otherID  = spiffe.ID{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "other"}
)

// workload is a proxyless gRPC workload in its own test host, with its agent.
type workload struct {
	agent *framework.AgentProcess
	host  *framework.TestHost
}

// serveWorkload serves an IdentityEcho on lis as a gRPC xDS server with xDS credentials,
// bootstrapped with the agent's bootstrap, so it applies the server-side listener Sailplane
// sends, mTLS included; it serves only once it has that listener. Each connection lives at
// most a second, so clients keep handshaking again, with whatever certificates are current.
func serveWorkload(t *testing.T, w *workload, lis net.Listener) {
	t.Helper()
	framework.StartMeshEchoOn(t, w.agent.ID.ServiceAccount, lis, w.agent.BootstrapJSON(t),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: time.Second, MaxConnectionAgeGrace: time.Minute}))
}

// dialWorkload is a client of target through gRPC's xDS resolver with xDS credentials,
// bootstrapped with the workload's agent's bootstrap, connecting from the workload's test host.
func dialWorkload(t *testing.T, w *workload, target string) framework.EchoClient {
	t.Helper()
	return framework.MeshClient(t, target, w.agent.BootstrapJSON(t), grpc.WithContextDialer(w.host.DialContext))
}

// exchange is an mTLS RPC's two leaves.
type exchange struct {
	client, server *x509.Certificate
}

// callMTLS sends one RPC, which must be mTLS.
func callMTLS(ctx context.Context, client framework.EchoClient) (exchange, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	id, err := framework.CallIdentities(ctx, client)
	switch {
	case err != nil:
		return exchange{}, err
	case id.CallerCert == nil || id.PeerCert == nil:
		return exchange{}, errors.New("plaintext: want mTLS")
	}
	return exchange{client: id.CallerCert, server: id.PeerCert}, nil
}

// rpcLoad sends mTLS RPCs one after the other, one each 10 ms at most, and keeps every failure.
type rpcLoad struct {
	*pacedCalls

	mu       sync.Mutex
	ok       int
	failures []error
	last     exchange
}

func startLoad(t *testing.T, client framework.EchoClient) *rpcLoad {
	l := &rpcLoad{}
	l.pacedCalls = startPaced(t, 10*time.Millisecond, func(ctx context.Context) {
		x, err := callMTLS(ctx, client)
		if ctx.Err() != nil {
			return // stopped: not a failure
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		if err != nil {
			l.failures = append(l.failures, fmt.Errorf("%s: %w", time.Now().Format("15:04:05.000"), err))
		} else {
			l.ok++
			l.last = x
		}
	})
	return l
}

// eventually waits for cond on the load's state, failing the test as soon as an RPC fails.
// cond sees the last RPC's exchange and how many have passed.
func (l *rpcLoad) eventually(t *testing.T, timeout time.Duration, cond func(last exchange, passed int) error) {
	t.Helper()
	framework.Eventually(t, timeout, func() error {
		l.mu.Lock()
		failures, passed, last := slices.Clone(l.failures), l.ok, l.last
		l.mu.Unlock()
		if len(failures) > 0 {
			t.Fatalf("%d RPCs failed (%d passed), first: %v", len(failures), passed, failures[0])
		}
		return cond(last, passed)
	})
}

// passed is how many RPCs have passed.
func (l *rpcLoad) passed() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ok
}

// checkNoFailures stops the load and fails the test if any RPC failed.
func (l *rpcLoad) checkNoFailures(t *testing.T) {
	t.Helper()
	l.stop()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.failures) > 0 {
		t.Fatalf("%d RPCs failed (%d passed): %v", len(l.failures), l.ok, errors.Join(l.failures...))
	}
	t.Logf("%d RPCs, none failed", l.ok)
}

// dialPlaintext is a client of target outside the mesh, connecting from host: gRPC's xDS
// resolver without certificates, and plaintext credentials.
func dialPlaintext(t *testing.T, host *framework.TestHost, xdsAddr, target string) framework.EchoClient {
	t.Helper()
	nodeID := fmt.Sprintf("sidecar~%s~plain-0.demo~demo.svc.cluster.local", host.IP())
	return framework.DialXDS(t, target, framework.GRPCBootstrap(xdsAddr, nodeID),
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(host.DialContext))
}
