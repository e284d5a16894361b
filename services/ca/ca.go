// Package ca is Sailplane's certificate authority: it keeps the mesh's root of trust (a
// self-signed root generated once and persisted, or a plugged-in CA in Istio's cacerts layout)
// and signs workload certificates over Istio's CreateCertificate API on a TLS listener, for
// callers authenticated as istiod authenticates them (a Kubernetes service-account token checked
// with TokenReview, or a client certificate this CA issued).
package ca

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/kube"
	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/spiffe"
)

// Config configures the ca.
type Config struct {
	// TrustDomain is the trust domain of every identity the ca signs; "cluster.local" when empty.
	TrustDomain string
	// Listen is the TLS address serving CreateCertificate; "127.0.0.1:15012" when empty. Its host
	// is also a name (or IP) of the serving certificate.
	Listen string
	// Embedded leaves serving to another gRPC server on Listen (hyper's xDS port, as istiod does):
	// Run loads the root and keeps it, the caller registers the API with Register and takes the
	// serving certificate from GetCertificate.
	Embedded bool

	// Kube, when set, is the API server that reviews service-account tokens and, unless CertDir
	// is set, keeps the root in the istio-ca-secret Secret in Namespace (a cacerts Secret there
	// plugs in a CA instead).
	Kube *rest.Config
	// Namespace is the ca's namespace (Kubernetes); "istio-system" when empty.
	Namespace string
	// CertDir, when set, keeps the self-signed root in this folder (istio-ca-secret's file
	// names) instead of a Secret.
	CertDir string
	// PluggedCertDir, when set, is a plugged-in CA in Istio's cacerts layout; it must be complete
	// and valid, and takes precedence over everything else.
	PluggedCertDir string

	// ServingDNSNames are the DNS names in the listener's certificate (127.0.0.1 and ::1 are
	// always in it); istiod.<Namespace>.svc and localhost when empty.
	ServingDNSNames []string
	// ServingCertDir, when set, is a folder where the ca keeps a serving certificate for
	// ServingDNSNames (tls.crt, tls.key, ca.crt), renewed at half its lifetime: xds-server in
	// microservices mode serves TLS xDS with it, as it has no identity to ask with.
	ServingCertDir string
	// XDSServerAccount is the service account ("name" in Namespace, or "namespace/name") whose
	// certificates also carry ServingDNSNames, so xds-server serves TLS xDS under istiod's names
	// with a key it generated itself; "xds-server" when empty, "-" for none.
	XDSServerAccount string
	// WebhookAccount is the service account ("name" in Namespace, or "namespace/name") whose
	// certificates also carry WebhookDNSNames, so the webhook serves the Kubernetes API server
	// under its Service's names with a key it generated itself; "webhook" when empty, "-" for none.
	WebhookAccount string
	// WebhookDNSNames are the webhook's Service names; sailplane-webhook.<ns>.svc and
	// sailplane-webhook.<ns>.svc.cluster.local, <ns> being WebhookAccount's namespace, when empty.
	WebhookDNSNames []string
	// ServingCertSecret, when set, is a kubernetes.io/tls Secret ("name" in Namespace, or
	// "namespace/name") where the ca keeps the same certificate, for xds-server to mount
	// (Kubernetes only).
	ServingCertSecret string
	// ServiceCertDir, when set, is a folder where the ca keeps a bootstrap certificate for each
	// control plane service (ServiceAccounts) in <dir>/<service account>/, for services that
	// cannot authenticate with a token (no Kubernetes): they start with it, then renew their own.
	ServiceCertDir string
	// KeyAlgorithm is the kind of key a generated root and the serving certificate get.
	KeyAlgorithm pki.KeyAlgorithm
	// RootTTL is the lifetime of a generated root; 10 years when zero.
	RootTTL time.Duration
	// DefaultCertTTL is the lifetime of a certificate whose request asks for none; 24h when zero.
	// MaxCertTTL caps what a request may ask for; 90 days (istiod's default) when zero.
	DefaultCertTTL, MaxCertTTL time.Duration
	// RotateRootBefore, when set, replaces a self-signed root (Secret or CertDir) created before this time,
	// once it has come, without downtime: the new root joins the bundle, signing switches to it
	// RootRotationGrace later, and the old root leaves the bundle MaxCertTTL after that (when
	// every leaf it signed has expired). Each step is kept beside the root, so a restart resumes.
	RotateRootBefore time.Time
	// RootRotationGrace is how long workloads have to learn the new root before it signs (they
	// get it with their next certificate); MaxCertTTL when zero.
	RootRotationGrace time.Duration

	// TokenAudiences are the audiences a token must be valid for; istiod's ["istio-ca"] when empty.
	TokenAudiences []string
	// ClusterID is this cluster's name: a caller claiming another one (the "clusterid" metadata)
	// is refused; "Kubernetes" (istiod's default) when empty.
	ClusterID string
	// TokenCacheTTL is how long a token's review is reused (1m when zero), TokenCacheSize how many
	// reviews are kept (10000 when zero).
	TokenCacheTTL  time.Duration
	TokenCacheSize int
}

