// Package xdsserver serves xDS over ADS (state-of-the-world and delta) to proxyless gRPC clients,
// generated from the mesh registry and the Istio config it consumes from the bus.
package xdsserver

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"k8s.io/client-go/kubernetes"

	"sailplane.dev/services/xds-server/internal/authz"
	sdscredentials "sailplane.dev/services/xds-server/internal/credentials"
	"sailplane.dev/services/xds-server/internal/jwks"
	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/services/xds-server/internal/xds"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/cli"
	"sailplane.dev/shared/grpcserver"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/version"
)

// Config configures the server.
type Config struct {
	// Listen is the plaintext ADS address (istiod's 15010); "127.0.0.1:15010" when both it and
	// SecureListen are empty, off when only it is.
	Listen string
	// SecureListen is the ADS address over TLS (istiod's 15012), served with Deps.TLS; empty: off.
	// Its xDS clients must authenticate (a client certificate or a token, see authenticate).
	SecureListen string
	// Debounce is how long changes must stay quiet before they are pushed; default 100ms.
	Debounce time.Duration
	// DebounceMax bounds how long a steady stream of changes can hold a push back; default
	// ten times Debounce.
	DebounceMax time.Duration
	// EndpointDebounce replaces Debounce while only endpoints changed: they come from one
	// producer in batches and are what traffic waits on; default a tenth of Debounce.
	EndpointDebounce time.Duration
	// PushConcurrency bounds how many proxies are pushed at once; default 16.
	PushConcurrency int
	// MaxConnectionAge closes client connections after this age (±10% jitter) so that
	// proxies spread over new replicas; 0 keeps them forever.
	MaxConnectionAge time.Duration
	// MaxConnectionAgeGrace is how long a connection past its age may finish its streams;
	// default 10s.
	MaxConnectionAgeGrace time.Duration
	// Namespace is the control plane's namespace: over TLS, only clients authenticated (by
	// certificate or token) as a service account in it may ask for the debug types (proxy
	// status, config dumps).
	// Default cli.DefaultNamespace.
	Namespace string
	// PodName names this replica in debug responses (which replica a proxy is connected
	// to); default the host name.
	PodName string
	// ClusterID is this cluster's name: a TLS client authenticating with a token while claiming
	// another cluster (the "clusterid" metadata pilot-agent sends) is refused, as istiod refuses
	// a token it has no API server for. "Kubernetes" (istiod's default) when empty.
	ClusterID string
	// DebugPlaintext serves the debug types on a plaintext listener that is not on a loopback
	// address, to anyone who reaches it. Off: only a loopback plaintext listener serves them.
	DebugPlaintext bool
	// CacheAssert makes the resource cache fail loudly when one key would hold two values.
	// For tests: it disables sharing.
	CacheAssert bool
	// Clock drives the debouncer; nil is the wall clock. For tests.
	Clock xds.Clock
	// Overload configures admission control, send timeouts and rebalancing (overload.go).
	Overload Overload
	// NackBackoff holds back a type from a proxy that rejects it twice or more in a row, for
	// this long after the second NACK, doubling with each further one up to MaxNackBackoff
	// (xds.NackBackoff); defaults 1s and 30s.
	NackBackoff, MaxNackBackoff time.Duration
}

