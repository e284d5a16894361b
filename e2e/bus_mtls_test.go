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
	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/spiffe"
	"sailplane.dev/shared/workloadcert"
)

// checkBusMTLS: every service's bus is mTLS with the service's own certificate (its SPIFFE ID,
// a key that is not the bootstrap folder's: it asked the ca itself), and refuses a consumer
// whose identity is not one of Sailplane's with PermissionDenied, and a plaintext one.
func checkBusMTLS(ctx context.Context, t *testing.T, dir string, sp secureSailplane) {
	web := framework.SignIdentity(t, filepath.Join(dir, "etc/certs"), spiffe.ID{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "web"})
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
			err := framework.SubscribeOnce(ctx, addr, framework.AnyServer(web), schema.VirtualService.TypeURL)
			if status.Code(err) != codes.PermissionDenied {
				t.Errorf("a consumer with identity %s: %v, want PermissionDenied", web.C.ID, err)
			}
			if err := framework.SubscribeOnce(ctx, addr, insecure.NewCredentials(), schema.VirtualService.TypeURL); status.Code(err) != codes.Unavailable {
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
