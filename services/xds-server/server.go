// Package xdsserver serves xDS over ADS (state-of-the-world and delta) to proxyless gRPC clients,
// generated from the mesh registry and the Istio config it consumes from the bus.
package xdsserver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"sailplane.dev/services/xds-server/internal/grpcgen"
	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/shared/bus"
)

// Config configures the server.
type Config struct {
	// Listen is the ADS address; default "127.0.0.1:15010".
	Listen string
	// Debounce is how long the config must stay quiet before a rebuild; default 100ms. A burst
	// of changes is never delayed by more than ten times this.
	Debounce time.Duration
}

// Deps are the server's collaborators. Config and Registry may be the same Source.
type Deps struct {
	Logger *slog.Logger
	// Config carries Istio config from config-ingest (VirtualService, DestinationRule, ...,
	// MeshConfig).
	Config bus.Source
	// Registry carries schema.Service and schema.Endpoints from endpoint-watcher.
	Registry bus.Source
}

// Errors returned by New and Serve.
var (
	ErrMissingDependency = errors.New("xdsserver: missing dependency")
	ErrAlreadyStarted    = errors.New("xdsserver: already started")
	ErrSubscription      = errors.New("xdsserver: bus subscription ended")
)

// gracePeriod bounds how long shutdown waits for in-flight RPCs before closing connections.
const gracePeriod = 5 * time.Second

// Server is the xds-server. Run (or Serve) it once.
type Server struct {
	cfg   Config
	deps  Deps
	log   *slog.Logger
	store *model.Store
	cache cachev3.SnapshotCache

	started atomic.Bool
	ready   chan struct{}
	addr    atomic.Pointer[net.Addr]

	// mu orders snapshot publication against node arrivals, so that a node never ends up with
	// an older snapshot than the current one.
	mu      sync.Mutex
	current *cachev3.Snapshot
	nodes   map[string]int   // node ID -> open streams
	streams map[int64]string // stream ID -> node ID
}

// New validates the configuration and returns a server ready to Run.
func New(cfg Config, deps Deps) (*Server, error) {
	if deps.Config == nil || deps.Registry == nil {
		return nil, fmt.Errorf("%w: Config and Registry sources are required", ErrMissingDependency)
	}
	if cfg.Debounce < 0 {
		return nil, fmt.Errorf("xdsserver: negative debounce %v", cfg.Debounce)
	}
	cfg.Listen = cmp.Or(cfg.Listen, "127.0.0.1:15010")
	cfg.Debounce = cmp.Or(cfg.Debounce, 100*time.Millisecond)
	log := deps.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		cfg: cfg, deps: deps, log: log,
		store:   model.NewStore(),
		ready:   make(chan struct{}),
		nodes:   map[string]int{},
		streams: map[int64]string{},
	}
	s.cache = cachev3.NewSnapshotCache(false, cachev3.IDHash{}, cacheLogger{log.With("component", "snapshot-cache")})
	return s, nil
}

// Ready is closed once the server listens and both sources delivered their first full state
// (so the first clients get the whole mesh, not a partial view).
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Addr is the address the server listens on; valid after Ready.
func (s *Server) Addr() net.Addr {
	if a := s.addr.Load(); a != nil {
		return *a
	}
	return nil
}

// Run listens on Config.Listen and serves until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	lis, err := (&net.ListenConfig{}).Listen(ctx, "tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("xdsserver: listen: %w", err)
	}
	return s.Serve(ctx, lis)
}