// Deps are the ca's collaborators.
type Deps struct {
	Logger *slog.Logger
	// Mesh, when set, carries the MeshConfig (schema.MeshConfig): its discoverySelectors choose
	// the namespaces that get the istio-ca-root-cert ConfigMap (Kubernetes); without it, all do.
	Mesh bus.Source
	// Publisher, when set, receives the trust bundle (schema.TrustBundle) once the root is
	// loaded, before Ready.
	Publisher bus.Publisher
	// MeterProvider receives the CSR metrics (istiod's citadel_server_*); the global provider
	// when nil.
	MeterProvider metric.MeterProvider
}

// ErrStoredCA marks a root of trust that exists but cannot be used (corrupt, partly missing,
// not matching its key): the ca refuses to start rather than mint a second root.
var ErrStoredCA = errors.New("stored CA unusable")

// ErrKubernetes marks the API server failing to read or store the CA Secret (unreachable,
// RBAC): Run retries it until the Secret can be read.
var ErrKubernetes = errors.New("kubernetes")

// Service is the ca.
type Service struct {
	cfg  Config
	log  *slog.Logger
	pub  bus.Publisher        // nil: the bundle is not published
	mesh bus.Source           // nil: every namespace gets the root ConfigMap
	kube kubernetes.Interface // nil without Kubernetes: no token authentication

	ready   chan struct{}
	mu      sync.Mutex
	auth    *pki.Authority
	serving *pki.ServingCert
	addr    net.Addr
	rotated chan struct{} // closed (and replaced) when a rotation step changes auth

	reviewerOnce sync.Once
	reviewer     *kube.TokenReviewer

	stats   stats
	metrics csrMetrics
}

// New checks cfg; nothing is read or generated before Run.
func New(cfg Config, deps Deps) (*Service, error) {
	if deps.Logger == nil {
		deps.Logger = slog.Default()
	}
	cfg = withDefaults(cfg)
	if cfg.Kube == nil && cfg.CertDir == "" && cfg.PluggedCertDir == "" {
		return nil, errors.New("ca: the root needs a home: set Config.Kube (Secret), CertDir or PluggedCertDir")
	}
	if cfg.ServingCertSecret != "" && cfg.Kube == nil {
		return nil, errors.New("ca: a serving-certificate Secret needs Kubernetes")
	}
	if cfg.DefaultCertTTL > cfg.MaxCertTTL {
		return nil, fmt.Errorf("ca: default certificate TTL %s exceeds the maximum %s", cfg.DefaultCertTTL, cfg.MaxCertTTL)
	}
	if !cfg.RotateRootBefore.IsZero() && cfg.PluggedCertDir != "" {
		return nil, errors.New("ca: a plugged-in CA (--cacerts-dir) is not rotated by the ca: --rotate-root-before rotates the self-signed root only")
	}
	if a := cfg.KeyAlgorithm; a != "" && a != pki.ECDSAP256 && a != pki.RSA2048 {
		return nil, fmt.Errorf("ca: key algorithm %q: want %s or %s", cfg.KeyAlgorithm, pki.ECDSAP256, pki.RSA2048)
	}
	s := &Service{
		cfg: cfg, log: deps.Logger, pub: deps.Publisher, mesh: deps.Mesh, ready: make(chan struct{}), rotated: make(chan struct{}),
		metrics: newCSRMetrics(deps.MeterProvider),
	}
	if cfg.Kube != nil {
		c, err := kubernetes.NewForConfig(kube.WithRateLimits(cfg.Kube))
		if err != nil {
			return nil, fmt.Errorf("ca: kubernetes client: %w", err)
		}
		s.kube = c
	}
	return s, nil
}

