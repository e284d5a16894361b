package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"sailplane.dev/e2e/framework"
	securityv1 "sailplane.dev/proto/security/v1"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/workloadcert"
)

// secureSailplane is Sailplane started by a secure topology.
type secureSailplane struct {
	secure    string       // TLS xDS
	bundleBus string       // the bus the trust bundle is published on
	busSec    bus.Security // how a test consumes that bus
	// buses are the mTLS buses of the services (service account -> address); none in hyper.
	buses map[string]string
}

// secureTopologies start Sailplane with TLS xDS on a free port and the plaintext port off
// (--xds-listen=), its root generated into workdir/etc/certs.
var secureTopologies = []struct {
	name  string
	start func(t *testing.T, dir string) secureSailplane
}{
	// As istiod: xDS and CreateCertificate on one port.
	{"hyper", func(t *testing.T, dir string) secureSailplane {
		secure, busAddr := framework.FreeAddr(t), framework.FreeAddr(t)
		framework.Start(t, dir, framework.Binary(t, "hyper"), "--config-source", "files",
			"--xds-listen=", "--xds-tls-listen", secure, "--bus-listen", busAddr)
		return secureSailplane{secure: secure, bundleBus: busAddr}
	}},
	// Each service starts from the bootstrap folder the ca keeps for it (--service-cert-dir), then
	// gets and renews its own certificate from the ca (on its own port): every bus is mTLS with
	// them, and xds-server serves TLS xDS with its own, which the ca gives istiod's names.
	{"microservices", func(t *testing.T, dir string) secureSailplane {
		configBus, registryBus, caBus, secure, caAddr := framework.FreeAddr(t), framework.FreeAddr(t), framework.FreeAddr(t), framework.FreeAddr(t), framework.FreeAddr(t)
		framework.Start(t, dir, framework.Binary(t, "ca"), "--kubernetes=false", "--ca-listen", caAddr,
			"--service-cert-dir", "var/service-certs", "--bus-listen", caBus)
		identity := waitServiceCerts(t, dir, caAddr)
		framework.Start(t, dir, framework.Binary(t, "xds-server"), append(identity("xds-server"), "--config-bus", configBus, "--registry-bus", registryBus,
			"--ca-bus", caBus, "--xds-listen=", "--xds-tls-listen", secure)...)
		framework.Start(t, dir, framework.Binary(t, "endpoint-watcher"), append(identity("endpoint-watcher"), "--config-bus", configBus, "--bus-listen", registryBus)...)
		framework.Start(t, dir, framework.Binary(t, "config-ingest"), append(identity("config-ingest"), "--mesh-config", "etc/sailplane/mesh.yaml", "--bus-listen", configBus)...)
		// The test consumes the buses as xds-server does, with its bootstrap certificate.
		me := framework.IdentityFromDir(t, filepath.Join(dir, "var/service-certs/xds-server"))
		return secureSailplane{secure: secure, bundleBus: caBus,
			busSec: bus.Security{Identity: me, Peers: bus.SailplanePeers("cluster.local", "istio-system")},
			buses:  map[string]string{"config-ingest": configBus, "endpoint-watcher": registryBus, "ca": caBus}}
	}},
}

// waitServiceCerts waits for the bootstrap folders a ca started with --service-cert-dir
// var/service-certs keeps for the services under dir (else a service's first request waits out
// a retry), and returns the flags that give a service its identity from them and the ca at caAddr.
func waitServiceCerts(t *testing.T, dir, caAddr string) (identity func(serviceAccount string) []string) {
	t.Helper()
	framework.Eventually(t, time.Minute, func() error {
		_, err := os.Stat(filepath.Join(dir, "var/service-certs/xds-server", workloadcert.RootCertFile))
		return err
	})
	return func(sa string) []string {
		folder := "var/service-certs/" + sa
		return []string{"--ca-address", caAddr, "--ca-root-cert", folder + "/root-cert.pem", "--provisioned-cert-dir", folder}
	}
}

