// Package configingest reads Istio config, validates it, and publishes it on the bus: each
// kind's full state on the first sync, then only what changed. The config comes either from
// folders of YAML files with the mesh config from the mesh file, or, when Config.Kube is set,
// from a Kubernetes API server (Istio's CRDs) with the mesh config from the "istio" ConfigMap.
package configingest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"sailplane.dev/services/config-ingest/internal/gatewaydeploy"
	"sailplane.dev/services/config-ingest/internal/gatewaystatus"
	"sailplane.dev/services/config-ingest/internal/kubesource"
	"sailplane.dev/services/config-ingest/internal/tree"
	"sailplane.dev/services/config-ingest/internal/upstream"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/config"
	"sailplane.dev/shared/gatewayapi"
	"sailplane.dev/shared/kube"
	"sailplane.dev/shared/revision"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/telemetry"
	"sailplane.dev/shared/workloadcert"
)

// ErrDuplicate marks a problem where two documents define the same kind/namespace/name; the
// first by path order wins.
var ErrDuplicate = tree.ErrDuplicate

// Files-mode problems that keep what was served: ErrUnreadable, a folder, file or symlink that
// cannot be read; ErrEmpty, a file emptied (a write in progress until it gets content or is
// deleted); ErrSettling, a file that shrank, applied once it stays unchanged for Config.Settle.
var (
	ErrUnreadable = tree.ErrUnreadable
	ErrEmpty      = tree.ErrEmpty
	ErrSettling   = tree.ErrSettling
)

// In Kubernetes mode, problems wrapping ErrKubernetes say the API server is unreachable or a
// resource cannot be listed (RBAC), and ErrMeshConfigMap that the mesh ConfigMap is unusable
// (the last good mesh config stays in effect).
var (
	ErrKubernetes    = kubesource.ErrKubernetes
	ErrMeshConfigMap = kubesource.ErrMeshConfigMap
)

// StatusLease is the coordination.k8s.io Lease, in Config.Namespace, electing the replica that
// writes validation errors to the resources' status.
const StatusLease = kubesource.LeaseName

// Config configures the service.
type Config struct {
	// MeshFile is the mesh config (Istio meshConfig YAML); empty means Istio's defaults.
	MeshFile string
	// ConfigDirs, when not empty, are the folders to read instead of the mesh config's fs://
	// configSources.
	ConfigDirs []string
	// DefaultNamespace is the namespace of documents without one; "default" when empty.
	DefaultNamespace string
	// Debounce is how long the files must stay quiet before a rescan; 100ms when zero.
	Debounce time.Duration
	// Settle is how long a file that shrank (fewer documents or resources, as a file written
	// in place is halfway) must stay unchanged before its removals are published; 1s when zero.
	Settle time.Duration
	// StateDir, when set, is the folder where the last valid version of every file's resources
	// is saved (StateFile), by config source, so that a restart serves exactly what was served
	// before even when files became invalid or unreadable meanwhile, for the sources still
	// configured; in Kubernetes mode, the last valid version of every resource invalid in the
	// API server (kubesource.StateFile, by object UID). Empty: nothing is saved. The mains
	// default it to StateDirFor(MeshFile).
	StateDir string

	// Kube, when set, selects Kubernetes mode: the Istio config kinds are read from this API
	// server (ConfigDirs and the mesh config's configSources are ignored) and the mesh config
	// from the "istio" ConfigMap's "mesh" key in Namespace ("istio-<revision>" for a Revision
	// other than the default, as istiod), unless MeshFile is set, in which
	// case the file is the mesh config's source instead of the ConfigMap.
	Kube *rest.Config
	// Namespace is the control plane's namespace (Kubernetes mode): the mesh ConfigMap and the
	// status Lease live there; "istio-system" when empty.
	Namespace string
	// PodName is this replica's identity in the status Lease; the host name when empty.
	PodName string
	// Status leader election timings (Kubernetes mode); 15s, 10s and 2s when zero.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Revision is the control plane's revision (istio.io/rev); "default" when empty. In
	// Kubernetes mode the Gateway API status of another revision's objects is left to it, and a
	// revision other than the default elects its status writer with its own Lease,
	// StatusLease-<revision>.
	Revision string
	// ClusterID is this cluster's name, presented to upstream config sources (node metadata
	// CLUSTER_ID); "Kubernetes" when empty.
	ClusterID string
	// UpstreamSyncTimeout bounds how long the first state waits for the xds:// config sources
	// that neither answered nor have a saved state; upstream.DefaultSyncTimeout when zero.
	UpstreamSyncTimeout time.Duration
	// GatewayDeployment (Kubernetes mode) deploys the Envoy gateway of each Kubernetes Gateway of
	// Sailplane's classes, as istiod's gateway deployment controller (gatewaydeploy): written by
	// the replica holding the StatusLease. The flags default it to true.
	GatewayDeployment bool
	// GatewaySecrets (Kubernetes mode) reads Secrets and ConfigMaps, as istiod, so that the
	// Gateway API status finds a listener's (or BackendTLSPolicy's) certificate reference to a
	// missing or malformed one invalid; only each object's verdict is kept, never its data. Off,
	// references are taken as valid (the proxies' SDS reports what it cannot serve). The flags
	// default it to true.
	GatewaySecrets bool
	// WatchNamespace (Kubernetes mode), when set, is the one namespace read, so that Roles there
	// suffice: its Istio and Gateway API config. Off, each said once in the log, as they need
	// cluster-scoped reads: the namespace's labels, noticing Gateway API CRDs installed later,
	// the Gateway API status (GatewayClasses) and the gateway deployment controller.
	WatchNamespace string
}