func withDefaults(cfg Config) Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if cfg.TrustDomain == "" {
		cfg.TrustDomain = "cluster.local"
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:15012"
	}
	if cfg.Namespace == "" {
		cfg.Namespace = "istio-system"
	}
	if cfg.XDSServerAccount == "" {
		cfg.XDSServerAccount = "xds-server"
	}
	if len(cfg.ServingDNSNames) == 0 {
		cfg.ServingDNSNames = []string{"istiod." + cfg.Namespace + ".svc", "localhost"}
	}
	if cfg.WebhookAccount == "" {
		cfg.WebhookAccount = "webhook"
	}
	if len(cfg.WebhookDNSNames) == 0 {
		ns, _ := account(cfg.WebhookAccount, cfg.Namespace)
		cfg.WebhookDNSNames = WebhookDNSNames(ns)
	}
	// The address clients dial must be in the certificate they verify.
	if host, _, err := net.SplitHostPort(cfg.Listen); err == nil && host != "" && !slices.Contains(cfg.ServingDNSNames, host) {
		cfg.ServingDNSNames = append(slices.Clone(cfg.ServingDNSNames), host)
	}
	def(&cfg.RootTTL, 10*365*24*time.Hour)
	def(&cfg.DefaultCertTTL, 24*time.Hour)
	def(&cfg.MaxCertTTL, 90*24*time.Hour)
	def(&cfg.RootRotationGrace, cfg.MaxCertTTL)
	def(&cfg.TokenCacheTTL, time.Minute)
	if len(cfg.TokenAudiences) == 0 {
		cfg.TokenAudiences = []string{"istio-ca"}
	}
	if cfg.ClusterID == "" {
		cfg.ClusterID = "Kubernetes"
	}
	if cfg.TokenCacheSize <= 0 {
		cfg.TokenCacheSize = 10000
	}
	return cfg
}

// Run loads (or, the first time, creates) the root of trust, then serves CreateCertificate until
// ctx ends. A stored CA that cannot be used is an error wrapping ErrStoredCA, and nothing is
// served; an API server that cannot be asked is retried, with nothing served meanwhile.
func (s *Service) Run(ctx context.Context) error {
	st, err := s.loadAuthority(ctx)
	for delay := 500 * time.Millisecond; errors.Is(err, ErrKubernetes); delay = min(2*delay, 30*time.Second) {
		s.log.Warn("cannot read the root of trust yet; retrying", "error", err, "retry-in", delay)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
		st, err = s.loadAuthority(ctx)
	}
	if err != nil {
		return fmt.Errorf("ca: %w", err)
	}
	auth := st.auth
	if !s.cfg.RotateRootBefore.IsZero() && !st.rotatable {
		s.log.Warn("a plugged-in CA is not rotated: --rotate-root-before is ignored")
	}
	if err := s.install(auth); err != nil {
		return err
	}
	s.log.Info("root of trust", "subject", auth.Cert.Subject.String(), "self-signed", auth.SelfSigned(),
		"root-expires", auth.Roots[0].NotAfter.UTC().Format(time.RFC3339), "rotation", st.rotation.Phase)
	defer s.metrics.observeExpiry(s.authority)()
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 5)
	if s.kube != nil {
		wg.Go(func() { errc <- s.runRootCertController(ctx, s.mesh) })
	}
	if _, rotating := s.due(st); rotating {
		wg.Go(func() { errc <- s.runRotation(ctx, st) })
	}
	if dir := s.cfg.ServingCertDir; dir != "" {
		wg.Go(func() {
			errc <- s.keepServingCert(ctx, "folder "+dir, func(f map[string][]byte) error { return writeServingFolder(dir, f) })
		})
	}
	if dir := s.cfg.ServiceCertDir; dir != "" {
		wg.Go(func() { errc <- s.keepServiceCerts(ctx, dir) })
	}
	if ns, name := s.servingSecret(); name != "" {
		wg.Go(func() {
			errc <- s.keepServingCert(ctx, "Secret "+ns+"/"+name, func(f map[string][]byte) error {
				return s.writeServingSecret(ctx, ns, name, f)
			})
		})
	}
	if s.cfg.Embedded {
		close(s.ready)
	} else {
		wg.Go(func() { errc <- s.serve(ctx) })
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			if err != nil {
				return err
			}
		}
	}
}

