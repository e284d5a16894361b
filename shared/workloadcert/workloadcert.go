// Package workloadcert gets a workload's certificate from Sailplane's ca (or istiod) over
// Istio's CreateCertificate API and keeps it renewed, as istio-agent does: the private key is
// generated locally, fresh at each renewal, and never sent; the first request authenticates with
// a service-account token or a provisioned certificate, later ones with the certificate itself;
// renewal comes at 80 % of the lifetime less jitter, and while the ca cannot sign the current
// certificate stays in use and the request is retried with a capped, jittered backoff. The agent
// uses it for workloads, and every Sailplane service for its own identity on the bus.
package workloadcert

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc"

	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/spiffe"
)

// Credential is a workload certificate with its key and the trust bundle it came with.
type Credential struct {
	ID    spiffe.ID
	Key   crypto.Signer
	Chain []*x509.Certificate // leaf first, then intermediates
	Roots []*x509.Certificate
	// The PEM forms, as written to files and served over SDS.
	KeyPEM, ChainPEM, RootsPEM []byte
	// Received is when the ca answered; the renewal is planned from it.
	Received time.Time
}

// Leaf is the workload certificate.
func (c *Credential) Leaf() *x509.Certificate { return c.Chain[0] }

// TLSCertificate is the credential as crypto/tls presents it.
func (c *Credential) TLSCertificate() tls.Certificate {
	t := tls.Certificate{PrivateKey: c.Key, Leaf: c.Chain[0]}
	for _, x := range c.Chain {
		t.Certificate = append(t.Certificate, x.Raw)
	}
	return t
}

// Source holds a workload's current credential: a Client, or the ca signing for itself.
type Source interface {
	// Current is the credential in use, nil before the first.
	Current() *Credential
}

// Config says where and how a Client asks for its certificate.
type Config struct {
	// CAAddress is the ca's TLS address.
	CAAddress string
	// RootCertFile is the root that verifies the ca's serving certificate, re-read at every
	// request (Kubernetes mounts the istio-ca-root-cert ConfigMap there). Required.
	RootCertFile string
	// TokenFile is the service-account token (audience istio-ca), re-read at every request since
	// the kubelet rotates it. Optional once a certificate is held.
	TokenFile string
	// ProvisionedCertDir, when set, holds cert-chain.pem and key.pem authenticating the first
	// request without a token (Istio's PROV_CERT; the ca's --service-cert-dir without Kubernetes).
	ProvisionedCertDir string
	// ClusterID is sent to the ca as the caller's cluster; "Kubernetes" when empty.
	ClusterID string
	// TrustDomain names the identity in the CSR; "cluster.local" when empty. The ca signs the
	// caller's identity in its own trust domain regardless.
	TrustDomain string
	// KeyAlgorithm is the key's kind: ECDSA P-256 (the default) or RSA 2048.
	KeyAlgorithm pki.KeyAlgorithm
	// CertTTL is the lifetime asked for; 24h when zero (the ca may shorten it).
	CertTTL time.Duration
	// RetryInitial and RetryMax bound the jittered backoff while the ca cannot sign; 1s and 30s
	// when zero.
	RetryInitial, RetryMax time.Duration
}

// Provisioned credential file names (Istio's workload-spiffe-credentials layout).
const (
	CertChainFile = "cert-chain.pem"
	KeyFile       = "key.pem"
	RootCertFile  = "root-cert.pem"
)

// ErrCA marks the ca refusing a request (as opposed to being unreachable).
var ErrCA = errors.New("the ca refused the certificate request")

// errUnreachable marks the ca not answering: no other credential is tried.
var errUnreachable = errors.New("the ca is unreachable")

// Client gets and renews one workload's certificate.
type Client struct {
	cfg      Config
	log      *slog.Logger
	dialOpts []grpc.DialOption

	// observe, when set, is told of each request Rotate makes (metrics).
	observe func(took time.Duration, retry bool, err error)

	ready   chan struct{}
	once    sync.Once
	mu      sync.Mutex
	current *Credential
}

var _ Source = (*Client)(nil)