// Deps are the server's collaborators. Config and Registry may be the same Source.
type Deps struct {
	Logger *slog.Logger
	// Config carries Istio config from config-ingest (VirtualService, DestinationRule, ...,
	// MeshConfig).
	Config bus.Source
	// Registry carries schema.Service and schema.Endpoints from endpoint-watcher.
	Registry bus.Source
	// Bundle, when set, carries the ca's trust bundle (schema.TrustBundle), which the server
	// holds (TrustBundle); it does not hold readiness back.
	Bundle bus.Source
	// TLS is the secure listener's TLS config (its serving certificate); required with
	// Config.SecureListen.
	TLS *tls.Config
	// Tokens, when set, reviews the service-account tokens of TLS clients without a client
	// certificate (kube.TokenReviewer, audience istio-ca); without it such clients are refused.
	Tokens TokenReviewer
	// SecureServices, when set, registers more services on the secure listener (hyper: the ca's
	// CreateCertificate, on one port as istiod serves it).
	SecureServices func(grpc.ServiceRegistrar)
	// Credentials, when set, is the cluster whose Secrets credentialName names: they are served
	// to the proxies allowed to read them over SDS (internal/credentials). It needs get, list
	// and watch on secrets and create on subjectaccessreviews. Nil: none are served (and
	// sidecars' DestinationRules with credentialName are refused).
	Credentials kubernetes.Interface
	// MeterProvider receives the xDS metrics (istiod's pilot_xds*, pilot_proxy_*) and the gRPC
	// server's (grpc.server.call.*); nil: the global one.
	MeterProvider metric.MeterProvider
}

// Errors returned by New and Serve.
var (
	ErrMissingDependency = errors.New("xdsserver: missing dependency")
	ErrAlreadyStarted    = errors.New("xdsserver: already started")
	ErrSubscription      = errors.New("xdsserver: bus subscription ended")
	ErrInvalidConfig     = errors.New("xdsserver: invalid config")
)

// gracePeriod bounds how long shutdown waits for in-flight RPCs before closing connections.
const gracePeriod = 5 * time.Second

// Server is the xds-server. Run (or Serve) it once. It keeps no state but what it derives from
// the bus and what each connection asked for, so any replica can serve any proxy.
type Server struct {
	cfg     Config
	deps    Deps
	log     *slog.Logger
	store   *model.Store
	xds     *xds.Server
	metrics *xds.Metrics
	bundles *trustBundles
	jwks    *jwks.Resolver
	// pushes are the recent pushes, for the status page.
	pushes pushLog
	// problems is the push status (/debug/push_status), which generation reports to.
	problems *pushStatus
	// conns are the client connections, admission the ADS streams (overload.go).
	conns     *connTracker
	admission *admission
	// secrets serves credentialName secrets; nil without Deps.Credentials.
	secrets *sdscredentials.Controller
	// tracer traces pushes of traced changes (see xds.PushTracer).
	tracer *xds.PushTracer
	// instance is random, so that the rebalancer tells its own load report from its peers'
	// even where they share a pod name (two replicas on one host, named after it).
	instance string

	started atomic.Bool
	// plaintextDebug: the plaintext listener serves the debug types (loopback, or
	// Config.DebugPlaintext); set before serving.
	plaintextDebug bool
	ready          chan struct{}
	addr           atomic.Pointer[net.Addr]
	secureAddr     atomic.Pointer[net.Addr]
}