// Deps are the service's collaborators.
type Deps struct {
	Logger    *slog.Logger
	Publisher bus.Publisher
	// Identity is the service's workload certificate, presented to xds:// config sources over
	// mutual TLS (tlsSettings.mode ISTIO_MUTUAL, the default); nil: such sources are refused.
	Identity workloadcert.Source
	// UpstreamDialOptions are added to every xds:// config source's consumer (tests).
	UpstreamDialOptions []bus.DialOption
	// MeterProvider receives sailplane_config_problems and, in Kubernetes mode,
	// pilot_k8s_cfg_events and sailplane_kube_watch_errors_total; the global provider when nil.
	MeterProvider metric.MeterProvider
}

// Service is config-ingest.
type Service struct {
	cfg   Config
	log   *slog.Logger
	pub   bus.Publisher // the local sources' layer of upstreams
	ready chan struct{} // files mode's first state published
	// upstreams reads the xds:// config sources and merges them with the local config.
	upstreams *upstream.Manager
	// allReady is closed once the local sources and the upstreams are ready.
	allReady chan struct{}
	kube     *kubesource.Source // Kubernetes mode; nil for files
	// gwStatus writes the Gateway API status (Kubernetes mode); gwLease elects its writer for a
	// revision other than the default (nil: the status Lease does).
	gwStatus *gatewaystatus.Writer
	gwLease  *gatewaystatus.Lease
	// tags are the revision's tags (Kubernetes mode).
	tags *revision.Tags
	// watchNamespace is Config.WatchNamespace: the Gateway API status writer does not run.
	watchNamespace string
	// deploy is the gateway deployment controller (Kubernetes mode, Config.GatewayDeployment).
	deploy *gatewaydeploy.Controller
	meter  metric.Meter

	mu           sync.Mutex
	treeProblems []error
	meshProblems []error
	netsProblem  error // files mode's meshNetworks file, when it cannot be used
	// busProblems are the resources the bus refused (too large), until published or removed.
	busProblems map[tree.Key]error
	// gwFiles is files mode's Gateway API status (gatewayStatus).
	gwFiles filesGateway
}

