package e2e

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/spiffe"
)

// securityPair is a mesh with two workloads in their own test hosts: server (demo/echo, an
// xDS gRPC server behind echo.demo.svc.cluster.local) and client (demo/caller), both labelled
// in the mesh, and RPCs flowing from client to server.
type securityPair struct {
	mesh           *securityMesh
	server, client *workload
	load           *rpcLoad
}

func startSecurityPair(t *testing.T, start func(*testing.T, string, ...string) *securityMesh) *securityPair {
	t.Helper()
	serverHost, clientHost := framework.NewTestHost(t, "echo"), framework.NewTestHost(t, "caller")
	// Both labelled in the mesh: the server's listener takes mTLS (PERMISSIVE, the default, on
	// a workload holding mesh certificates) and the client's cluster uses it (auto mTLS).
	mesh, lis := securityMeshWithEcho(t, start, serverHost, inMesh("echo"))
	p := &securityPair{mesh: mesh, server: mesh.startWorkload(t, echoID, serverHost, inMesh("echo")),
		client: mesh.startWorkload(t, callerID, clientHost, inMesh("caller"))}
	serveWorkload(t, p.server, lis)
	client := dialWorkload(t, p.client, echoTarget)
	// The server serves once it has its listener, the client calls once it has its routes.
	framework.Eventually(t, time.Minute, func() error {
		_, err := callMTLS(t.Context(), client)
		return err
	})
	p.load = startLoad(t, client)
	return p
}

// TestWorkloadCertificates: a proxyless gRPC client and an xDS gRPC server, each in its own
// test host with an agent (real binaries) getting its certificate from Sailplane's ca, talk
// mTLS through xDS routing while RPCs flow without pause, each connection living a second so
// handshakes keep using the current certificates. Not one RPC may fail while
//   - the certificates rotate every few seconds;
//   - the ca crashes, an agent finds it gone, and the ca comes back: every agent then renews
//     with the restarted ca;
//   - the ca rotates its root: the workloads end up with leaves of the new root, trusting it
//     alone.
func TestWorkloadCertificates(t *testing.T) {
	for _, topo := range securityTopologies {
		t.Run(topo.name, func(t *testing.T) {
			t.Parallel()
			p := startSecurityPair(t, topo.start)
			agents := []*framework.AgentProcess{p.server.agent, p.client.agent}

			t.Run("rotation", func(t *testing.T) {
				// Each side has shown its peer at least three certificates.
				var before exchange
				p.load.eventually(t, time.Minute, func(last exchange, _ int) error {
					if before = last; last.client == nil {
						return errors.New("no RPC has passed yet")
					}
					return nil
				})
				seen := map[string]map[string]bool{"client": {}, "server": {}}
				p.load.eventually(t, time.Minute, func(last exchange, _ int) error {
					seen["client"][last.client.SerialNumber.Text(16)] = true
					seen["server"][last.server.SerialNumber.Text(16)] = true
					if len(seen["client"]) < 3 || len(seen["server"]) < 3 {
						return fmt.Errorf("certificates shown: %d by the client, %d by the server; want 3 each", len(seen["client"]), len(seen["server"]))
					}
					return nil
				})
				checkIdentities(t, before)
			})

			t.Run("ca crash", func(t *testing.T) {
				p.mesh.ca.Kill()
				before := p.load.passed()
				// Wait until an agent has tried to renew and failed: the workloads keep their
				// certificates, and RPCs keep flowing (none fails, some pass).
				p.load.eventually(t, time.Minute, func(_ exchange, passed int) error {
					if passed == before {
						return errors.New("no RPC has passed since the ca was killed")
					}
					for _, a := range agents {
						if strings.Contains(a.Log(), "cannot get a certificate") {
							return nil
						}
					}
					return errors.New("no agent has found the ca gone yet")
				})
				offsets := []int{len(agents[0].Log()), len(agents[1].Log())}
				p.mesh.startCA(t)
				// Every agent renews with the restarted ca and its peer sees the new certificate.
				p.load.eventually(t, time.Minute, func(last exchange, _ int) error {
					for i, shown := range []*x509.Certificate{last.server, last.client} {
						if !slices.Contains(agents[i].SerialsSince(offsets[i]), shown.SerialNumber.Text(16)) {
							return fmt.Errorf("%s still shows certificate %s, issued before the ca restarted", agents[i].ID, shown.SerialNumber.Text(16))
						}
					}
					return nil
				})
			})

			t.Run("root rotation", func(t *testing.T) {
				oldRoot := readCert(t, filepath.Join(p.mesh.certDir(), pki.CACertFile))
				// Killed, not stopped: a graceful stop waits up to 5 s for the bus streams, and
				// the certificates live 6 s.
				p.mesh.ca.Kill()
				p.mesh.startCA(t, "--rotate-root-before", time.Now().UTC().Format(time.RFC3339), "--root-rotation-grace", securityCertTTL.String())
				// The rotation runs through: the workloads trust the new root alone, and both
				// present leaves it signed.
				var newRoot *x509.Certificate
				p.load.eventually(t, time.Minute, func(last exchange, _ int) error {
					for _, a := range agents {
						roots := a.Roots(t)
						if len(roots) != 1 || roots[0].Equal(oldRoot) {
							return fmt.Errorf("%s trusts %d roots, the old one among them or alone", a.ID, len(roots))
						}
						newRoot = roots[0]
					}
					for side, leaf := range map[string]*x509.Certificate{"client": last.client, "server": last.server} {
						if err := verifiesWith(leaf, newRoot); err != nil {
							return fmt.Errorf("the %s's certificate: %w", side, err)
						}
					}
					return nil
				})
				if signing := readCert(t, filepath.Join(p.mesh.certDir(), pki.CACertFile)); !signing.Equal(newRoot) {
					t.Errorf("the ca signs with %s, the workloads trust %s", signing.Subject, newRoot.Subject)
				}
			})
			p.load.checkNoFailures(t)
		})
	}
}

