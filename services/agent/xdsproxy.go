package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

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
	// Keepalive: Envoy's stream through the agent must not hang on a silent link to the server.
	conn, err := grpc.NewClient(a.cfg.XDSAddress, append([]grpc.DialOption{grpc.WithTransportCredentials(creds),
		grpc.WithKeepaliveParams(grpcserver.ClientKeepalive)}, a.deps.DialOptions...)...)
	if err != nil {
		return fmt.Errorf("xDS address %q: %w", a.cfg.XDSAddress, err)
	}
	defer conn.Close()
	g := grpcserver.New(a.log, grpcserver.WithMeterProvider(a.deps.Metrics.MeterProvider()))
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
	client := discoveryv3.NewAggregatedDiscoveryServiceClient(p.conn)
	return forward(down.Context(), p.a.log, counted(p.a.metrics, down), func(ctx context.Context) (upstream[*discoveryv3.DiscoveryRequest, *discoveryv3.DiscoveryResponse], error) {
		return client.StreamAggregatedResources(ctx)
	})
}

func (p *xdsProxy) DeltaAggregatedResources(down discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	if err := p.upstreamCtx(down.Context()); err != nil {
		return err
	}
	client := discoveryv3.NewAggregatedDiscoveryServiceClient(p.conn)
	return forward(down.Context(), p.a.log, counted(p.a.metrics, down), func(ctx context.Context) (upstream[*discoveryv3.DeltaDiscoveryRequest, *discoveryv3.DeltaDiscoveryResponse], error) {
		return client.DeltaAggregatedResources(ctx)
	})
}

// downstream is the local proxy's side of a forwarded stream.
type downstream[Req, Resp any] interface {
	Recv() (Req, error)
	Send(Resp) error
}

// countedStream counts what the local proxy asks and is answered (pilot-agent's
// xds_proxy_requests and xds_proxy_responses); requests replayed after an overload are not
// counted again.
type countedStream[Req, Resp any] struct {
	downstream[Req, Resp]
	m *agentMetrics
}

func counted[Req, Resp any](m *agentMetrics, down downstream[Req, Resp]) downstream[Req, Resp] {
	return countedStream[Req, Resp]{down, m}
}

func (s countedStream[Req, Resp]) Recv() (Req, error) {
	req, err := s.downstream.Recv()
	if err == nil {
		s.m.xdsRequests.Add(context.Background(), 1)
	}
	return req, err
}

func (s countedStream[Req, Resp]) Send(resp Resp) error {
	s.m.xdsResponses.Add(context.Background(), 1)
	return s.downstream.Send(resp)
}

// upstream is the xDS server's side of a forwarded stream.
type upstream[Req, Resp any] interface {
	Send(Req) error
	Recv() (Resp, error)
	CloseSend() error
}

// forward copies requests up and responses down until either side ends; ctx is the downstream
// stream's, so the upstream ends with the handler. An upstream stream that the xDS server
// refuses as overloaded before its first response (Unavailable with a retry delay) is opened
// again after the delay, with backoff, and sent again what the proxy asked for: the proxy
// sees a late answer instead of a failure.
func forward[Req, Resp any](
	ctx context.Context,
	log *slog.Logger,
	down downstream[Req, Resp],
	open func(context.Context) (upstream[Req, Resp], error),
) error {
	reqs := make(chan Req)
	downErr := make(chan error, 1)
	go func() {
		for {
			req, err := down.Recv()
			if err != nil {
				downErr <- err
				return
			}
			select {
			case reqs <- req:
			case <-ctx.Done():
				return
			}
		}
	}()
	var unanswered []Req // sent up before the first response: replayed on a retry
	// session forwards over one upstream stream; retry says it was refused as overloaded.
	session := func() (retry bool, err error) {
		upCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		up, err := open(upCtx)
		if err != nil {
			return false, upstreamError(err)
		}
		for _, req := range unanswered {
			_ = up.Send(req) // a failure ends the stream: Recv says why
		}
		resps := make(chan Resp)
		upErr := make(chan error, 1)
		go func() {
			for {
				resp, err := up.Recv()
				if err != nil {
					upErr <- err
					return
				}
				select {
				case resps <- resp:
				case <-upCtx.Done():
					return
				}
			}
		}()
		answered := false
		for {
			select {
			case req := <-reqs:
				if !answered {
					unanswered = append(unanswered, req)
				}
				_ = up.Send(req)
			case resp := <-resps:
				answered, unanswered = true, nil
				if err := down.Send(resp); err != nil {
					return false, err
				}
			case err := <-upErr:
				if _, overloaded := grpcserver.RetryAfter(err); overloaded && !answered {
					return true, err
				}
				return false, upstreamError(err)
			case err := <-downErr:
				_ = up.CloseSend()
				if errors.Is(err, io.EOF) {
					err = nil
				}
				return false, err
			}
		}
	}
	b := grpcserver.Backoff{Initial: 100 * time.Millisecond, Max: 30 * time.Second}
	for {
		retry, err := session()
		if !retry {
			return err
		}
		d := b.Next(err)
		log.Info("xDS server overloaded: retrying the proxy's stream", "in", d, "err", status.Convert(err).Message())
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return status.FromContextError(ctx.Err()).Err()
		case <-t.C:
		}
	}
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