// New checks cfg and returns a Service; nothing is read before Run.
func New(cfg Config, deps Deps) (*Service, error) {
	if deps.Publisher == nil {
		return nil, errors.New("config-ingest: Deps.Publisher is required")
	}
	if deps.Logger == nil {
		deps.Logger = slog.Default()
	}
	if cfg.DefaultNamespace == "" {
		cfg.DefaultNamespace = "default"
	}
	if cfg.Debounce <= 0 {
		cfg.Debounce = 100 * time.Millisecond
	}
	if cfg.Settle <= 0 {
		cfg.Settle = tree.DefaultSettle
	}
	ups := upstream.New(upstream.Config{
		Namespace: cmp.Or(cfg.Namespace, kubesource.DefaultNamespace), PodName: cfg.PodName, ClusterID: cfg.ClusterID,
		Identity: deps.Identity, StateDir: cfg.StateDir, SyncTimeout: cfg.UpstreamSyncTimeout,
		Logger: deps.Logger.With("component", "upstream"), DialOptions: deps.UpstreamDialOptions,
	}, deps.Publisher)
	s := &Service{
		cfg: cfg, log: deps.Logger, pub: ups.Local(), ready: make(chan struct{}), busProblems: map[tree.Key]error{},
		meter:     telemetry.Meter(deps.MeterProvider, "sailplane.dev/config-ingest"),
		upstreams: ups, allReady: make(chan struct{}),
	}
	deps.Publisher = s.pub
	if cfg.Kube != nil {
		// A new leader re-checks every Gateway API object and Gateway: what changed meanwhile
		// was neither written nor deployed; a change of the namespaces in the mesh re-checks the
		// Gateways. (A revision other than the default elects its status writer on its own Lease.)
		onElected := func() {
			if s.gwLease == nil {
				s.gwStatus.Elected()
			}
			if s.deploy != nil {
				s.deploy.Elected()
			}
		}
		onSelection := func() {
			s.gwStatus.Changed()
			if s.deploy != nil {
				s.deploy.Elected()
			}
		}
		// The revision's tags (istio-revision-tag-<tag> webhooks) decide, with its name, which
		// config, status and gateways are this control plane's; a tag moving re-evaluates them.
		tagClient, err := kubernetes.NewForConfig(kube.WithRateLimits(cfg.Kube))
		if err != nil {
			return nil, fmt.Errorf("config-ingest: %w", err)
		}
		s.tags = revision.NewTags(tagClient, cfg.Revision, deps.Logger.With("component", "revision-tags"))
		s.tags.OnChange(func() {
			s.log.Info("revision tags changed", "revision", s.tags.Revision(), "names", s.tags.Mine())
			s.kube.RevisionChanged()
			s.gwStatus.Elected()
			s.gwStatus.Changed()
			if s.deploy != nil {
				s.deploy.Elected()
			}
		})
		src, err := kubesource.New(cfg.Kube, kubesource.Config{
			Revision: s.tags, MeshConfigMap: kubesource.MeshConfigMapName(cfg.Revision),
			Namespace: cfg.Namespace, Identity: cfg.PodName, MeshFile: cfg.MeshFile, Debounce: cfg.Debounce,
			LeaseDuration: cfg.LeaseDuration, RenewDeadline: cfg.RenewDeadline, RetryPeriod: cfg.RetryPeriod,
			StateDir: cfg.StateDir, MeterProvider: deps.MeterProvider, OnElected: onElected, OnSelection: onSelection,
			WatchNamespace: cfg.WatchNamespace,
		}, deps.Publisher, deps.Logger)
		if err != nil {
			return nil, fmt.Errorf("config-ingest: %w", err)
		}
		s.kube = src
		if cfg.WatchNamespace != "" {
			s.log.Info("watching one namespace: its namespace labels, GatewayClasses, Gateway API CRDs installed later (read after a restart), "+
				"the Gateway API status and the gateway deployment controller are off, as they need cluster-scoped reads", "namespace", cfg.WatchNamespace)
			cfg.GatewayDeployment = false
		}
		s.watchNamespace = cfg.WatchNamespace
		if cfg.GatewayDeployment {
			d, err := gatewaydeploy.New(kube.WithRateLimits(cfg.Kube), gatewaydeploy.Config{
				Namespace: cmp.Or(cfg.Namespace, kubesource.DefaultNamespace), Leader: src.Leader,
				Selected: src.Selected, Ready: src.Ready(), Owner: s.tags,
				// The Gateway status follows the generated Service's address and Deployment.
				OnOwnedChange: func() { s.gwStatus.Changed() },
				Logger:        deps.Logger.With("component", "gateway-deploy"),
			})
			if err != nil {
				return nil, fmt.Errorf("config-ingest: %w", err)
			}
			s.deploy = d
		}
		gwLog := deps.Logger.With("component", "gateway-status")
		leader := src.Leader
		if rev := cmp.Or(cfg.Revision, gatewaystatus.DefaultRevision); rev != gatewaystatus.DefaultRevision {
			// Another revision's replicas elect their own writer, as istiod's per-revision
			// election: sharing the status Lease, one revision would starve the other.
			kc, err := kubernetes.NewForConfig(kube.WithRateLimits(cfg.Kube))
			if err != nil {
				return nil, fmt.Errorf("config-ingest: %w", err)
			}
			identity := cfg.PodName
			if identity == "" {
				if identity, err = os.Hostname(); err != nil {
					return nil, fmt.Errorf("config-ingest: leader election identity: %w", err)
				}
			}
			s.gwLease = gatewaystatus.NewLease(kc, cmp.Or(cfg.Namespace, kubesource.DefaultNamespace), gatewaystatus.LeaseName(StatusLease, rev), identity,
				cmp.Or(cfg.LeaseDuration, 15*time.Second), cmp.Or(cfg.RenewDeadline, 10*time.Second), cmp.Or(cfg.RetryPeriod, 2*time.Second),
				gwLog, func() { s.gwStatus.Elected() })
			leader = s.gwLease.Leader
		}
		var serviceReady func(ns, name string) (bool, bool)
		var invalidParameters func(ns, name string) error
		if s.deploy != nil {
			serviceReady, invalidParameters = s.deploy.ServiceReady, s.deploy.Problem
		}
		s.gwStatus, err = gatewaystatus.New(cfg.Kube, gatewaystatus.Config{
			Translate: gatewayapi.Translate, Leader: leader, Revision: cfg.Revision, ServiceReady: serviceReady, Selected: src.Selected, Owner: s.tags,
			Credentials: cfg.GatewaySecrets, InvalidParameters: invalidParameters,
			Logger: gwLog, MeterProvider: deps.MeterProvider,
		})
		if err != nil {
			return nil, fmt.Errorf("config-ingest: %w", err)
		}
	}
	return s, nil
}