// checkIdentities: each side saw its peer's SPIFFE ID.
func checkIdentities(t *testing.T, x exchange) {
	t.Helper()
	for _, c := range []struct {
		side string
		leaf *x509.Certificate
		want spiffe.ID
	}{{"the server saw the client as", x.client, callerID}, {"the client saw the server as", x.server, echoID}} {
		if len(c.leaf.URIs) != 1 || c.leaf.URIs[0].String() != c.want.String() {
			t.Errorf("%s %v, want %s", c.side, c.leaf.URIs, c.want)
		}
	}
}

func verifiesWith(leaf, root *x509.Certificate) error {
	roots := x509.NewCertPool()
	roots.AddCert(root)
	_, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err
}

func readCert(t *testing.T, file string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	certs, err := pki.ParseCerts(data)
	if err != nil || len(certs) == 0 {
		t.Fatalf("%s: %v (%d certificates)", file, err, len(certs))
	}
	return certs[0]
}

func peerAuthenticationYAML(mode string) string {
	return fmt.Sprintf(`apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: demo}
spec: {mtls: {mode: %s}}
`, mode)
}

const denyCallerYAML = `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-caller, namespace: demo}
spec:
  selector: {matchLabels: {app: echo}}
  action: DENY
  rules:
  - from: [{source: {principals: [cluster.local/ns/demo/sa/caller]}}]
`

