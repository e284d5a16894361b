package ca

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	pb "istio.io/api/security/v1alpha1"

	"sailplane.dev/shared/grpcserver"
	"sailplane.dev/shared/pki"
)

// MaxCSRBytes bounds a request's CSR; a workload CSR is well under 2 KiB.
const MaxCSRBytes = 16 << 10

// maxRequestBytes bounds a whole request at the transport, before the handler sees it.
const maxRequestBytes = 256 << 10

// Stats counts CreateCertificate outcomes.
type Stats struct {
	Signed, Unauthenticated, PermissionDenied, InvalidArgument, Unavailable int64
}

type stats struct {
	signed, unauthenticated, permissionDenied, invalidArgument, unavailable atomic.Int64
}

// Stats is a snapshot of the outcome counters.
func (s *Service) Stats() Stats {
	return Stats{
		Signed: s.stats.signed.Load(), Unauthenticated: s.stats.unauthenticated.Load(),
		PermissionDenied: s.stats.permissionDenied.Load(), InvalidArgument: s.stats.invalidArgument.Load(),
		Unavailable: s.stats.unavailable.Load(),
	}
}

// certService implements Istio's IstioCertificateService.
type certService struct {
	pb.UnimplementedIstioCertificateServiceServer
	s *Service
}

// errNotLoaded answers requests that arrive before Run loaded the root.
var errNotLoaded = errors.New("ca: the root of trust is not loaded yet")

// Register registers Istio's IstioCertificateService on g, for a server that serves the ca
// beside other services (Config.Embedded). Its TLS config must take the serving certificate from
// GetCertificate and request (not require) client certificates, as ServerTLS does, and it must
// authenticate calls with grpcserver.WithAuth, whose interceptor asks the ca itself
// (AuthFuncOverride); without it every request is refused.
func (s *Service) Register(g grpc.ServiceRegistrar) {
	pb.RegisterIstioCertificateServiceServer(g, &certService{s: s})
}

// ServerTLS is the TLS config of a listener serving the ca: the serving certificate the ca
// issues itself, and client certificates requested for authentication.
func (s *Service) ServerTLS() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: s.GetCertificate,
		// Verified in the handler, so a foreign or expired certificate is a clean
		// Unauthenticated rather than a failed handshake.
		ClientAuth: tls.RequestClientCert,
		NextProtos: []string{"h2"},
	}
}

// GetCertificate returns the serving certificate (tls.Config.GetCertificate), renewed at half
// its lifetime; an error until Run loaded the root.
func (s *Service) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	s.mu.Lock()
	serving := s.serving
	s.mu.Unlock()
	if serving == nil {
		return nil, errNotLoaded
	}
	return serving.GetCertificate(hello)
}

func (s *Service) authority() *pki.Authority {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.auth
}

func (s *Service) serve(ctx context.Context) error {
	// The health service is open; the ca's own service authenticates its callers
	// (certService.AuthFuncOverride).
	g := grpcserver.New(s.log, grpc.Creds(credentials.NewTLS(s.ServerTLS())), grpc.MaxRecvMsgSize(maxRequestBytes),
		grpcserver.WithAuth(grpcserver.Anyone))
	s.Register(g)
	srv := &grpcserver.Server{Addr: s.cfg.Listen, GRPC: g, Logger: s.log, WaitReady: grpcserver.Closed(s.ready), Listening: func(a net.Addr) {
		s.mu.Lock()
		s.addr = a
		s.mu.Unlock()
		close(s.ready)
	}}
	return srv.Run(ctx)
}

// authenticated is a caller AuthFuncOverride verified, with the authority it was verified
// against, which signs its certificate: a root rotating between the two must not sign for a
// caller the new root never verified.
type authenticated struct {
	caller
	auth  *pki.Authority
	start time.Time // when the call reached the ca, for its latency
}

type authenticatedKey struct{}

// AuthFuncOverride authenticates a call to the ca in go-grpc-middleware's auth interceptor
// (grpcserver.WithAuth), which asks the service itself wherever it is registered: on the ca's
// own listener, or on xds-server's in hyper. Whether the CSR may be signed for the identity is
// decided by the handler, which alone sees it.
func (cs *certService) AuthFuncOverride(ctx context.Context, _ string) (context.Context, error) {
	start := time.Now()
	s := cs.s
	auth := s.authority()
	if auth == nil {
		err := status.Error(codes.Unavailable, errNotLoaded.Error())
		s.metrics.answered(codes.Unavailable, time.Since(start))
		return nil, err
	}
	c, err := s.authenticate(ctx, auth)
	if err != nil {
		code := codes.Unauthenticated
		if errors.Is(err, errUnavailable) {
			code = codes.Unavailable
		}
		s.metrics.answered(code, time.Since(start))
		return nil, s.refuse(c, code, err)
	}
	c.id.TrustDomain = s.cfg.TrustDomain // the ca names identities in its own trust domain
	grpcserver.SetPeerIdentity(ctx, c.id.String())
	return context.WithValue(ctx, authenticatedKey{}, &authenticated{caller: c, auth: auth, start: start}), nil
}

// errNotAuthenticated refuses a request no AuthFuncOverride saw: the ca is registered on a
// server without grpcserver.WithAuth.
var errNotAuthenticated = status.Error(codes.Unauthenticated, "ca: the caller was not authenticated")