// StatusLeader reports whether this replica writes validation errors to the resources' status
// (Kubernetes mode, holding the StatusLease).
func (s *Service) StatusLeader() bool { return s.kube != nil && s.kube.Leader() }

// PublishedTypes are the bus types config-ingest publishes: every config kind (Istio's and the
// Gateway API's), MeshConfig, and (Kubernetes mode) the mesh's namespaces with their labels.
func PublishedTypes() []string {
	types := []string{schema.MeshConfig.TypeURL, schema.Namespace.TypeURL}
	for _, k := range schema.ConfigKinds {
		types = append(types, k.TypeURL)
	}
	return types
}

// Ready is closed once the first full state of every kind (and the mesh config) was published,
// with what each xds:// config source sent (or saved), or UpstreamSyncTimeout passed.
func (s *Service) Ready() <-chan struct{} { return s.allReady }

func (s *Service) localReady() <-chan struct{} {
	if s.kube != nil {
		return s.kube.Ready()
	}
	return s.ready
}

// Problems returns the current problems: unreadable or invalid documents (as *config.Error),
// duplicates (wrapping ErrDuplicate), folders, files and symlinks that cannot be read (wrapping
// ErrUnreadable), files held back as possible writes in progress (ErrSettling, ErrEmpty), a mesh
// file that failed to reload, unsupported config sources, resources the bus refused (*config.Error
// wrapping *bus.TooLargeError). In Kubernetes mode: invalid resources (*config.Error), an unusable
// mesh ConfigMap (ErrMeshConfigMap), the API server unreachable or a kind not listable (ErrKubernetes).
//
// With xds:// config sources, also: a source not read (*upstream.SourceError, e.g. wrapping
// upstream.ErrTLS), an invalid resource it sent (*config.Error whose File is the source's
// address), a resource shadowed by a source that comes first (*upstream.ConflictError, wrapping
// upstream.ErrConflict).
func (s *Service) Problems() []error {
	return append(s.localProblems(), s.upstreams.Problems()...)
}