// New validates the configuration and returns a server ready to Run.
func New(cfg Config, deps Deps) (*Server, error) {
	if deps.Config == nil || deps.Registry == nil {
		return nil, fmt.Errorf("%w: Config and Registry sources are required", ErrMissingDependency)
	}
	if cfg.Debounce < 0 || cfg.DebounceMax < 0 || cfg.EndpointDebounce < 0 || cfg.PushConcurrency < 0 || cfg.MaxConnectionAge < 0 || cfg.MaxConnectionAgeGrace < 0 ||
		cfg.NackBackoff < 0 || cfg.MaxNackBackoff < 0 {
		return nil, fmt.Errorf("%w: negative duration or concurrency", ErrInvalidConfig)
	}
	if cfg.SecureListen != "" && deps.TLS == nil {
		return nil, fmt.Errorf("%w: a secure listener (%s) needs Deps.TLS", ErrMissingDependency, cfg.SecureListen)
	}
	if cfg.SecureListen == "" {
		cfg.Listen = cmp.Or(cfg.Listen, "127.0.0.1:15010")
	}
	cfg.Debounce = cmp.Or(cfg.Debounce, 100*time.Millisecond)
	cfg.DebounceMax = cmp.Or(cfg.DebounceMax, 10*cfg.Debounce)
	cfg.EndpointDebounce = cmp.Or(cfg.EndpointDebounce, cfg.Debounce/10)
	cfg.PushConcurrency = cmp.Or(cfg.PushConcurrency, 16)
	cfg.MaxConnectionAgeGrace = cmp.Or(cfg.MaxConnectionAgeGrace, 10*time.Second)
	cfg.Namespace = cmp.Or(cfg.Namespace, cli.DefaultNamespace)
	cfg.ClusterID = cmp.Or(cfg.ClusterID, "Kubernetes")
	if cfg.PodName == "" {
		cfg.PodName, _ = os.Hostname()
	}
	var err error
	if cfg.Overload, err = cfg.Overload.withDefaults(); err != nil {
		return nil, err
	}
	log := deps.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		cfg: cfg, deps: deps, log: log,
		store:   model.NewStore(),
		bundles: newTrustBundles(),
		ready:   make(chan struct{}),
		conns:   newConnTracker(),
		tracer:  xds.NewPushTracer(),
	}
	s.instance = rand.Text()
	s.problems = newPushStatus()
	s.admission = newAdmission(cfg.Overload, log.With("component", "admission"), s.conns)
	s.jwks = jwks.New(s.store, log.With("component", "jwks"), 0, 0, 0)
	if s.metrics, err = xds.NewMetrics(deps.MeterProvider); err != nil {
		return nil, err
	}
	if s.admission.metrics, err = newOverloadMetrics(deps.MeterProvider, s.admission); err != nil {
		return nil, err
	}
	if err := s.registerPushStatusGauges(deps.MeterProvider); err != nil {
		return nil, err
	}
	var secrets xds.SecretSource
	if deps.Credentials != nil {
		s.secrets = sdscredentials.New(deps.Credentials, log.With("component", "credentials"))
		s.secrets.OnChange(func(ns string) { s.xds.PushSecrets(ns) })
		secrets = secretSource{c: s.secrets, cluster: cfg.ClusterID}
	}
	s.xds = xds.NewServer(xds.Options{
		Logger:          log.With("component", "ads"),
		Generator:       generatorFor(log, s.problems, s.secrets != nil),
		Secrets:         secrets,
		PushConcurrency: cfg.PushConcurrency,
		CacheAssert:     cfg.CacheAssert,
		PeerIdentity:    grpcserver.PeerIdentity, // authenticated by s.authenticate
		DebugAccess:     s.debugAccess,
		Replica:         cfg.PodName,
		Version:         version.Get().Version,
		Observers:       []xds.Observer{s.metrics, &s.pushes, s.tracer, xds.NewNackBackoff(cfg.NackBackoff, cfg.MaxNackBackoff)},
	})
	return s, nil
}

// Ready is closed once the server listens and both sources delivered their first full state
// (so the first clients get the whole mesh, not a partial view). Until then ADS streams are
// refused with Unavailable and the gRPC health service (grpc.health.v1, service "") answers
// NOT_SERVING, so proxies and readiness probes turn to another replica instead of waiting.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Addr is the plaintext listener's address; valid after Ready, nil when it is off.
func (s *Server) Addr() net.Addr {
	if a := s.addr.Load(); a != nil {
		return *a
	}
	return nil
}

// SecureAddr is the TLS listener's address; valid after Ready, nil when it is off.
func (s *Server) SecureAddr() net.Addr {
	if a := s.secureAddr.Load(); a != nil {
		return *a
	}
	return nil
}

// Run listens on Config.Listen and Config.SecureListen (each unless empty) and serves until ctx
// ends.
func (s *Server) Run(ctx context.Context) error {
	var plain, secure net.Listener
	for _, l := range []struct {
		addr string
		lis  *net.Listener
	}{{s.cfg.Listen, &plain}, {s.cfg.SecureListen, &secure}} {
		if l.addr == "" {
			continue
		}
		lis, err := (&net.ListenConfig{}).Listen(ctx, "tcp", l.addr)
		if err != nil {
			if plain != nil {
				_ = plain.Close()
			}
			return fmt.Errorf("xdsserver: listen: %w", err)
		}
		*l.lis = lis
	}
	return s.serve(ctx, plain, secure)
}