// CreateCertificate signs the CSR for the caller's identity (AuthFuncOverride), whatever
// identity the CSR names.
func (cs *certService) CreateCertificate(ctx context.Context, req *pb.IstioCertificateRequest) (*pb.IstioCertificateResponse, error) {
	a, ok := ctx.Value(authenticatedKey{}).(*authenticated)
	if !ok {
		cs.s.log.Error("CSR refused: the ca is served without grpcserver.WithAuth, which authenticates its callers")
		cs.s.metrics.answered(codes.Unauthenticated, 0)
		return nil, errNotAuthenticated
	}
	resp, err := cs.createCertificate(a, req)
	cs.s.metrics.answered(status.Code(err), time.Since(a.start))
	return resp, err
}

func (cs *certService) createCertificate(a *authenticated, req *pb.IstioCertificateRequest) (*pb.IstioCertificateResponse, error) {
	s, c, auth := cs.s, a.caller, a.auth
	if n := len(req.GetCsr()); n > MaxCSRBytes {
		return nil, s.refuse(c, codes.InvalidArgument, fmt.Errorf("CSR of %d bytes exceeds the limit of %d", n, MaxCSRBytes))
	}
	// istiod ignores the CSR's names; refusing a CSR that names another workload makes a
	// misconfigured or hostile agent visible instead of quietly getting a certificate it did
	// not ask for.
	csr, err := pki.ParseCSRFor([]byte(req.GetCsr()), c.id)
	if err != nil {
		code := codes.InvalidArgument
		if errors.Is(err, pki.ErrForeignIdentity) {
			code = codes.PermissionDenied
		}
		return nil, s.refuse(c, code, err)
	}
	ttl := time.Duration(req.GetValidityDuration()) * time.Second
	switch {
	case ttl <= 0:
		ttl = s.cfg.DefaultCertTTL
	case ttl > s.cfg.MaxCertTTL:
		ttl = s.cfg.MaxCertTTL
	}
	opts := pki.LeafOptions{URIs: []*url.URL{c.id.URL()}, TTL: ttl}
	opts.DNSNames, opts.IPs = s.servingNamesOf(c.id)
	leaf, err := auth.Issue(csr.PublicKey, opts)
	if err != nil {
		s.log.Error("signing failed", append(c.logAttrs(), "error", err)...)
		return nil, status.Error(codes.Internal, "signing failed")
	}
	s.stats.signed.Add(1)
	s.log.Debug("signed", append(c.logAttrs(), "ttl", ttl, "serial", leaf.SerialNumber.Text(16))...)
	// Leaf first, then each intermediate, the roots last in one entry (Istio's agent takes the
	// last entry as its trust bundle).
	chain := []string{string(pki.EncodeCerts(leaf))}
	for _, c := range auth.Chain() {
		chain = append(chain, string(pki.EncodeCerts(c)))
	}
	chain = append(chain, string(pki.EncodeCerts(auth.Roots...)))
	return &pb.IstioCertificateResponse{CertChain: chain}, nil
}

// refuse logs a refused request once, with who asked, counts it, and returns its gRPC status.
func (s *Service) refuse(c caller, code codes.Code, err error) error {
	switch code {
	case codes.Unauthenticated:
		s.stats.unauthenticated.Add(1)
	case codes.PermissionDenied:
		s.stats.permissionDenied.Add(1)
	case codes.InvalidArgument:
		s.stats.invalidArgument.Add(1)
	case codes.Unavailable:
		s.stats.unavailable.Add(1)
	}
	s.log.Warn("CSR refused", append(c.logAttrs(), "code", code.String(), "reason", err.Error())...)
	return status.Error(code, err.Error())
}

const servingTTL = 24 * time.Hour

// newServingCert is the listener's certificate for names, issued by the ca itself and renewed
// in place once half its lifetime has passed.
func newServingCert(auth *pki.Authority, names []string, alg pki.KeyAlgorithm) (*pki.ServingCert, error) {
	dns, ips := servingNames(names)
	return pki.NewServingCert(auth, alg, pki.LeafOptions{DNSNames: dns, IPs: ips, TTL: servingTTL})
}

// servingNames splits a serving certificate's names into DNS names and IP addresses (a listen
// host such as 198.18.0.1 must be an IP SAN to verify), with 127.0.0.1 and ::1 always in.
func servingNames(names []string) ([]string, []net.IP) {
	dns := make([]string, 0, len(names))
	ips := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	for _, n := range names {
		ip := net.ParseIP(n)
		switch {
		case ip == nil:
			dns = append(dns, n)
		case !slices.ContainsFunc(ips, ip.Equal):
			ips = append(ips, ip)
		}
	}
	return dns, ips
}

// ServingCertificate is a tls.Config.GetCertificate serving names (and 127.0.0.1, ::1) with a
// certificate this ca signs in-process, renewed at half its lifetime and when another root
// signs: for a listener of what hyper links beside the ca (the webhook). An error until Run
// loaded the root.
func (s *Service) ServingCertificate(names []string) func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	var (
		mu     sync.Mutex
		sc     *pki.ServingCert
		signer *pki.Authority // sc's
	)
	return func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
		auth := s.authority()
		if auth == nil {
			return nil, errNotLoaded
		}
		mu.Lock()
		defer mu.Unlock()
		if sc == nil || signer != auth {
			next, err := newServingCert(auth, names, s.cfg.KeyAlgorithm)
			if err != nil {
				return nil, err
			}
			sc, signer = next, auth
		}
		return sc.GetCertificate(hello)
	}
}
