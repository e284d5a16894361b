package upstream

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	"sailplane.dev/services/config-ingest/internal/statefile"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/mesh"
	"sailplane.dev/shared/workloadcert"
)

// DefaultSyncTimeout is how long config-ingest's first state waits for an upstream that neither
// answered nor has a saved state: after it, the local config is served without it, and the
// upstream's resources follow when it answers.
const DefaultSyncTimeout = 10 * time.Second

// saveDelay is how long the saved state may trail what was received.
const saveDelay = time.Second

// ErrTLS marks an upstream whose tlsSettings cannot be honoured: it is not dialled (what it last
// sent stays served), never dialled in plaintext instead.
var ErrTLS = errors.New("cannot connect as tlsSettings asks")

// ErrNotSynced marks an upstream that has not sent its first full state since config-ingest
// started (unreachable, or refusing: its log says why): what it sent before, saved in the state
// folder, is served, and nothing of it is deleted until it answers.
var ErrNotSynced = errors.New("no full state received yet (unreachable or refusing, see the log)")

// SourceError is an upstream config source that is not read.
type SourceError struct {
	Address string
	Err     error
}

func (e *SourceError) Error() string {
	return fmt.Sprintf("config source %s: %v; what it last sent stays served", e.Address, e.Err)
}

func (e *SourceError) Unwrap() error { return e.Err }

// Config configures the upstream sources.
type Config struct {
	// Namespace, PodName, ClusterID and IP make the node identity presented upstream: Istio's
	// four-part node ID sidecar~IP~POD.NAMESPACE~NAMESPACE.svc.cluster.local, which istiod
	// requires, and the NAMESPACE and CLUSTER_ID metadata.
	Namespace, PodName, ClusterID, IP string
	// Identity is the service's workload certificate, for tlsSettings.mode ISTIO_MUTUAL (and
	// no mode); nil: such sources are refused.
	Identity workloadcert.Source
	// StateDir, when set, keeps what each upstream last sent (StateFile) across restarts.
	StateDir string
	// SyncTimeout bounds how long Ready waits for upstreams; DefaultSyncTimeout when zero.
	SyncTimeout time.Duration
	Logger      *slog.Logger
	// DialOptions are added to each upstream's bus consumer (tests shorten the backoff).
	DialOptions []bus.DialOption
}

// Manager runs the upstream config sources the mesh config names and merges what they send
// with the local config.
type Manager struct {
	cfg    Config
	log    *slog.Logger
	merger *Merger

	meshCh  chan *meshv1alpha1.MeshConfig
	changed chan struct{}
	ready   chan struct{}

	mu       sync.Mutex
	running  map[string]*running
	restored map[string]bool // layers restored from the saved state, by address
	problems []error         // sources not read
	meshSeen bool
	id       string // instance ID, stamped in PathAnnotation
}

type running struct {
	src    *source
	tls    string // the settings it was started with
	cancel context.CancelFunc
	done   chan struct{}
}

// New returns a Manager publishing the merged config to out, with the saved state of the
// upstreams (if any) already in place.
func New(cfg Config, out bus.Publisher) *Manager {
	cfg.SyncTimeout = cmp.Or(cfg.SyncTimeout, DefaultSyncTimeout)
	cfg.Namespace = cmp.Or(cfg.Namespace, "istio-system")
	cfg.ClusterID = cmp.Or(cfg.ClusterID, "Kubernetes")
	if cfg.PodName == "" {
		cfg.PodName, _ = os.Hostname()
	}
	cfg.IP = cmp.Or(cfg.IP, os.Getenv("INSTANCE_IP"), os.Getenv("POD_IP"), "127.0.0.1")
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	m := &Manager{
		cfg: cfg, log: cfg.Logger,
		meshCh: make(chan *meshv1alpha1.MeshConfig, 1), changed: make(chan struct{}, 1), ready: make(chan struct{}),
		running: map[string]*running{}, restored: map[string]bool{},
	}
	m.id = instanceID(cfg.StateDir)
	m.merger = NewMerger(out, cfg.Logger, m.meshChanged, func(string) {
		select {
		case m.changed <- struct{}{}:
		default:
		}
	})
	m.restore()
	return m
}