// TestSecureXDS: Sailplane keeps its root under etc/certs (generated on the first start) and
// serves xDS over TLS (istiod's 15012) with a serving certificate the root verifies; in hyper
// the ca's CreateCertificate answers on the same port. A gRPC xDS client bootstrapped with that
// root ("tls" channel credentials) and a certificate it issued gets its config; a client without
// the root fails the handshake.
func TestSecureXDS(t *testing.T) {
	for _, topo := range secureTopologies {
		t.Run(topo.name, func(t *testing.T) { testSecureXDS(t, topo.name == "hyper", topo.start) })
	}
}

func testSecureXDS(t *testing.T, caOnXDSPort bool, start func(*testing.T, string) secureSailplane) {
	v1 := framework.StartEcho(t, "v1", "127.0.0.1:0")
	v2 := framework.StartEcho(t, "v2", "127.0.0.1:0")
	dir := t.TempDir()
	framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", "")
	framework.WriteFile(t, dir, "etc/sailplane/conf/service.yaml", serviceYAML(v1, v2))
	framework.WriteFile(t, dir, "etc/sailplane/conf/traffic.yaml", trafficYAML(0, 100))
	sp := start(t, dir)
	secure := sp.secure

	rootFile := filepath.Join(dir, "etc/certs/root-cert.pem")
	framework.Eventually(t, time.Minute, func() error {
		_, err := os.Stat(filepath.Join(dir, "etc/certs/ca-key.pem"))
		return err
	})
	rootPEM, err := os.ReadFile(rootFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(rootPEM) {
		t.Fatalf("%s holds no certificate", rootFile)
	}

	// The bus carries the same root as the trust bundle.
	bundles := framework.RecordSecureBus(t, sp.bundleBus, sp.busSec, schema.TrustBundle.TypeURL)
	framework.Eventually(t, time.Minute, func() error {
		r, ok := bundles.Get(schema.TrustBundle.TypeURL, "cluster.local")
		if !ok {
			return errors.New("no TrustBundle cluster.local on the bus")
		}
		if got := strings.Join(r.Body.(*securityv1.TrustBundle).GetRootCertificates(), ""); got != string(rootPEM) {
			return fmt.Errorf("TrustBundle roots\n%s\nwant %s's\n%s", got, rootFile, rootPEM)
		}
		return nil
	})

	// The serving certificate verifies with the root for istiod's name and the listen address,
	// and not without it.
	var handshake error
	framework.Eventually(t, time.Minute, func() error {
		handshake = tlsHandshake(secure, &tls.Config{RootCAs: roots, ServerName: "istiod.istio-system.svc"})
		return handshake
	})
	if err := tlsHandshake(secure, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"}); err != nil {
		t.Errorf("serving certificate for the listen host: %v", err)
	}
	var unknown x509.UnknownAuthorityError
	if err := tlsHandshake(secure, &tls.Config{ServerName: "127.0.0.1"}); !errors.As(err, &unknown) {
		t.Errorf("a client without the root: got %v, want an unknown-authority handshake failure", err)
	}

	client := framework.XDSClientTLS(t, secure, echoTarget, filepath.Dir(rootFile))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	framework.WaitServing(ctx, t, client)
	if counts := countBackends(ctx, t, client, 20); counts["v2"] != 20 {
		t.Fatalf("want all 20 RPCs on v2, got %v", counts)
	}

	if len(sp.buses) > 0 {
		t.Run("BusMTLS", func(t *testing.T) { checkBusMTLS(ctx, t, dir, sp) })
	}
	if !caOnXDSPort {
		return
	}
	// The ca answers on the same port: an anonymous request is Unauthenticated, not Unimplemented.
	conn, err := grpc.NewClient(secure, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	err = conn.Invoke(ctx, "/istio.v1.auth.IstioCertificateService/CreateCertificate", &emptypb.Empty{}, &emptypb.Empty{})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("CreateCertificate on the xDS port: got %v, want Unauthenticated", err)
	}
}

func tlsHandshake(addr string, cfg *tls.Config) error {
	d := tls.Dialer{Config: cfg}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return c.Close()
}
