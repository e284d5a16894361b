package e2e

import (
	"context"
	"crypto/tls"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/shared/bus/bustest"
	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/spiffe"
	"sailplane.dev/shared/workloadcert"
	"sailplane.dev/tools/testenv"
)

// checkBusMTLS: every service's bus is mTLS with the service's own certificate (its SPIFFE ID,
// a key that is not the bootstrap folder's: it asked the ca itself), and refuses a consumer
// whose identity is not one of Sailplane's with PermissionDenied, and a plaintext one.
func checkBusMTLS(ctx context.Context, t *testing.T, dir string, sp secureSailplane) {
	// TLS xDS is served with xds-server's own certificate (istiod's names, its identity).
	xdsState, err := busHandshake(sp.secure, sp.busSec.Identity)
	if err != nil {
		t.Fatal(err)
	}
	if uris := xdsState.PeerCertificates[0].URIs; len(uris) != 1 || uris[0].String() != "spiffe://cluster.local/ns/istio-system/sa/xds-server" {
		t.Errorf("TLS xDS certificate names %v, want xds-server's identity", uris)
	}
	web := framework.SignIdentity(t, testenv.CAFromFolder(t, filepath.Join(dir, "etc/certs")), spiffe.ID{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "web"})
	for sa, addr := range sp.buses {
		t.Run(sa, func(t *testing.T) {
			var served *tls.ConnectionState
			framework.Eventually(t, time.Minute, func() error {
				state, err := busHandshake(addr, sp.busSec.Identity)
				served = state
				return err
			})
			leaf := served.PeerCertificates[0]
			want := spiffe.ID{TrustDomain: "cluster.local", Namespace: "istio-system", ServiceAccount: sa}
			if len(leaf.URIs) != 1 || leaf.URIs[0].String() != want.String() {
				t.Errorf("bus certificate names %v, want %s", leaf.URIs, want)
			}
			if sa != "ca" { // the ca signs its own; the services asked for theirs
				data, err := os.ReadFile(filepath.Join(dir, "var/service-certs", sa, workloadcert.CertChainFile))
				if err != nil {
					t.Fatal(err)
				}
				bootstrap, err := pki.ParseCerts(data)
				if err != nil {
					t.Fatal(err)
				}
				if pki.PublicKeysEqual(leaf.PublicKey, bootstrap[0].PublicKey) {
					t.Errorf("the bus serves the bootstrap certificate's key: want the service's own")
				}
			}
			err := bustest.SubscribeOnce(ctx, addr, framework.AnyServer(web), schema.VirtualService.TypeURL)
			if status.Code(err) != codes.PermissionDenied {
				t.Errorf("a consumer with identity %s: %v, want PermissionDenied", web.C.ID, err)
			}
			if err := bustest.SubscribeOnce(ctx, addr, insecure.NewCredentials(), schema.VirtualService.TypeURL); status.Code(err) != codes.Unavailable {
				t.Errorf("a plaintext consumer: %v, want Unavailable (failed handshake)", err)
			}
		})
	}
}

// busHandshake completes an mTLS handshake with a bus as src and returns the server's side.
func busHandshake(addr string, src workloadcert.Source) (*tls.ConnectionState, error) {
	cfg := workloadcert.ClientTLS(src, func(spiffe.ID) error { return nil })
	cfg.NextProtos = []string{"h2"}
	d := tls.Dialer{Config: cfg}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	state := c.(*tls.Conn).ConnectionState()
	if len(state.PeerCertificates) == 0 {
		return nil, errors.New("no server certificate")
	}
	return &state, nil
}

// TestBusMTLSOnKube: in the Kubernetes microservices topology each service gets its certificate
// from the ca with its own service account's token (reviewed by the real API server) and serves
// its bus with it; a consumer holding a valid certificate of the ca for a workload's identity
// (demo/web, also from a real token) is refused with PermissionDenied, while the mesh config
// flows to a consumer with a Sailplane identity and xDS reaches a client through the buses.
func TestBusMTLSOnKube(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	k, _, sp, _ := startTwoOfThreeOnKube(ctx, t, startMicroservicesOnKube)

	mesh := framework.RecordSecureBus(t, sp.configBus, sp.busSec, schema.MeshConfig.TypeURL)
	framework.Eventually(t, time.Minute, func() error { return mesh.HasAll(schema.MeshConfig.TypeURL, "mesh") })

	for sa, addr := range map[string]string{"config-ingest": sp.configBus, "endpoint-watcher": sp.registryBus} {
		state, err := busHandshake(addr, sp.busSec.Identity)
		if err != nil {
			t.Fatalf("%s's bus: %v", sa, err)
		}
		want := spiffe.ID{TrustDomain: "cluster.local", Namespace: "istio-system", ServiceAccount: sa}
		if uris := state.PeerCertificates[0].URIs; len(uris) != 1 || uris[0].String() != want.String() {
			t.Errorf("%s's bus certificate names %v, want %s", sa, uris, want)
		}
	}

	kube := framework.NewKube(t, k.RestConfig())
	dir := t.TempDir()
	framework.WriteFile(t, dir, "web-token", kube.ServiceAccountToken(t, "demo", "web", "istio-ca"))
	web := framework.WorkloadCert(t, workloadcert.Config{CAAddress: sp.caAddr, RootCertFile: sp.rootFile, TokenFile: filepath.Join(dir, "web-token")})
	if id := web.Current().ID.String(); id != "spiffe://cluster.local/ns/demo/sa/web" {
		t.Fatalf("the ca issued %s for demo/web's token", id)
	}
	for _, addr := range []string{sp.configBus, sp.registryBus} {
		if err := bustest.SubscribeOnce(ctx, addr, framework.AnyServer(web), schema.VirtualService.TypeURL); status.Code(err) != codes.PermissionDenied {
			t.Errorf("bus %s, consumer demo/web: %v, want PermissionDenied", addr, err)
		}
	}
}