// Serve serves plaintext ADS on lis, which it closes, until ctx ends; then it stops gracefully.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	return s.serve(ctx, lis, nil)
}

// serve serves on the plaintext and the TLS listener, either of which may be nil.
func (s *Server) serve(ctx context.Context, plain, secure net.Listener) error {
	if !s.started.CompareAndSwap(false, true) {
		for _, lis := range []net.Listener{plain, secure} {
			if lis != nil {
				_ = lis.Close()
			}
		}
		return ErrAlreadyStarted
	}
	if plain != nil {
		s.plaintextDebug = s.cfg.DebugPlaintext || isLoopback(plain.Addr())
	}
	var addrs []string
	for _, l := range []struct {
		lis net.Listener
		to  *atomic.Pointer[net.Addr]
	}{{plain, &s.addr}, {secure, &s.secureAddr}} {
		if l.lis != nil {
			a := l.lis.Addr()
			l.to.Store(&a)
			addrs = append(addrs, a.String())
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var wg sync.WaitGroup
	errc := make(chan error, 5) // three subscriptions, two listeners
	configSynced, registrySynced := make(chan struct{}), make(chan struct{})
	subscribe := func(name string, src bus.Source, typeURLs []string, synced chan struct{}) {
		wg.Go(func() {
			err := src.Subscribe(ctx, typeURLs, s.store.Handler(func() { close(synced) }))
			if ctx.Err() == nil {
				errc <- fmt.Errorf("%w: %s: %w", ErrSubscription, name, cmp.Or(err, errors.New("returned early")))
			}
		})
	}
	subscribe("config", s.deps.Config, schema.TypeURLs(model.ConfigKinds), configSynced)
	subscribe("registry", s.deps.Registry, schema.TypeURLs(model.RegistryKinds), registrySynced)
	if s.deps.Bundle != nil {
		wg.Go(func() {
			err := s.deps.Bundle.Subscribe(ctx, []string{schema.TrustBundle.TypeURL}, s.bundles)
			if ctx.Err() == nil {
				errc <- fmt.Errorf("%w: trust bundle: %w", ErrSubscription, cmp.Or(err, errors.New("returned early")))
			}
		})
	}

	ka := keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}
	if s.cfg.MaxConnectionAge > 0 {
		// gRPC jitters the age by ±10% and sends GOAWAY, so the client's next connection may
		// land on another replica; streams get the grace period to end.
		ka.MaxConnectionAge = s.cfg.MaxConnectionAge
		ka.MaxConnectionAgeGrace = s.cfg.MaxConnectionAgeGrace
	}
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	newGRPC := func(opts ...grpc.ServerOption) *grpc.Server {
		// Sailplane's server defaults (panic recovery, permissive keepalive enforcement for
		// clients that hold ADS streams for hours), plus the connection age.
		gs := grpcserver.New(s.log, append(append([]grpc.ServerOption{
			// Responses reference the cached encodings instead of copying them per connection.
			grpc.ForceServerCodecV2(xds.Codec()),
			grpc.KeepaliveParams(ka),
			grpcserver.WithMeterProvider(s.deps.MeterProvider),
			grpcserver.WithAuth(s.authenticate),
		}, s.overloadOptions()...), opts...)...)
		discoverygrpc.RegisterAggregatedDiscoveryServiceServer(gs, syncGate{s.xds, s.ready})
		healthpb.RegisterHealthServer(gs, hs)
		s.registerLoad(gs)
		return gs
	}
	var servers []*grpc.Server
	serveOn := func(gs *grpc.Server, lis net.Listener) {
		servers = append(servers, gs)
		lis = s.conns.listener(lis)
		wg.Go(func() {
			if err := gs.Serve(lis); err != nil {
				errc <- fmt.Errorf("xdsserver: serve %s: %w", lis.Addr(), err)
			}
		})
	}
	// The ADS streams end when the push workers stop with ctx, which lets GracefulStop finish.
	wg.Go(func() { _ = s.xds.Run(ctx) })
	wg.Go(func() { _ = s.jwks.Run(ctx) })
	if s.secrets != nil {
		wg.Go(func() { _ = s.secrets.Run(ctx) })
	}
	s.runOverload(ctx, &wg)
	if plain != nil {
		serveOn(newGRPC(), plain)
	}
	if secure != nil {
		gs := newGRPC(grpc.Creds(credentials.NewTLS(s.deps.TLS)))
		if s.deps.SecureServices != nil {
			s.deps.SecureServices(gs)
		}
		serveOn(gs, secure)
	}

	wg.Go(func() {
		for _, synced := range []chan struct{}{configSynced, registrySynced} {
			select {
			case <-ctx.Done():
				return
			case <-synced:
			}
		}
		s.push()
		close(s.ready)
		hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
		s.log.Info("serving xDS", "addrs", addrs)
		quiet := func() time.Duration {
			if s.store.PendingFull() {
				return s.cfg.Debounce
			}
			return s.cfg.EndpointDebounce
		}
		xds.DebounceFunc(ctx, s.cfg.Clock, s.store.Changed(), quiet, s.cfg.DebounceMax, s.push)
	})

	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	cancel()
	hs.Shutdown()
	var stopping sync.WaitGroup
	for _, gs := range servers {
		stopping.Go(func() { stopGracefully(gs) })
	}
	stopping.Wait()
	wg.Wait()
	return err
}

// errNotSynced refuses an ADS stream before the server has the first full state of its buses.
var errNotSynced = status.Error(codes.Unavailable,
	"xds-server: not ready: waiting for the first full state of its config and registry buses; try another server")

// syncGate refuses ADS streams until ready is closed: a proxy connecting to a replica whose bus
// peers are not there yet fails over at once instead of holding a stream that never answers.
type syncGate struct {
	discoverygrpc.AggregatedDiscoveryServiceServer
	ready <-chan struct{}
}

func (g syncGate) open() error {
	select {
	case <-g.ready:
		return nil
	default:
		return errNotSynced
	}
}

func (g syncGate) StreamAggregatedResources(stream discoverygrpc.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	if err := g.open(); err != nil {
		return err
	}
	return g.AggregatedDiscoveryServiceServer.StreamAggregatedResources(stream)
}

func (g syncGate) DeltaAggregatedResources(stream discoverygrpc.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	if err := g.open(); err != nil {
		return err
	}
	return g.AggregatedDiscoveryServiceServer.DeltaAggregatedResources(stream)
}

// push hands the next snapshot and what changed to the ADS server.
func (s *Server) push() {
	start := time.Now()
	snap, ch := s.store.Next()
	if ch.Empty() {
		return
	}
	s.xds.Push(snap, ch, s.tracer.Start(ch, start, snap.Version))
	select {
	case <-s.ready: // the first push, of the initial state, waited for the buses, not a debounce
		s.metrics.Debounced(ch.Since)
	default:
	}
	if ch.Full {
		// Keys of new jwksUris are fetched, and come back as a change of their own.
		s.jwks.Want(authz.JWKSURIs(snap))
	}
	s.log.Debug("pushing", "version", snap.Version, "full", ch.Full, "configs", len(ch.Configs),
		"endpoints", len(ch.Endpoints), "took", time.Since(start))
}

func stopGracefully(gs *grpc.Server) {
	done := make(chan struct{})
	go func() {
		gs.GracefulStop()
		close(done)
	}()
	t := time.NewTimer(gracePeriod)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		gs.Stop()
		<-done
	}
}

// secretSource serves SDS from the credentials controller.
type secretSource struct {
	c       *sdscredentials.Controller
	cluster string // Config.ClusterID
}

func (s secretSource) Secrets(ctx context.Context, p *model.Proxy, peer string, names []string) []types.Resource {
	return asResources(s.c.Secrets(ctx, p.ID, p.ClusterID, s.cluster, peer, names))
}
