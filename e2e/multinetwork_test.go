package e2e

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/tools/demo/echo"
	"sailplane.dev/tools/testenv"
	"sailplane.dev/tools/xdsdiff"
	"sailplane.dev/tools/xdssim"
)

// TestMultiNetworkTraffic sends real gRPC from a client in network net1 to a backend in net2
// that the client cannot reach: in the client's network namespace the backend's address is a
// blackhole route; only net2's east-west gateway is routable. The simulator stands in for both
// Envoys, on what hyper serves them: the client's sidecar (which endpoint, over which TLS: the
// gateway, with the SNI naming the service) and the gateway's AUTO_PASSTHROUGH listener (which
// SNI-DNAT cluster and endpoint that SNI goes to). The client opens TLS with that SNI and ALPN,
// as a sidecar does; the gateway forwards the connection untouched to the backend, which
// terminates it, as its sidecar would.
func TestMultiNetworkTraffic(t *testing.T) {
	k := testenv.KubeForTest(t)
	kube := framework.NewKube(t, k.RestConfig())
	kube.EnsureNamespace(t, "istio-system")
	clientHost := framework.NewTestHost(t, "net1-client")
	gatewayHost := framework.NewTestHost(t, "net2-gateway")
	backendHost := framework.NewTestHost(t, "net2-backend")
	if out, err := exec.Command("ip", "-n", clientHost.Name, "route", "add", "blackhole", backendHost.IP()+"/32").CombinedOutput(); err != nil {
		t.Fatalf("blackhole route in %s: %v: %s", clientHost.Name, err, out)
	}

	const host = "echo.demo.svc.cluster.local"
	sni := fmt.Sprintf("outbound_.%d_._.%s", echoPort, host)
	cert := selfSignedCert(t, sni)
	framework.StartEchoOn(t, "net2-echo", tls.NewListener(backendHost.Listen(t, echoPort),
		&tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"istio-h2", "h2"}}))

	manifest := fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata: {name: demo}
---
apiVersion: v1
kind: Service
metadata: {name: echo, namespace: demo}
spec:
  selector: {app: echo}
  ports: [{name: grpc, port: %[1]d}]
---
apiVersion: v1
kind: Pod
metadata:
  name: echo-0
  namespace: demo
  labels: {app: echo, topology.istio.io/network: net2, security.istio.io/tlsMode: istio}
spec:
  containers: [{name: echo, image: example.invalid/echo, ports: [{name: grpc, containerPort: %[1]d}]}]
status: {podIP: %[2]s}
---
apiVersion: v1
kind: Service
metadata:
  name: istio-eastwestgateway
  namespace: istio-system
  labels: {istio: eastwestgateway, topology.istio.io/network: net2}
spec:
  selector: {istio: eastwestgateway}
  externalIPs: [%[3]s]
  ports: [{name: tls, port: 15443}]
---
apiVersion: v1
kind: Pod
metadata:
  name: istio-eastwestgateway-0
  namespace: istio-system
  labels: {istio: eastwestgateway, topology.istio.io/network: net2}
spec:
  containers: [{name: istio-proxy, image: example.invalid/proxyv2, ports: [{name: tls, containerPort: 15443}]}]
status: {podIP: %[3]s}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: cross-network-gateway, namespace: istio-system}
spec:
  selector: {istio: eastwestgateway}
  servers:
  - port: {number: 15443, name: tls, protocol: TLS}
    tls: {mode: AUTO_PASSTHROUGH}
    hosts: ["*.local"]