func (s *Service) localProblems() []error {
	if s.kube != nil {
		return s.kube.Problems()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Clone(s.meshProblems)
	if s.netsProblem != nil {
		out = append(out, s.netsProblem)
	}
	out = append(out, s.treeProblems...)
	for _, k := range slices.SortedFunc(maps.Keys(s.busProblems), func(a, b tree.Key) int {
		return cmp.Or(strings.Compare(a.TypeURL, b.TypeURL), strings.Compare(a.Name, b.Name))
	}) {
		out = append(out, s.busProblems[k])
	}
	return out
}

// Run loads the mesh config and the config folders, publishes them, then follows changes until
// ctx is done. It fails only when the mesh file cannot be loaded at start and no mesh config was
// saved for it in StateDir by a previous run (*MeshFileError, as CheckMesh says beforehand), or
// when the folders cannot be watched at all.
//
// In Kubernetes mode it publishes once the informers have synced and follows the API server,
// riding out its outages (nothing is deleted while it is unreachable); it fails only when a
// MeshFile cannot be loaded at start.
func (s *Service) Run(ctx context.Context) error {
	stop := s.countProblems()
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Go(func() {
		if err := s.upstreams.Run(ctx); err != nil {
			s.log.Error("upstream config sources stopped", "error", err)
		}
	})
	wg.Go(func() {
		for _, ch := range []<-chan struct{}{s.localReady(), s.upstreams.Ready()} {
			select {
			case <-ch:
			case <-ctx.Done():
				return
			}
		}
		close(s.allReady)
	})
	if s.kube != nil {
		wg.Go(func() {
			// The status is computed over the namespaces the source selects, known once it
			// has synced (Selected admits every namespace before).
			select {
			case <-s.kube.Ready():
			case <-ctx.Done():
				return
			}
			if s.watchNamespace != "" {
				return // GatewayClasses and Namespaces are cluster-scoped (logged in New)
			}
			if err := s.gwStatus.Run(ctx); err != nil {
				s.log.Error("Gateway API status writer stopped", "error", err)
			}
		})
		if s.gwLease != nil {
			wg.Go(func() { s.gwLease.Run(ctx) })
		}
		// The tags are read before the config, so that the first full state is already the
		// revision's own.
		wg.Go(func() { _ = s.tags.Run(ctx) })
		select {
		case <-s.tags.Synced():
		case <-ctx.Done():
			return nil
		}
		if s.deploy != nil {
			wg.Go(func() {
				if err := s.deploy.Run(ctx); err != nil {
					s.log.Error("gateway deployment controller stopped", "error", err)
				}
			})
		}
		return s.kube.Run(ctx)
	}
	return s.runFiles(ctx)
}

// published reports what the bus refused of a publish of resources (of t's files; t is nil for
// the mesh config): each refused resource is logged with its file and kept as a problem until
// it is published or removed, while the bus keeps serving its previous version.
func (s *Service) published(t *tree.Tree, typeURL string, resources []*bus.Resource, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range resources {
		delete(s.busProblems, tree.Key{TypeURL: typeURL, Name: r.Name})
	}
	if err == nil {
		return
	}
	for _, e := range flatten(err) {
		var tooLarge *bus.TooLargeError
		if !errors.As(e, &tooLarge) {
			s.log.Error("config not published", "type", typeURL, "error", e)
			continue
		}
		k := tree.Key{TypeURL: typeURL, Name: tooLarge.Name}
		problem := &config.Error{Name: tooLarge.Name, Err: e}
		if kind, ok := schema.ByTypeURL(typeURL); ok {
			problem.Kind = kind.Kind
			problem.Namespace, problem.Name = schema.SplitName(tooLarge.Name)
			if kind.ClusterScoped {
				problem.Namespace, problem.Name = "", tooLarge.Name
			}
		}
		if t != nil {
			if c, ok := t.Published()[k]; ok {
				problem.File, problem.Doc = c.Source.File, c.Source.Doc
			}
		}
		s.busProblems[k] = problem
		s.log.Error("config not published: too large for the bus; its previous version, if any, stays served",
			"file", problem.File, "doc", problem.Doc, "kind", problem.Kind, "name", tooLarge.Name,
			"bytes", tooLarge.Size, "limit", tooLarge.Limit)
	}
}

// forget drops the bus problems of removed resources.
func (s *Service) forget(typeURL string, names []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range names {
		delete(s.busProblems, tree.Key{TypeURL: typeURL, Name: n})
	}
}

// flatten lists the errors joined in err.
func flatten(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

func meshResource(m *meshv1alpha1.MeshConfig) *bus.Resource {
	return &bus.Resource{Name: "mesh", Body: m}
}
