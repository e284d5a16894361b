package ca

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	pb "istio.io/api/security/v1alpha1"

	"sailplane.dev/shared/grpcserver"
	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/testlog"
)

// TestRegisteredElsewhere: registered on another service's gRPC server (hyper serves it on
// xds-server's listener), the ca authenticates its own callers in that server's auth
// interceptor, whatever the server's authenticator says of others; on a server without one
// (no grpcserver.WithAuth) it refuses every request rather than sign unauthenticated.
func TestRegisteredElsewhere(t *testing.T) {
	dir := t.TempDir()
	r := startCA(t, Config{CertDir: dir, Embedded: true})
	refuseAll := func(context.Context) (context.Context, error) {
		return nil, status.Error(codes.PermissionDenied, "the host server refuses everyone")
	}
	for _, tc := range []struct {
		name     string
		opts     []grpc.ServerOption
		cert     bool
		code     codes.Code
		contains string
	}{
		{"host authenticator, client certificate", []grpc.ServerOption{grpcserver.WithAuth(refuseAll)}, true, codes.OK, ""},
		{"host authenticator, no credentials", []grpc.ServerOption{grpcserver.WithAuth(refuseAll)}, false, codes.Unauthenticated, "neither a client certificate"},
		{"no authenticator", nil, true, codes.Unauthenticated, "not authenticated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := testlog.New(t, slog.LevelInfo)
			gs := grpcserver.New(log, append(tc.opts, grpc.Creds(credentials.NewTLS(r.ServerTLS())))...)
			r.Register(gs)
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() { defer close(done); _ = gs.Serve(lis) }()
			t.Cleanup(func() { gs.Stop(); <-done })

			roots := x509.NewCertPool()
			roots.AppendCertsFromPEM(r.RootsPEM())
			tlsConf := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
			if tc.cert {
				tlsConf.Certificates = append(tlsConf.Certificates, *issueClient(t, dir, app, pki.ECDSAP256))
			}
			conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(tlsConf)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = conn.Close() })
			_, csr := newCSR(t, pki.ECDSAP256, app)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			resp, err := pb.NewIstioCertificateServiceClient(conn).CreateCertificate(ctx, &pb.IstioCertificateRequest{Csr: csr})
			if tc.code == codes.OK {
				if err != nil {
					t.Fatal(err)
				}
				checkChain(t, resp, app, r.RootsPEM())
				return
			}
			wantCode(t, err, tc.code, tc.contains)
		})
	}
}
