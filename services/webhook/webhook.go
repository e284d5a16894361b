// Package webhook serves the Kubernetes API server's admission webhooks for Sailplane over HTTPS:
// validation of the Istio config Sailplane reads (/validate), with the validator and messages
// config-ingest uses, and sidecar injection (/inject). It keeps the caBundle of its revision's
// webhook configurations equal to the roots of its serving certificate and, once the API server
// has reached it, makes the validator fail closed (istiod's behaviour).
package webhook

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"sailplane.dev/services/webhook/internal/inject"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/component"
	"sailplane.dev/shared/kube"
	"sailplane.dev/shared/mesh"
)

// Defaults of Config.
const (
	DefaultListen   = "127.0.0.1:15017"
	DefaultRevision = "default"
	// ServiceName is the Service in front of the webhook (deploy/): its certificate's names.
	ServiceName = "sailplane-webhook"
)

// The webhook configurations of a revision (deploy/base/webhooks.yaml), "-<revision>" appended
// for a revision other than the default.
const (
	InjectorConfigName  = "sailplane-sidecar-injector"
	ValidatorConfigName = "sailplane-validator"
)

// RevisionLabel names the revision a configuration (or an Istio resource) belongs to, as in Istio.
const RevisionLabel = "istio.io/rev"

// Config configures the webhook.
type Config struct {
	// Listen is the HTTPS address; DefaultListen when empty.
	Listen string
	// Revision is the control plane revision: the webhook owns the configurations of this
	// revision only; DefaultRevision when empty.
	Revision string
	// Namespace is the control plane's namespace, where the webhook's Service is and where the
	// validator's readiness check is made; "istio-system" when empty.
	Namespace string
	// PatchCABundle keeps the caBundle of Revision's configurations current and turns the
	// validator to fail closed once it has been reached (needs Kube). Off for users who set them
	// themselves (GitOps).
	PatchCABundle bool
	// Kube is the API server; nil: none (nothing is patched, and the injection templates come
	// from InjectionDir).
	Kube *rest.Config
	// InjectionDir holds the injection templates without Kubernetes (files config and values, the
	// istio-sidecar-injector ConfigMap's keys); DefaultInjectionDir when empty. With Kubernetes
	// they come from that ConfigMap in Namespace (istio-sidecar-injector-<rev> for a revision).
	InjectionDir string
}

// DefaultInjectionDir is where the injection templates are without Kubernetes, relative to the
// working folder: beside etc/sailplane/mesh.yaml.
const DefaultInjectionDir = "etc/sailplane/injection"

// Deps are the webhook's collaborators.
type Deps struct {
	Logger *slog.Logger
	// Certificate is the serving certificate; nil: self-managed (SelfManaged, a root in memory).
	Certificate *Certificate
	// Mesh, when set, carries the mesh config (schema.MeshConfig, from config-ingest), whose
	// defaultConfig is the base of every injected pod's ProxyConfig; without it, Istio's defaults.
	Mesh bus.Source
	// MeterProvider receives the admission metrics (istiod's sidecar_injection_* and
	// galley_validation_*); the global provider when nil.
	MeterProvider metric.MeterProvider
}

// injector answers pod admission requests with the sidecar patch, once its templates are loaded.
type injector interface {
	Admit(*admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse
	Run(context.Context) error
	Ready() <-chan struct{}
}

// Errors returned by New.
var ErrInvalidConfig = errors.New("webhook: invalid config")

// Server is the webhook. Run it once.
type Server struct {
	cfg      Config
	log      *slog.Logger
	cert     *Certificate
	kube     kubernetes.Interface // nil without Kubernetes
	dyn      dynamic.Interface
	injector injector // internal/inject's; an interface so that tests can put another in
	mesh     *meshHolder

	ready   chan struct{}
	addr    atomic.Pointer[net.Addr]
	metrics webhookMetrics
}

// New checks cfg; nothing is served before Run.
func New(cfg Config, deps Deps) (*Server, error) {
	cfg.Listen = cmp.Or(cfg.Listen, DefaultListen)
	cfg.Revision = cmp.Or(cfg.Revision, DefaultRevision)
	cfg.Namespace = cmp.Or(cfg.Namespace, "istio-system")
	if _, _, err := net.SplitHostPort(cfg.Listen); err != nil {
		return nil, fmt.Errorf("%w: listen address %q: %w", ErrInvalidConfig, cfg.Listen, err)
	}
	log := deps.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, log: log, cert: deps.Certificate, ready: make(chan struct{}), metrics: newWebhookMetrics(deps.MeterProvider)}
	if s.cert == nil {
		host, _, _ := net.SplitHostPort(cfg.Listen)
		cert, err := SelfManaged(append(DNSNames(cfg.Namespace), host))
		if err != nil {
			return nil, fmt.Errorf("webhook: self-managed certificate: %w", err)
		}
		s.cert = cert
		log.Info("serving with a self-managed certificate (its root lives in memory: run one replica, or give the webhook a certificate from the ca)")
	}
	if s.cert.Get == nil || s.cert.Roots == nil {
		return nil, fmt.Errorf("%w: Deps.Certificate needs Get and Roots", ErrInvalidConfig)
	}
	if s.cert.Ready == nil {
		cert, ready := *s.cert, make(chan struct{})
		close(ready)
		cert.Ready = ready
		s.cert = &cert
	}
	if cfg.Kube != nil {
		rc := kube.WithRateLimits(cfg.Kube)
		var err error
		if s.kube, err = kubernetes.NewForConfig(rc); err != nil {
			return nil, fmt.Errorf("webhook: kubernetes client: %w", err)
		}
		if s.dyn, err = dynamic.NewForConfig(rc); err != nil {
			return nil, fmt.Errorf("webhook: kubernetes client: %w", err)
		}
	}
	s.mesh = &meshHolder{src: deps.Mesh, log: log, fallback: mesh.Default()}
	injDeps := inject.Deps{Logger: log, Dir: cmp.Or(cfg.InjectionDir, DefaultInjectionDir)}
	if s.kube != nil {
		injDeps.Kube, injDeps.Dir = s.kube, ""
	}
	inj, err := inject.New(inject.Config{Revision: cfg.Revision, Namespace: cfg.Namespace, Mesh: s.mesh.current}, injDeps)
	if err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	s.injector = inj
	return s, nil
}

