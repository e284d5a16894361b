// Package model holds the xds-server's view of the mesh: the bus state it consumes (registry
// services and endpoints, Istio config) and immutable snapshots built from it.
package model

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
)

// DomainSuffix is the cluster domain short names resolve into.
const DomainSuffix = "cluster.local"

// ConfigKinds are the Istio config kinds the xds-server subscribes to.
var ConfigKinds = []schema.Kind{schema.VirtualService, schema.DestinationRule, schema.MeshConfig}

// RegistryKinds are the registry kinds the xds-server subscribes to.
var RegistryKinds = []schema.Kind{schema.Service, schema.Endpoints}

// TypeURLs lists the bus type URLs of kinds.
func TypeURLs(kinds []schema.Kind) []string {
	out := make([]string, len(kinds))
	for i, k := range kinds {
		out[i] = k.TypeURL
	}
	return out
}

// ErrRejected is wrapped by errors returned from Apply for changes the model cannot accept.
var ErrRejected = errors.New("change rejected")

// Config is one Istio config resource.
type Config[T proto.Message] struct {
	Namespace  string
	Name       string
	CreateTime time.Time
	Spec       T
}

// Service is a registry service with its endpoints.
type Service struct {
	Spec      *discoveryv1.Service
	Endpoints []*discoveryv1.Endpoint
}

// Snapshot is an immutable view of the mesh; nothing in it may be modified.
type Snapshot struct {
	// Services by hostname.
	Services map[string]*Service
	// VirtualServices and DestinationRules ordered by creation time, then namespace/name, which
	// is the precedence Istio applies when several bind the same host.
	VirtualServices  []Config[*networking.VirtualService]
	DestinationRules []Config[*networking.DestinationRule]
	Mesh             *meshv1alpha1.MeshConfig
}

// Hostnames returns the service hostnames, sorted.
func (s *Snapshot) Hostnames() []string {
	out := make([]string, 0, len(s.Services))
	for h := range s.Services {
		out = append(out, h)
	}
	slices.Sort(out)
	return out
}

// Store keeps the latest bus state. It is safe for concurrent use.
type Store struct {
	mu    sync.Mutex
	state map[string]map[string]*bus.Resource // type URL -> name -> resource
	// changed receives a token after every applied change; capacity 1 coalesces bursts.
	changed chan struct{}
}

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{state: map[string]map[string]*bus.Resource{}, changed: make(chan struct{}, 1)}
}

// Changed signals that the state changed since the last Snapshot was taken.
func (s *Store) Changed() <-chan struct{} { return s.changed }

// Handler returns a bus.Handler feeding this store; onSynced is called once when the
// subscription reached its first full state.
func (s *Store) Handler(onSynced func()) bus.Handler {
	return &handler{store: s, onSynced: onSynced}
}

type handler struct {
	store    *Store
	onSynced func()
	once     sync.Once
}

var _ bus.Handler = (*handler)(nil)

func (h *handler) Apply(c bus.Change) error { return h.store.apply(c) }

func (h *handler) Synced() {
	h.once.Do(func() {
		if h.onSynced != nil {
			h.onSynced()
		}
	})
}

func (s *Store) apply(c bus.Change) error {
	kind, ok := schema.ByTypeURL(c.TypeURL)
	if !ok {
		return fmt.Errorf("%w: unknown type %q", ErrRejected, c.TypeURL)
	}
	want := kind.New().ProtoReflect().Descriptor().FullName()
	// Check the whole change first so a bad resource leaves the last good state untouched.
	for _, r := range c.Updated {
		if r == nil || r.Body == nil {
			return fmt.Errorf("%w: %s: resource without body", ErrRejected, kind.Kind)
		}
		if got := r.Body.ProtoReflect().Descriptor().FullName(); got != want {
			return fmt.Errorf("%w: %s %q: body is %s, want %s", ErrRejected, kind.Kind, r.Name, got, want)
		}
	}
	s.mu.Lock()
	m := s.state[kind.TypeURL]
	if m == nil {
		m = map[string]*bus.Resource{}
		s.state[kind.TypeURL] = m
	}
	for _, name := range c.Removed {
		delete(m, name)
	}
	for _, r := range c.Updated {
		m[r.Name] = r
	}
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
	return nil
}

// Snapshot builds an immutable snapshot of the current state. Resources are shared, not copied:
// bus resources are immutable by contract.
func (s *Store) Snapshot() *Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	snap := &Snapshot{Services: map[string]*Service{}, Mesh: &meshv1alpha1.MeshConfig{}}

	// Several registries may publish one hostname in different namespaces; the first bus name
	// in order wins so the result does not depend on map iteration.
	for _, r := range sortedResources(s.state[schema.Service.TypeURL]) {
		svc := r.Body.(*discoveryv1.Service)
		if svc.GetHostname() == "" {
			continue
		}
		if _, dup := snap.Services[svc.GetHostname()]; dup {
			continue
		}
		snap.Services[svc.GetHostname()] = &Service{Spec: svc}
	}
	for _, r := range sortedResources(s.state[schema.Endpoints.TypeURL]) {
		eps := r.Body.(*discoveryv1.Endpoints)
		svc := snap.Services[eps.GetHostname()]
		if svc == nil || svc.Endpoints != nil || svc.Spec.GetNamespace() != eps.GetNamespace() {
			continue
		}
		svc.Endpoints = eps.GetEndpoints()
		if svc.Endpoints == nil {
			svc.Endpoints = []*discoveryv1.Endpoint{}
		}
	}
	snap.VirtualServices = configs[*networking.VirtualService](s.state[schema.VirtualService.TypeURL])
	snap.DestinationRules = configs[*networking.DestinationRule](s.state[schema.DestinationRule.TypeURL])
	for _, r := range s.state[schema.MeshConfig.TypeURL] {
		snap.Mesh = r.Body.(*meshv1alpha1.MeshConfig)
	}
	return snap
}

func sortedResources(m map[string]*bus.Resource) []*bus.Resource {
	out := make([]*bus.Resource, 0, len(m))
	for _, r := range m {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b *bus.Resource) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func configs[T proto.Message](m map[string]*bus.Resource) []Config[T] {
	out := make([]Config[T], 0, len(m))
	for _, r := range m {
		ns, name := schema.SplitName(r.Name)
		out = append(out, Config[T]{Namespace: ns, Name: name, CreateTime: r.CreateTime, Spec: r.Body.(T)})
	}
	slices.SortFunc(out, func(a, b Config[T]) int {
		if c := a.CreateTime.Compare(b.CreateTime); c != 0 {
			return c
		}
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	return out
}

// ResolveHost turns a host as written in config of namespace ns into the hostname services use:
// a short name without dots becomes "<name>.<ns>.svc.cluster.local", like Istio does.
func ResolveHost(host, ns string) string {
	if host == "" || strings.Contains(host, ".") || host == "*" || ns == "" {
		return host
	}
	return host + "." + ns + ".svc." + DomainSuffix
}

// HostMatches reports whether a config host (already resolved) selects hostname; "*.suffix"
// wildcards match any hostname ending in ".suffix".
func HostMatches(configHost, hostname string) bool {
	if configHost == hostname {
		return true
	}
	if configHost == "*" {
		return true
	}
	if suffix, ok := strings.CutPrefix(configHost, "*"); ok {
		return strings.HasSuffix(hostname, suffix)
	}
	return false
}