// New checks cfg and fills its defaults; nothing is read before Run. dialOpts are added to the
// connection to the ca (tests observe the requests with them).
func New(cfg Config, log *slog.Logger, dialOpts ...grpc.DialOption) (*Client, error) {
	if log == nil {
		log = slog.Default()
	}
	if cfg.ClusterID == "" {
		cfg.ClusterID = "Kubernetes"
	}
	if cfg.TrustDomain == "" {
		cfg.TrustDomain = "cluster.local"
	}
	if cfg.CertTTL <= 0 {
		cfg.CertTTL = 24 * time.Hour
	}
	if cfg.RetryInitial <= 0 {
		cfg.RetryInitial = time.Second
	}
	if cfg.RetryMax <= 0 {
		cfg.RetryMax = 30 * time.Second
	}
	switch {
	case cfg.CAAddress == "":
		return nil, errors.New("the ca's address is required")
	case cfg.RootCertFile == "":
		return nil, errors.New("the root certificate file that verifies the ca is required")
	case cfg.TokenFile == "" && cfg.ProvisionedCertDir == "":
		return nil, errors.New("a token file or a provisioned certificate folder is needed to authenticate to the ca")
	}
	if a := cfg.KeyAlgorithm; a != "" && a != pki.ECDSAP256 && a != pki.RSA2048 {
		return nil, fmt.Errorf("key algorithm %q: want %s or %s", a, pki.ECDSAP256, pki.RSA2048)
	}
	return &Client{cfg: cfg, log: log, dialOpts: dialOpts, ready: make(chan struct{})}, nil
}

// Observe has Rotate call f after each certificate request with how long it took, whether it
// retried a failed one, and its error; call it before Rotate.
func (c *Client) Observe(f func(took time.Duration, retry bool, err error)) { c.observe = f }

// Current is the certificate held, nil before the first.
func (c *Client) Current() *Credential {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.current
}

// Ready is closed once a certificate is held (and was published).
func (c *Client) Ready() <-chan struct{} { return c.ready }

// Run gets a certificate and keeps it renewed until ctx ends (a service's component).
func (c *Client) Run(ctx context.Context) error { return c.Rotate(ctx, nil, nil) }

// Rotate gets a certificate, hands it to publish (when set) and holds it, then renews it at
// renewTime(credential, jitter in [0,1)) (RenewAt when nil), until ctx ends. While the ca cannot
// sign or publish fails, the current certificate stays in use and the request is retried with a
// capped, jittered backoff; the outage is logged once, and its end once.
func (c *Client) Rotate(ctx context.Context, publish func(context.Context, *Credential) error, renewTime func(*Credential, float64) time.Time) error {
	if renewTime == nil {
		renewTime = func(cr *Credential, jitter float64) time.Time { return RenewAt(cr.Leaf(), cr.Received, jitter) }
	}
	var next time.Time // zero: now
	backoff := c.cfg.RetryInitial
	var outage error
	for {
		if wait := time.Until(next); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
		}
		start := time.Now()
		cred, err := c.Issue(ctx)
		if c.observe != nil && ctx.Err() == nil {
			c.observe(time.Since(start), outage != nil, err)
		}
		if err == nil && publish != nil {
			err = publish(ctx, cred)
		}
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			if outage == nil {
				c.log.Warn("cannot get a certificate; keeping the current one and retrying",
					"ca", c.cfg.CAAddress, "error", err, "holding", c.Current() != nil)
			} else {
				c.log.Debug("still cannot get a certificate", "error", err)
			}
			outage = err
			// Equal jitter: between half and all of the backoff.
			next = time.Now().Add(backoff/2 + rand.N(backoff/2+1))
			backoff = min(2*backoff, c.cfg.RetryMax)
			continue
		}
		c.mu.Lock()
		c.current = cred
		c.mu.Unlock()
		c.once.Do(func() { close(c.ready) })
		if outage != nil {
			c.log.Info("certificate obtained again", "ca", c.cfg.CAAddress)
			outage = nil
		}
		backoff = c.cfg.RetryInitial
		next = renewTime(cred, rand.Float64())
		c.log.Info("certificate", "identity", cred.ID.String(), "expires", cred.Leaf().NotAfter.UTC().Format(time.RFC3339),
			"renew-at", next.UTC().Format(time.RFC3339), "serial", cred.Leaf().SerialNumber.Text(16))
	}
}

// RenewAt is when a certificate received at got is renewed: at 80 % of the lifetime left
// then, less up to 5 % of it of jitter, so workloads started together do not renew together.
// (NotBefore is backdated for clock skew, so the lifetime counts from receipt.)
func RenewAt(leaf *x509.Certificate, got time.Time, jitter float64) time.Time {
	life := leaf.NotAfter.Sub(got)
	return got.Add(time.Duration(float64(life) * (0.8 - 0.05*jitter)))
}