// install makes auth sign and its roots the bundle: a new serving certificate, the bundle
// published, and the holders of the old ones woken.
func (s *Service) install(auth *pki.Authority) error {
	serving, err := newServingCert(auth, s.cfg.ServingDNSNames, s.cfg.KeyAlgorithm)
	if err != nil {
		return fmt.Errorf("ca: serving certificate: %w", err)
	}
	s.mu.Lock()
	first := s.auth == nil
	s.auth, s.serving = auth, serving
	if !first {
		close(s.rotated)
		s.rotated = make(chan struct{})
	}
	s.mu.Unlock()
	if s.pub != nil {
		return s.publishBundle(s.pub, auth)
	}
	return nil
}

// WebhookService is the Service in front of the webhook (deploy/): the names of its serving
// certificate.
const WebhookService = "sailplane-webhook"

// WebhookDNSNames are the names the Kubernetes API server calls the webhook in namespace by.
func WebhookDNSNames(namespace string) []string {
	return []string{WebhookService + "." + namespace + ".svc", WebhookService + "." + namespace + ".svc.cluster.local"}
}

// servingNamesOf are the names a certificate for id carries besides its SPIFFE ID: istiod's for
// XDSServerAccount, the webhook Service's for WebhookAccount (each serves TLS under them with a
// certificate it asked for itself), none for anyone else.
func (s *Service) servingNamesOf(id spiffe.ID) ([]string, []net.IP) {
	is := func(acct string) bool {
		ns, name := account(acct, s.cfg.Namespace)
		return id.Namespace == ns && id.ServiceAccount == name
	}
	switch {
	case is(s.cfg.XDSServerAccount):
		return servingNames(s.cfg.ServingDNSNames)
	case is(s.cfg.WebhookAccount):
		return servingNames(s.cfg.WebhookDNSNames)
	}
	return nil, nil
}

// account splits a service account flag, "name" in namespace or "namespace/name".
func account(acct, namespace string) (ns, name string) {
	if ns, name, found := strings.Cut(acct, "/"); found {
		return ns, name
	}
	return namespace, acct
}

// servingSecret is ServingCertSecret's namespace and name.
func (s *Service) servingSecret() (namespace, name string) {
	if ns, name, found := strings.Cut(s.cfg.ServingCertSecret, "/"); found {
		return ns, name
	}
	return s.cfg.Namespace, s.cfg.ServingCertSecret
}

// Ready is closed once the ca serves on its listener (Embedded: once the root is loaded).
func (s *Service) Ready() <-chan struct{} { return s.ready }

// Addr is the listener's address, once Ready; nil when Embedded.
func (s *Service) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// RootsPEM is the trust bundle (PEM roots) once Ready: what clients verify the listener and the
// certificates it signs with.
func (s *Service) RootsPEM() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.auth == nil {
		return nil
	}
	return pki.EncodeCerts(s.auth.Roots...)
}