`, echoPort, backendHost.IP(), gatewayHost.IP())
	objs, err := framework.Decode(manifest)
	if err != nil {
		t.Fatal(err)
	}
	pods, err := casePods(objs)
	if err != nil {
		t.Fatal(err)
	}
	kube.Apply(t, manifest)
	setPodsRunning(t, kube, pods)
	writeEndpointSlices(t, kube, objs, pods)
	s := startHyperOnKube(t, k, kube)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	svc, err := kube.Clientset.CoreV1().Services("demo").Get(ctx, "echo", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sidecar := framework.XDSNode{
		ID: "sidecar~" + clientHost.IP() + "~client-0.demo~demo.svc.cluster.local",
		Metadata: map[string]any{"NAMESPACE": "demo", "NETWORK": "net1", "CLUSTER_ID": "Kubernetes",
			"LABELS": map[string]any{"app": "client"}, "INSTANCE_IPS": clientHost.IP()},
	}
	gateway := framework.XDSNode{
		ID: "router~" + gatewayHost.IP() + "~istio-eastwestgateway-0.istio-system~istio-system.svc.cluster.local",
		Metadata: map[string]any{"NAMESPACE": "istio-system", "NETWORK": "net2", "CLUSTER_ID": "Kubernetes",
			"LABELS": map[string]any{"istio": "eastwestgateway", "topology.istio.io/network": "net2"}, "INSTANCE_IPS": gatewayHost.IP()},
	}
	gatewayAddr := net.JoinHostPort(gatewayHost.IP(), "15443")

	// The client's sidecar: a gRPC call to the service goes to the gateway, with mTLS whose SNI
	// names the service port, once hyper has the gateway and the backend.
	var out *xdssim.Result
	framework.Eventually(t, time.Minute, func() error {
		res, err := simulate(ctx, s.xds, sidecar, xdssim.Request{Port: echoPort, DestinationIP: svc.Spec.ClusterIP,
			ListenerPort: 15001, Protocol: xdssim.GRPC, Host: host + fmt.Sprint(":", echoPort),
			Method: "POST", Path: "/grpc.testing.TestService/UnaryCall"})
		if err != nil {
			return err
		}
		if res.Endpoint != gatewayAddr || res.UpstreamTLS == nil {
			return fmt.Errorf("sidecar sends to %s (of %v) with TLS %+v; want the gateway %s with mTLS", res.Endpoint, res.Endpoints, res.UpstreamTLS, gatewayAddr)
		}
		out = res
		return nil
	})
	if out.UpstreamTLS.SNI != sni {
		t.Fatalf("sidecar's SNI %q, want %q", out.UpstreamTLS.SNI, sni)
	}
	for _, e := range out.Endpoints {
		if strings.HasPrefix(e, backendHost.IP()+":") {
			t.Fatalf("the net1 sidecar was sent net2's endpoint %s itself: %v", e, out.Endpoints)
		}
	}
	gwSnap, err := framework.FetchXDS(ctx, s.xds, gateway, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	gwSim, err := xdssim.New(gwSnap)
	if err != nil {
		t.Fatal(err)
	}
	serveGateway(t, gatewayHost, gwSim)

	// The backend is unreachable from the client but through the gateway.
	dctx, dcancel := context.WithTimeout(ctx, 2*time.Second)
	if c, err := clientHost.DialContext(dctx, net.JoinHostPort(backendHost.IP(), fmt.Sprint(echoPort))); err == nil {
		c.Close()
		t.Fatalf("the client reaches the backend %s directly: the test would prove nothing", backendHost.IP())
	}
	dcancel()

	alpn := out.UpstreamTLS.ALPN
	conn, err := grpc.NewClient("passthrough:///"+out.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			raw, err := clientHost.DialContext(ctx, addr)
			if err != nil {
				return nil, err
			}
			tc := tls.Client(raw, &tls.Config{ServerName: out.UpstreamTLS.SNI, NextProtos: alpn,
				InsecureSkipVerify: true, // Istio checks the SPIFFE identity, not the SNI: here, the one certificate
				VerifyConnection: func(cs tls.ConnectionState) error {
					if len(cs.PeerCertificates) == 0 || !bytes.Equal(cs.PeerCertificates[0].Raw, cert.Certificate[0]) {
						return errors.New("not the backend's certificate")
					}
					return nil
				}})
			if err := tc.HandshakeContext(ctx); err != nil {
				raw.Close()
				return nil, err
			}
			return tc, nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	id, err := framework.Call(ctx, echo.NewClient(conn))
	if err != nil {
		t.Fatalf("gRPC through the east-west gateway: %v", err)
	}
	if id != "net2-echo" {
		t.Fatalf("answered by %q, want net2-echo", id)
	}
}

// simulate fetches what the xDS server at addr sends node and simulates req on it.
func simulate(ctx context.Context, addr string, node framework.XDSNode, req xdssim.Request) (*xdssim.Result, error) {
	snap, err := framework.FetchXDS(ctx, addr, node, 2*time.Second)
	if err != nil {
		return nil, err
	}
	return simulateOn(snap, req)
}

func simulateOn(snap xdsdiff.Snapshot, req xdssim.Request) (*xdssim.Result, error) {
	sim, err := xdssim.New(snap)
	if err != nil {
		return nil, err
	}
	return sim.Simulate(req)
}

// serveGateway stands in for the east-west gateway's Envoy on 15443 of h: it reads each
// connection's TLS ClientHello (SNI, ALPN) without answering it, asks the simulator where the
// served listener sends that connection, and splices the untouched bytes to that endpoint.
func serveGateway(t *testing.T, h *framework.TestHost, sim *xdssim.Simulator) {
	lis := h.Listen(t, 15443)
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{}
	track := func(c net.Conn, add bool) {
		mu.Lock()
		defer mu.Unlock()
		if add {
			conns[c] = struct{}{}
		} else {
			delete(conns, c)
		}
	}
	wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			track(c, true)
			wg.Go(func() {
				defer func() { track(c, false); c.Close() }()
				if err := gatewayForward(h, sim, c, track); err != nil {
					t.Logf("gateway: %v", err)
				}
			})
		}
	})
	t.Cleanup(func() {
		lis.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

func gatewayForward(h *framework.TestHost, sim *xdssim.Simulator, c net.Conn, track func(net.Conn, bool)) error {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	rec := &recordingConn{Conn: c}
	var hello *tls.ClientHelloInfo
	errPeeked := errors.New("peeked")
	_ = tls.Server(rec, &tls.Config{GetConfigForClient: func(chi *tls.ClientHelloInfo) (*tls.Config, error) {
		hello = chi
		return nil, errPeeked
	}}).Handshake()
	if hello == nil {
		return errors.New("no TLS ClientHello")
	}
	_ = c.SetReadDeadline(time.Time{})
	res, err := sim.Simulate(xdssim.Request{Port: 15443, Protocol: xdssim.TCP, TLS: true, SNI: hello.ServerName, ALPN: hello.SupportedProtos})
	if err != nil {
		return fmt.Errorf("SNI %s: %w", hello.ServerName, err)
	}
	if res.UpstreamTLS != nil {
		return fmt.Errorf("SNI %s: the gateway would originate TLS (%+v), not pass it through", hello.ServerName, res.UpstreamTLS)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	up, err := h.DialContext(ctx, res.Endpoint)
	cancel()
	if err != nil {
		return err
	}
	track(up, true)
	defer func() { track(up, false); up.Close() }()
	if _, err := up.Write(rec.buf.Bytes()); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(c, up)
		c.Close()
		close(done)
	}()
	_, _ = io.Copy(up, c)
	up.Close()
	<-done
	return nil
}

// recordingConn keeps what is read from the connection and writes nothing, so a TLS server can
// parse a ClientHello that is then replayed upstream as it came.
type recordingConn struct {
	net.Conn
	buf bytes.Buffer
}

func (r *recordingConn) Read(p []byte) (int, error) {
	n, err := r.Conn.Read(p)
	r.buf.Write(p[:n])
	return n, err
}

func (r *recordingConn) Write(p []byte) (int, error) { return len(p), nil }

// selfSignedCert is a throwaway ECDSA certificate for name.
func selfSignedCert(t *testing.T, name string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