// Local is the Publisher of the local sources (files or Kubernetes): its mesh config says
// which upstreams to read.
func (m *Manager) Local() bus.Publisher {
	return stampPublisher{Publisher: m.merger.Publisher(Local), id: m.id}
}

// Ready is closed once the mesh config was seen and every upstream it names sent its first full
// state, or had a saved state, or SyncTimeout passed.
func (m *Manager) Ready() <-chan struct{} { return m.ready }

// Problems returns the upstreams not read or not synced yet (*SourceError), their invalid resources (*config.Error
// naming the source as its file), and the resources shadowed by a source that comes first
// (*ConflictError).
func (m *Manager) Problems() []error {
	m.mu.Lock()
	out := slices.Clone(m.problems)
	var srcs []*source
	for _, addr := range slices.Sorted(maps.Keys(m.running)) {
		srcs = append(srcs, m.running[addr].src)
	}
	m.mu.Unlock()
	for _, s := range srcs {
		select {
		case <-s.synced:
		default:
			out = append(out, &SourceError{Address: s.address, Err: ErrNotSynced})
		}
		out = append(out, s.problems()...)
	}
	return append(out, m.merger.Conflicts()...)
}

func (m *Manager) meshChanged(mc *meshv1alpha1.MeshConfig) {
	select {
	case <-m.meshCh:
	default:
	}
	m.meshCh <- mc
}

// Run follows the mesh config's xds:// sources until ctx is done: each is subscribed to, the
// ones removed are stopped and their resources withdrawn. What was received is saved in the
// state folder.
func (m *Manager) Run(ctx context.Context) error {
	// The state is written only once it differs from what was restored: a run that never had
	// an upstream writes nothing.
	var writer *statefile.Writer
	defer func() {
		if writer != nil {
			writer.Close()
		}
	}()
	save := time.NewTimer(time.Hour)
	save.Stop()
	defer save.Stop()
	saved, _ := m.marshalState()
	doSave := func() {
		if m.cfg.StateDir == "" {
			return
		}
		data, err := m.marshalState()
		if err != nil {
			m.log.Warn("cannot save the upstream config: after a restart, it is not served until each upstream answers", "file", m.statePath(), "error", err)
			return
		}
		if string(data) == string(saved) {
			return
		}
		saved = data
		if writer == nil {
			writer = statefile.NewWriter(m.log, m.statePath())
		}
		writer.Write(data)
	}
	defer doSave()
	defer m.stopAll()
	for {
		select {
		case <-ctx.Done():
			return nil
		case mc := <-m.meshCh:
			m.configure(ctx, mc)
		case <-m.changed:
			save.Reset(saveDelay)
		case <-save.C:
			doSave()
		}
	}
}

// configure starts, restarts and stops upstreams as mc's configSources say.
func (m *Manager) configure(ctx context.Context, mc *meshv1alpha1.MeshConfig) {
	srcs, err := mesh.XDSSources(mc)
	var problems []error
	if err != nil {
		problems = append(problems, err)
	}
	order := make([]string, 0, len(srcs))
	want := map[string]bool{}
	var wait []*running
	m.mu.Lock()
	for _, src := range srcs {
		if want[src.Address] {
			continue // listed twice: the first place counts
		}
		want[src.Address] = true
		order = append(order, src.Address)
		tlsKey := fmt.Sprint(src.TLS)
		if r := m.running[src.Address]; r != nil {
			if r.tls == tlsKey {
				wait = append(wait, r)
				continue
			}
			m.stopLocked(src.Address)
		}
		creds, err := m.credentials(src)
		if err != nil {
			problems = append(problems, &SourceError{Address: src.Address, Err: err})
			m.log.Error("upstream config source not read", "source", src.Address, "error", err)
			continue
		}
		r := m.startLocked(ctx, src, creds, tlsKey)
		wait = append(wait, r)
	}
	for addr := range m.running {
		if !want[addr] {
			m.stopLocked(addr)
			m.log.Info("upstream config source removed: its resources are withdrawn", "source", addr)
		}
	}
	m.problems = problems
	first := !m.meshSeen
	m.meshSeen = true
	m.mu.Unlock()
	m.merger.SetOrder(order)
	if first {
		go m.waitReady(ctx, wait)
	}
}

