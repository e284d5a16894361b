package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"sailplane.dev/shared/grpcserver"
	"sailplane.dev/shared/pki"
)

// xdsProxy forwards the local proxy's ADS streams (state of the world and delta), each to its
// own stream to the xDS server, as Istio's agent does on ./etc/istio/proxy/XDS: Envoy needs no
// credentials of its own, and over TLS the agent authenticates with the workload certificate.
type xdsProxy struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	a    *Agent
	conn *grpc.ClientConn
}

func (a *Agent) runXDSProxy(ctx context.Context) error {
	creds := insecure.NewCredentials()
	if a.cfg.XDSOverTLS {
		creds = credentials.NewTLS(a.xdsTLS())
	}
	conn, err := grpc.NewClient(a.cfg.XDSAddress, append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, a.deps.DialOptions...)...)
	if err != nil {
		return fmt.Errorf("xDS address %q: %w", a.cfg.XDSAddress, err)
	}
	defer conn.Close()
	g := grpcserver.New(a.log)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, &xdsProxy{a: a, conn: conn})
	if err := removeStaleSocket(a.cfg.XDSProxySocket); err != nil {
		return fmt.Errorf("xDS proxy socket: %w", err)
	}
	err = (&grpcserver.Server{Network: "unix", Addr: a.cfg.XDSProxySocket, GRPC: g, Logger: a.log}).Run(ctx)
	_ = os.Remove(a.cfg.XDSProxySocket)
	return err
}

// xdsTLS is mTLS to the xDS server: the current workload certificate at each handshake (so a
// reconnection presents the renewed one), the server verified for its name with the root file
// and the trust bundle the ca last sent.
func (a *Agent) xdsTLS() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c := a.Current()
			if c == nil {
				return nil, errors.New("no workload certificate yet")
			}
			t := c.TLSCertificate()
			return &t, nil
		},
		// Verified below against roots that may change while the agent runs.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			roots := x509.NewCertPool()
			if data, err := os.ReadFile(a.cfg.RootCertFile); err == nil {
				if certs, err := pki.ParseCerts(data); err == nil {
					for _, r := range certs {
						roots.AddCert(r)
					}
				}
			}
			if c := a.Current(); c != nil {
				for _, r := range c.Roots {
					roots.AddCert(r)
				}
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{DNSName: cs.ServerName, Roots: roots, Intermediates: inter})
			return err
		},
	}
}

// upstreamCtx waits, over TLS, for the certificate the server will ask for.
func (p *xdsProxy) upstreamCtx(ctx context.Context) error {
	if !p.a.cfg.XDSOverTLS {
		return nil
	}
	select {
	case <-p.a.Ready():
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

func (p *xdsProxy) StreamAggregatedResources(down discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	if err := p.upstreamCtx(down.Context()); err != nil {
		return err
	}
	up, err := discoveryv3.NewAggregatedDiscoveryServiceClient(p.conn).StreamAggregatedResources(down.Context())
	if err != nil {
		return upstreamError(err)
	}
	return forward(down, up)
}

func (p *xdsProxy) DeltaAggregatedResources(down discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	if err := p.upstreamCtx(down.Context()); err != nil {
		return err
	}
	up, err := discoveryv3.NewAggregatedDiscoveryServiceClient(p.conn).DeltaAggregatedResources(down.Context())
	if err != nil {
		return upstreamError(err)
	}
	return forward(down, up)
}

// forward copies requests up and responses down until either side ends; the upstream stream
// shares the downstream's context, so it ends with the handler.
func forward[Req, Resp any](
	down interface {
		Recv() (Req, error)
		Send(Resp) error
	},
	up interface {
		Send(Req) error
		Recv() (Resp, error)
		CloseSend() error
	},
) error {
	errc := make(chan error, 2)
	go func() {
		for {
			req, err := down.Recv()
			if err != nil {
				_ = up.CloseSend()
				if errors.Is(err, io.EOF) {
					err = nil
				}
				errc <- err
				return
			}
			if err := up.Send(req); err != nil {
				errc <- upstreamError(err)
				return
			}
		}
	}()
	go func() {
		for {
			resp, err := up.Recv()
			if err != nil {
				errc <- upstreamError(err)
				return
			}
			if err := down.Send(resp); err != nil {
				errc <- err
				return
			}
		}
	}()
	return <-errc
}

// upstreamError keeps the xDS server's status; a stream ending cleanly stays clean.
func upstreamError(err error) error {
	if errors.Is(err, io.EOF) {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Errorf(codes.Unavailable, "xDS server: %v", err)
}

// removeStaleSocket removes a socket left at path by an earlier run, creating its folder;
// anything else at path is an error rather than removed.
func removeStaleSocket(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return err
	case fi.Mode()&os.ModeSocket == 0:
		return fmt.Errorf("%s exists and is not a socket", path)
	}
	return os.Remove(path)
}