// Serve serves on lis, which it closes, until ctx ends; then it stops gracefully.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	if !s.started.CompareAndSwap(false, true) {
		_ = lis.Close()
		return ErrAlreadyStarted
	}
	addr := lis.Addr()
	s.addr.Store(&addr)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var wg sync.WaitGroup
	errc := make(chan error, 3)
	configSynced, registrySynced := make(chan struct{}), make(chan struct{})
	subscribe := func(name string, src bus.Source, typeURLs []string, synced chan struct{}) {
		wg.Go(func() {
			err := src.Subscribe(ctx, typeURLs, s.store.Handler(func() { close(synced) }))
			if ctx.Err() == nil {
				errc <- fmt.Errorf("%w: %s: %w", ErrSubscription, name, cmp.Or(err, errors.New("returned early")))
			}
		})
	}
	subscribe("config", s.deps.Config, model.TypeURLs(model.ConfigKinds), configSynced)
	subscribe("registry", s.deps.Registry, model.TypeURLs(model.RegistryKinds), registrySynced)

	gs := grpc.NewServer(
		// gRPC clients keep ADS streams open for hours with keepalives; do not punish them.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
	)
	// The xDS server's streams end when ctx does, which lets GracefulStop finish.
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(gs, serverv3.NewServer(ctx, s.cache, s.callbacks()))
	wg.Go(func() {
		if err := gs.Serve(lis); err != nil {
			errc <- fmt.Errorf("xdsserver: serve: %w", err)
		}
	})

	wg.Go(func() {
		for _, synced := range []chan struct{}{configSynced, registrySynced} {
			select {
			case <-ctx.Done():
				return
			case <-synced:
			}
		}
		s.rebuild(ctx)
		close(s.ready)
		s.log.Info("serving xDS", "addr", addr.String())
		model.Debounce(ctx, s.store.Changed(), s.cfg.Debounce, 10*s.cfg.Debounce, func() { s.rebuild(ctx) })
	})

	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	cancel()
	stopGracefully(gs)
	wg.Wait()
	return err
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

// rebuild translates the current bus state and hands the result to every connected node.
func (s *Server) rebuild(ctx context.Context) {
	start := time.Now()
	res := grpcgen.Generate(s.store.Snapshot(), s.log.With("component", "grpcgen"))
	snap, err := newSnapshot(res, s.log)
	if err != nil {
		s.log.Error("building xDS snapshot", "err", err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.current = snap
	for node := range s.nodes {
		if err := s.cache.SetSnapshot(ctx, node, snap); err != nil {
			s.log.Warn("setting snapshot", "node", node, "err", err)
		}
	}
	s.log.Debug("rebuilt xDS", "listeners", len(res.Listeners), "routes", len(res.Routes),
		"clusters", len(res.Clusters), "endpoints", len(res.Endpoints), "nodes", len(s.nodes),
		"took", time.Since(start))
}

func (s *Server) callbacks() serverv3.Callbacks {
	return serverv3.CallbackFuncs{
		StreamRequestFunc: func(id int64, req *discoverygrpc.DiscoveryRequest) error {
			if req.GetNode() != nil {
				s.track(id, req.GetNode().GetId(), req.GetNode().GetMetadata().GetFields()["GENERATOR"].GetStringValue())
			}
			return nil
		},
		StreamDeltaRequestFunc: func(id int64, req *discoverygrpc.DeltaDiscoveryRequest) error {
			// Delta requests carry the node only on the first request of a stream.
			if req.GetNode() != nil {
				s.track(id, req.GetNode().GetId(), req.GetNode().GetMetadata().GetFields()["GENERATOR"].GetStringValue())
			}
			return nil
		},
		StreamClosedFunc:      func(id int64, _ *corev3.Node) { s.untrack(id) },
		DeltaStreamClosedFunc: func(id int64, _ *corev3.Node) { s.untrack(id) },
	}
}

// track gives a node the current snapshot on its first stream, before the cache answers its
// first request, so new clients are served at once.
func (s *Server) track(stream int64, node, generator string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.streams[stream]; ok {
		return
	}
	s.streams[stream] = node
	s.nodes[node]++
	if s.nodes[node] > 1 {
		return
	}
	s.log.Debug("node connected", "node", node, "generator", generator)
	if s.current != nil {
		if err := s.cache.SetSnapshot(context.Background(), node, s.current); err != nil {
			s.log.Warn("setting snapshot", "node", node, "err", err)
		}
	}
}

func (s *Server) untrack(stream int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	node, ok := s.streams[stream]
	if !ok {
		return
	}
	delete(s.streams, stream)
	if s.nodes[node]--; s.nodes[node] > 0 {
		return
	}
	delete(s.nodes, node)
	s.cache.ClearSnapshot(node)
	s.log.Debug("node disconnected", "node", node)
}