func (m *Manager) startLocked(ctx context.Context, src mesh.XDSSource, creds credentials.TransportCredentials, tlsKey string) *running {
	log := m.log.With("source", src.Address)
	opts := append([]bus.DialOption{
		bus.WithDialLogger(log),
		bus.WithNodeID(fmt.Sprintf("sidecar~%s~%s.%s~%s.svc.cluster.local", m.cfg.IP, m.cfg.PodName, m.cfg.Namespace, m.cfg.Namespace)),
		bus.WithNodeMetadata(map[string]string{
			"NAMESPACE": m.cfg.Namespace, "CLUSTER_ID": m.cfg.ClusterID, "NAME": m.cfg.PodName,
			// As Istio's own MCP client (adsc): the newest version, so that no feature is held back.
			"ISTIO_VERSION": "65536.65536.65536",
		}),
		bus.WithTransportCredentials(creds),
	}, m.cfg.DialOptions...)
	// State of the world: what istiod's MCP server speaks, and Sailplane's too.
	client := bus.DialSotW(src.Target, opts...)
	layer := m.merger.Publisher(src.Address)
	s := newSource(src.Address, m.id, client, layer, func(typ, name string) *bus.Resource { return m.merger.Get(src.Address, typ, name) }, log)
	rctx, cancel := context.WithCancel(ctx)
	r := &running{src: s, tls: tlsKey, cancel: cancel, done: make(chan struct{})}
	m.running[src.Address] = r
	go func() {
		defer close(r.done)
		if err := s.run(rctx); err != nil {
			m.log.Error("upstream config source stopped", "source", src.Address, "error", err)
		}
	}()
	m.log.Info("upstream config source started", "source", src.Address, "target", src.Target, "tls", tlsMode(src.TLS))
	return r
}

func (m *Manager) stopLocked(addr string) {
	r := m.running[addr]
	delete(m.running, addr)
	r.cancel()
	<-r.done
}

func (m *Manager) stopAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for addr := range m.running {
		m.stopLocked(addr)
	}
}

// waitReady closes ready once each upstream synced or was restored, or at SyncTimeout.
func (m *Manager) waitReady(ctx context.Context, wait []*running) {
	defer close(m.ready)
	timeout := time.NewTimer(m.cfg.SyncTimeout)
	defer timeout.Stop()
	for _, r := range wait {
		m.mu.Lock()
		restored := m.restored[r.src.address]
		m.mu.Unlock()
		if restored {
			continue // its saved state is served; its deletions wait for its first full state
		}
		select {
		case <-r.src.synced:
		case <-r.done:
		case <-ctx.Done():
			return
		case <-timeout.C:
			m.log.Warn("upstream config source not synced in time: the config is served without it, its resources follow when it answers",
				"source", r.src.address, "waited", m.cfg.SyncTimeout)
			return
		}
	}
}

// credentials are the transport credentials tlsSettings asks for: mutual TLS with the workload
// certificate (ISTIO_MUTUAL, also without tlsSettings), plaintext only for mode DISABLE.
func (m *Manager) credentials(src mesh.XDSSource) (credentials.TransportCredentials, error) {
	switch mode := src.TLS.GetMode(); {
	case src.TLS != nil && mode == networking.ClientTLSSettings_DISABLE:
		return insecure.NewCredentials(), nil
	case src.TLS == nil || mode == networking.ClientTLSSettings_ISTIO_MUTUAL:
		if m.cfg.Identity == nil {
			return nil, fmt.Errorf("%w: ISTIO_MUTUAL (the default) needs the service's workload certificate (--ca-address), "+
				"or tlsSettings.mode DISABLE for plaintext", ErrTLS)
		}
		return mutualTLS(m.cfg.Identity, src, m.cfg.Namespace), nil
	default:
		return nil, fmt.Errorf("%w: tlsSettings.mode %s is not supported (ISTIO_MUTUAL, or DISABLE for plaintext)", ErrTLS, mode)
	}
}

func tlsMode(t *networking.ClientTLSSettings) string {
	if t == nil {
		return "ISTIO_MUTUAL (default)"
	}
	return t.GetMode().String()
}