// TestMeshPolicies: an xDS gRPC server (demo/echo) and three clients, each in its own test
// host: two in the mesh with agents (demo/caller, demo/other) and one plaintext, outside it.
//   - PERMISSIVE accepts them all. A proxyless server cannot tell TLS from plaintext on one port
//     (gRFC A36), so on a server not labelled in the mesh it serves plaintext, and the mesh
//     clients use plaintext to it (auto mTLS), as istiod decides.
//   - STRICT: the plaintext client is refused, the mesh clients talk mTLS, each side seeing
//     the other's SPIFFE ID; a client expecting another identity for the server (its service
//     account in the registry changed) refuses it.
//   - An AuthorizationPolicy denying demo/caller (principals) fails its RPCs with
//     PermissionDenied while demo/other passes; deleting it lets demo/caller through again.
func TestMeshPolicies(t *testing.T) {
	for _, topo := range securityTopologies {
		t.Run(topo.name, func(t *testing.T) {
			t.Parallel()
			serverHost := framework.NewTestHost(t, "echo")
			mesh, lis := securityMeshWithEcho(t, topo.start, serverHost, map[string]string{"app": "echo"})
			conf := filepath.Join(mesh.dir, "etc/sailplane/conf")
			framework.WriteFile(t, conf, "peer.yaml", peerAuthenticationYAML("PERMISSIVE"))
			serveWorkload(t, mesh.startWorkload(t, echoID, serverHost, map[string]string{"app": "echo"}), lis)
			clients := map[string]framework.EchoClient{}
			for _, id := range []spiffe.ID{callerID, otherID} {
				host := framework.NewTestHost(t, id.ServiceAccount)
				clients[id.ServiceAccount] = dialWorkload(t, mesh.startWorkload(t, id, host, inMesh(id.ServiceAccount)), echoTarget)
			}
			plain := dialPlaintext(t, framework.NewTestHost(t, "plain"), mesh.xdsAddr, echoTarget)
			call := func(c framework.EchoClient) (framework.Identities, error) {
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				defer cancel()
				return framework.CallIdentities(ctx, c)
			}

			// passes: the client's RPC is answered, over mTLS with the right identities on
			// both sides when id is set, else over plaintext.
			passes := func(c framework.EchoClient, id spiffe.ID) error {
				got, err := call(c)
				switch {
				case err != nil:
					return err
				case id == spiffe.ID{} && (got.Peer != "" || got.Caller != ""):
					return fmt.Errorf("mTLS, want plaintext (the server saw %q)", got.Caller)
				case id == spiffe.ID{}:
					return nil
				case got.Peer == "":
					return errors.New("plaintext, want mTLS")
				case got.Caller != id.String():
					return fmt.Errorf("the server saw the client as %q, want %s", got.Caller, id)
				case got.Peer != echoID.String():
					return fmt.Errorf("the client saw the server as %q, want %s", got.Peer, echoID)
				}
				return nil
			}
			// fails: the client's RPC fails with code, and a message holding saying.
			fails := func(c framework.EchoClient, code codes.Code, saying string) error {
				if _, err := call(c); status.Code(err) != code || !strings.Contains(fmt.Sprint(err), saying) {
					return fmt.Errorf("got %v, want %s saying %q", err, code, saying)
				}
				return nil
			}
			// settles waits until every check holds, then checks they all hold for a few
			// more RPCs each: the state is stable, not a passing moment.
			settles := func(checks ...func() error) {
				t.Helper()
				all := func() error {
					for _, check := range checks {
						if err := check(); err != nil {
							return err
						}
					}
					return nil
				}
				framework.Eventually(t, time.Minute, all)
				for range 10 {
					if err := all(); err != nil {
						t.Fatal(err)
					}
				}
			}
			caller, other := clients["caller"], clients["other"]

			t.Run("PERMISSIVE accepts all", func(t *testing.T) {
				settles(
					func() error { return passes(plain, spiffe.ID{}) },
					func() error { return passes(caller, spiffe.ID{}) },
					func() error { return passes(other, spiffe.ID{}) })
			})

			t.Run("STRICT requires mTLS", func(t *testing.T) {
				framework.WriteFile(t, conf, "peer.yaml", peerAuthenticationYAML("STRICT"))
				settles(
					func() error { return fails(plain, codes.Unavailable, "") },
					func() error { return passes(caller, callerID) },
					func() error { return passes(other, otherID) })
			})

			t.Run("the client checks the server's identity", func(t *testing.T) {
				framework.WriteFile(t, conf, "echo.yaml", echoEntryYAML(serverHost.IP(), lis.Addr().String(), "impostor", map[string]string{"app": "echo"}))
				settles(func() error { return fails(caller, codes.Unavailable, "do not match any of the accepted SANs") })
				framework.WriteFile(t, conf, "echo.yaml", echoEntryYAML(serverHost.IP(), lis.Addr().String(), echoID.ServiceAccount, map[string]string{"app": "echo"}))
				settles(func() error { return passes(caller, callerID) })
			})

			t.Run("AuthorizationPolicy principals", func(t *testing.T) {
				framework.WriteFile(t, conf, "authz.yaml", denyCallerYAML)
				settles(
					func() error { return fails(caller, codes.PermissionDenied, "deny-caller") },
					func() error { return passes(other, otherID) })
				if err := os.Remove(filepath.Join(conf, "authz.yaml")); err != nil {
					t.Fatal(err)
				}
				settles(
					func() error { return passes(caller, callerID) },
					func() error { return passes(other, otherID) })
			})

			t.Run("PERMISSIVE again", func(t *testing.T) {
				framework.WriteFile(t, conf, "peer.yaml", peerAuthenticationYAML("PERMISSIVE"))
				settles(
					func() error { return passes(plain, spiffe.ID{}) },
					func() error { return passes(caller, spiffe.ID{}) })
			})
		})
	}
}
