package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"sailplane.dev/shared/grpcserver"
	"sailplane.dev/shared/testlog"
	"sailplane.dev/shared/version"
)

// TestVersion: sailplanectl reads each server's version from the headers of a real gRPC
// connection, plaintext and TLS, and shows the unreachable ones as such.
func TestVersion(t *testing.T) {
	defer func(v, c string) { version.Version, version.Component = v, c }(version.Version, version.Component)
	version.Version, version.Component = "v1.2.3-test", "xds-server"
	xdsAddr := serve(t, grpcserver.New(testlog.New(t, slog.LevelInfo)))
	version.Component = "ca"
	rootFile, tlsConfig := selfSigned(t)
	caAddr := serve(t, grpcserver.New(testlog.New(t, slog.LevelInfo), grpc.Creds(credentials.NewTLS(tlsConfig))))
	closed := closedAddress(t)

	type result struct {
		Client  version.Info
		Servers []serverVersion
	}
	for _, tc := range []struct {
		name string
		args []string
		want []serverVersion
	}{
		{"verified", []string{"--xds-address", xdsAddr + "," + closed, "--bus=", "--ca-address", caAddr, "--root-cert", rootFile}, []serverVersion{
			{Role: "xds", Address: xdsAddr, Reachable: true, Component: "xds-server", Version: "v1.2.3-test"},
			{Role: "xds", Address: closed, Error: "connection refused"},
			{Role: "ca", Address: caAddr, Reachable: true, Component: "ca", Version: "v1.2.3-test"},
		}},
		{"no root", []string{"--xds-address=", "--bus", closed, "--ca-address", caAddr}, []serverVersion{
			{Role: "bus", Address: closed, Error: "connection refused"},
			{Role: "ca", Address: caAddr, Reachable: true, Component: "ca", Version: "v1.2.3-test", Unverified: true},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := run(t, append([]string{"version", "-o", "json"}, tc.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			var got result
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if got.Client.Component != "sailplanectl" || got.Client.Version != "v1.2.3-test" {
				t.Errorf("client = %+v", got.Client)
			}
			if len(got.Servers) != len(tc.want) {
				t.Fatalf("servers = %+v, want %+v", got.Servers, tc.want)
			}
			for i, w := range tc.want {
				if got.Servers[i] != w {
					t.Errorf("server %d = %+v, want %+v", i, got.Servers[i], w)
				}
			}
		})
	}

	out, err := run(t, "version", "--client")
	if err != nil || !strings.HasPrefix(out, "ROLE") || strings.Count(out, "\n") != 2 || !strings.Contains(out, "sailplanectl  v1.2.3-test") {
		t.Errorf("version --client = %q, %v", out, err)
	}

	out, err = run(t, "version", "--xds-address", xdsAddr, "--bus=", "--ca-address=")
	if err != nil {
		t.Fatal(err)
	}
	want := "ROLE    ADDRESS" + strings.Repeat(" ", len(xdsAddr)-len("ADDRESS")) + "  COMPONENT     VERSION\n" +
		"client  " + strings.Repeat(" ", len(xdsAddr)) + "  sailplanectl  v1.2.3-test\n" +
		"xds     " + xdsAddr + "  xds-server    v1.2.3-test\n"
	if out != want {
		t.Errorf("table:\n%s\nwant:\n%s", out, want)
	}
}

func serve(t *testing.T, gs *grpc.Server) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return lis.Addr().String()
}

// closedAddress is a loopback address nothing listens on.
func closedAddress(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

// selfSigned returns the file of a self-signed certificate for 127.0.0.1 and a server config
// serving it.
func selfSigned(t *testing.T) (string, *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "root-cert.pem")
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return file, &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS12}
}