// DNSNames are the names the Kubernetes API server calls the webhook in namespace by.
func DNSNames(namespace string) []string {
	return []string{ServiceName + "." + namespace + ".svc", ServiceName + "." + namespace + ".svc.cluster.local"}
}

// ConfigName is the name of a webhook configuration (InjectorConfigName, ValidatorConfigName)
// for revision.
func ConfigName(base, revision string) string {
	if revision == "" || revision == DefaultRevision {
		return base
	}
	return base + "-" + revision
}

// Ready is closed once the webhook listens with a certificate and the injection templates are
// loaded.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Addr is the listener's address, once Ready.
func (s *Server) Addr() net.Addr {
	if a := s.addr.Load(); a != nil {
		return *a
	}
	return nil
}

// Run serves until ctx ends, and (PatchCABundle with Kube) keeps the configurations current.
func (s *Server) Run(ctx context.Context) error {
	lis, err := (&net.ListenConfig{}).Listen(ctx, "tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("webhook: listen: %w", err)
	}
	var m component.Manager
	m.Add("https", component.Func(func(ctx context.Context) error { return s.serve(ctx, lis) }))
	m.Add("inject", s.injector)
	if s.mesh.src != nil {
		m.Add("mesh-config", s.mesh)
	}
	if s.kube != nil && s.cfg.PatchCABundle {
		m.Add("ca-bundle", &configPatcher{
			kube: s.kube, dyn: s.dyn, log: s.log.With("revision", s.cfg.Revision),
			revision: s.cfg.Revision, namespace: s.cfg.Namespace, roots: s.cert.Roots, certReady: s.cert.Ready,
		})
	}
	return m.Run(ctx)
}

// serve serves HTTPS on lis until ctx ends, then shuts down gracefully.
func (s *Server) serve(ctx context.Context, lis net.Listener) error {
	srv := &http.Server{
		Handler: s.routes(),
		TLSConfig: &tls.Config{
			MinVersion: tls.VersionTLS12, GetCertificate: s.cert.Get, NextProtos: []string{"h2", "http/1.1"},
		},
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       90 * time.Second,
		// Probes and port scans end handshakes early; that is not worth more than debug.
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(lis, "", "") }()
	for _, ready := range []<-chan struct{}{s.cert.Ready, s.injector.Ready()} {
		select {
		case <-ready:
		case <-ctx.Done():
		case err := <-errc:
			return fmt.Errorf("webhook: serve: %w", err)
		}
	}
	if ctx.Err() == nil {
		a := lis.Addr()
		s.addr.Store(&a)
		s.log.Info("serving admission webhooks", "address", a.String(), "paths", []string{"/inject", "/validate"})
		close(s.ready)
	}
	select {
	case <-ctx.Done():
	case err := <-errc:
		return fmt.Errorf("webhook: serve: %w", err)
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		_ = srv.Close()
	}
	<-errc
	return nil
}

// routes are the webhook's HTTP handlers: the admission paths, and /ready for probes (200 once
// Ready, else 503).
func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /validate", s.admission(s.validate, func(resp *admissionv1.AdmissionResponse, status int, _ time.Duration) {
		if resp == nil {
			s.metrics.validationHTTPErrorAnswered(status)
		}
	}))
	mux.Handle("POST /inject", s.admission(s.injector.Admit, func(resp *admissionv1.AdmissionResponse, _ int, took time.Duration) {
		s.metrics.injectionAnswered(resp, took)
	}))
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-s.ready:
			_, _ = w.Write([]byte("ready\n"))
		default:
			http.Error(w, "not ready", http.StatusServiceUnavailable)
		}
	})
	return mux
}
