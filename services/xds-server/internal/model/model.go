// Package model holds the xds-server's view of the mesh: the bus state it consumes (registry
// services and endpoints, Istio config) and immutable snapshots built from it.
package model

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	security "istio.io/api/security/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
)

// DomainSuffix is the cluster domain short names resolve into.
const DomainSuffix = "cluster.local"

// ConfigKinds are the Istio config kinds the xds-server subscribes to.
var ConfigKinds = append([]schema.Kind{schema.VirtualService, schema.DestinationRule, schema.Gateway, schema.Sidecar,
	schema.MeshConfig, schema.MeshNetworks, schema.AuthorizationPolicy, schema.RequestAuthentication, schema.PeerAuthentication,
	schema.ServiceEntry, schema.Namespace}, schema.GatewayAPI...)

// RegistryKinds are the registry kinds the xds-server subscribes to.
var RegistryKinds = []schema.Kind{schema.Service, schema.Endpoints}

// ErrRejected is wrapped by errors returned from Apply for changes the model cannot accept.
var ErrRejected = errors.New("change rejected")

// Config is one Istio config resource.
type Config[T proto.Message] struct {
	Namespace  string
	Name       string
	CreateTime time.Time
	Spec       T
	// GatewayAPI marks config translated from the Gateway API: its routes follow that API's
	// semantics (istiod's "route-semantics: gateway"), see translate.GatewaySemantics.
	GatewayAPI bool
}

// Service is a registry service with its endpoints.
type Service struct {
	Spec      *discoveryv1.Service
	Endpoints []*discoveryv1.Endpoint
	// EndpointsVersion is the Snapshot.Version in which Endpoints last changed; caches of
	// endpoint-derived output key on it.
	EndpointsVersion uint64
}

// Snapshot is an immutable view of the mesh; nothing in it may be modified.
type Snapshot struct {
	// Services by hostname. Where several namespaces publish one hostname (ServiceEntries),
	// the first by bus name; ForNamespace picks the one a namespace sees.
	Services map[string]*Service
	// VirtualServices and DestinationRules ordered by creation time, then namespace/name, which
	// is the precedence Istio applies when several bind the same host.
	VirtualServices  []Config[*networking.VirtualService]
	DestinationRules []Config[*networking.DestinationRule]
	Mesh             *meshv1alpha1.MeshConfig
	// Gateways and Sidecars, in the same order; only Envoy proxies use them.
	Gateways []Config[*networking.Gateway]
	Sidecars []Config[*networking.Sidecar]
	// AuthorizationPolicies and RequestAuthentications, in the same order; they apply to
	// the inbound side of the workloads they select.
	AuthorizationPolicies  []Config[*security.AuthorizationPolicy]
	RequestAuthentications []Config[*security.RequestAuthentication]
	// PeerAuthentications, in the same order: the oldest wins where several compete.
	PeerAuthentications []Config[*security.PeerAuthentication]
	// JWKS holds the keys fetched from RequestAuthentication jwksUris (see Store.SetJWKS),
	// by URI; a URI not fetched yet has no entry.
	JWKS map[string]string

	// MeshNetworks is Istio's meshNetworks; nil when not configured.
	MeshNetworks *meshv1alpha1.MeshNetworks

	// Version increases with every snapshot Store.Next builds (0 from Store.Snapshot);
	// successive snapshots share unchanged parts.
	Version uint64
	// ConfigVersion is the Version of the last snapshot in which anything but endpoints
	// changed: output that does not read endpoints is the same for equal ConfigVersions.
	ConfigVersion uint64

	// workloads indexes endpoints by address on first use; nil in snapshots built by hand.
	workloads *workloadIndex
	// drs indexes DestinationRules on first use (see Bindings); nil in snapshots built by hand.
	drs *drIndexOnce
	// networks indexes the east-west gateways on first use (see NetworkGateways).
	networks *networkGatewaysOnce
	// shadowed holds, by hostname, the services of other namespaces that Services' entry hides,
	// in bus name order.
	shadowed map[string][]*Service
}

type workloadIndex struct {
	once sync.Once
	byIP map[string][]*discoveryv1.Endpoint // in hostname, then endpoint order
}

// ProxyEndpoint is the registry's endpoint of the proxy's own workload, as istiod finds it: one
// at the proxy's IP, the one named after its pod when several workloads share the IP (host
// networking); nil when the registry has none.
func (s *Snapshot) ProxyEndpoint(p *Proxy) *discoveryv1.Endpoint {
	ix := s.workloads
	if ix == nil {
		ix = &workloadIndex{}
	}
	ix.once.Do(func() {
		ix.byIP = map[string][]*discoveryv1.Endpoint{}
		for _, h := range s.Hostnames() {
			for _, ep := range s.Services[h].Endpoints {
				ix.byIP[ep.GetAddress()] = append(ix.byIP[ep.GetAddress()], ep)
			}
		}
	})
	pod, _, _ := strings.Cut(p.ID, ".")
	var first *discoveryv1.Endpoint
	for _, ip := range p.IPs {
		for _, ep := range ix.byIP[ip] {
			if pod != "" && ep.GetWorkload() == pod {
				return ep
			}
			if first == nil {
				first = ep
			}
		}
	}
	return first
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

	// pending accumulates what changed since the last Next.
	pending Change
	current *Snapshot
	version uint64
	// epVersion is the Version at which each hostname's endpoints last changed.
	epVersion map[string]uint64
	// jwks are the fetched JWKS documents by URI.
	jwks map[string]string
	// gw holds the decoded Gateway API objects and their translation (see gatewayapi.go).
	gw gatewayAPIState
}

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{
		state:     map[string]map[string]*bus.Resource{},
		changed:   make(chan struct{}, 1),
		epVersion: map[string]uint64{},
	}
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
	if len(c.Updated) == 0 && len(c.Removed) == 0 {
		return nil
	}
	// ServiceEntries are read here only for GAMMA parentRefs (their services come from the
	// registry), namespaces only for listeners' allowedRoutes selectors: like Gateway API
	// objects, they are not changes of their own.
	gwAPI := isGatewayAPI(kind) || kind.TypeURL == schema.ServiceEntry.TypeURL || kind.TypeURL == schema.Namespace.TypeURL
	var decoded map[string]metav1.Object
	if isGatewayAPI(kind) {
		var err error
		if decoded, err = s.decodeGatewayAPIChange(kind, c); err != nil {
			return err
		}
	}
	s.mu.Lock()
	m := s.state[kind.TypeURL]
	if m == nil {
		m = map[string]*bus.Resource{}
		s.state[kind.TypeURL] = m
	}
	switch {
	case kind.TypeURL == schema.ServiceEntry.TypeURL, kind.TypeURL == schema.Namespace.TypeURL:
		// A namespace's labels decide which routes its listeners admit.
		s.gw.dirty = true
		if len(s.gw.objects) > 0 {
			s.pending.Full = true
			s.pending.seen()
		}
	case gwAPI:
		// Not recorded as such: Next records the generated config that changed instead.
		s.storeGatewayAPI(kind, decoded, c.Removed)
		s.pending.Full = true
		s.pending.seen()
	case kind.TypeURL == schema.Service.TypeURL:
		s.gw.dirty = true // backends and GAMMA parents are looked up among services
	case kind.TypeURL == schema.Endpoints.TypeURL && len(s.gw.selectorHosts) > 0:
		for _, r := range c.Updated {
			if s.gw.selectorHosts[r.Body.(*discoveryv1.Endpoints).GetHostname()] {
				s.gw.dirty, s.pending.Full = true, true
			}
		}
		for _, name := range c.Removed {
			if old := m[name]; old != nil && s.gw.selectorHosts[old.Body.(*discoveryv1.Endpoints).GetHostname()] {
				s.gw.dirty, s.pending.Full = true, true
			}
		}
	}
	for _, name := range c.Removed {
		if gwAPI {
			delete(m, name)
			continue
		}
		if old, ok := m[name]; ok {
			s.pending.record(kind, old, nil)
			s.recordListenerEndpoints(kind, name)
			delete(m, name)
		}
	}
	for _, r := range c.Updated {
		if gwAPI {
			m[r.Name] = r
			continue
		}
		s.pending.record(kind, m[r.Name], r)
		s.recordListenerEndpoints(kind, r.Name)
		m[r.Name] = r
	}
	if c.Trace.IsValid() {
		s.pending.addTrace(TracedChange{Span: c.Trace, At: time.Now()})
	}
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
	return nil
}

// recordListenerEndpoints records a change of the endpoints named name as a change of their
// service too when sidecars have listeners per endpoint of it (see ListensPerEndpoint): like
// istiod, which pushes everything for those, since more than EDS then depends on endpoints.
// Registries publish a service and its endpoints under one name. s.mu is held.
func (s *Store) recordListenerEndpoints(kind schema.Kind, name string) {
	if kind.TypeURL != schema.Endpoints.TypeURL {
		return
	}
	svc := s.state[schema.Service.TypeURL][name]
	if svc != nil && ListensPerEndpoint(svc.Body.(*discoveryv1.Service)) {
		s.pending.record(schema.Service, svc, svc)
	}
}

// JWKSKind names JWKS changes in Change.Configs (Name is the URI).
const JWKSKind = "JWKS"

// SetJWKS records the keys fetched from a jwksUri ("" forgets them); a change makes the next
// snapshot carry them and pushes the listeners that inline them.
func (s *Store) SetJWKS(uri, keys string) {
	s.mu.Lock()
	if old, ok := s.jwks[uri]; (ok && old == keys) || (!ok && keys == "") {
		s.mu.Unlock()
		return
	}
	if keys == "" {
		delete(s.jwks, uri)
	} else {
		if s.jwks == nil {
			s.jwks = map[string]string{}
		}
		s.jwks[uri] = keys
	}
	s.pending.Full = true
	s.pending.seen()
	s.pending.addConfig(ConfigKey{Kind: JWKSKind, Name: uri}, Visibility{All: true})
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// PendingFull reports whether the changes waiting for Next include more than endpoints.
func (s *Store) PendingFull() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pending.Full
}

// Next returns the latest snapshot and what changed since the previous call. With nothing
// pending it returns the current snapshot and an empty Change. An endpoints-only change builds
// the next snapshot by sharing everything but the changed services.
func (s *Store) Next() (*Snapshot, Change) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.current != nil && s.pending.Empty() {
		return s.current, Change{}
	}
	ch := s.pending
	s.pending = Change{}
	s.version++
	if s.current == nil {
		ch.Full = true
	}
	for h := range ch.Endpoints {
		s.epVersion[h] = s.version
	}
	var snap *Snapshot
	if ch.Full {
		snap = s.build()
		s.noteGatewayAPI(&ch, s.gw.out)
		snap.ConfigVersion = s.version
	} else {
		snap = s.patchEndpoints(ch.Endpoints)
		s.noteEndpointTLS(&ch, snap)
	}
	snap.Version = s.version
	ch.resolveHosts(s.current, snap)
	s.current = snap
	return snap, ch
}

// EndpointTLSKind names, in Change.Configs, a service whose endpoints changed what clusters
// read of them (Name is the hostname): the identities they present (mTLS SANs) or whether
// all are labelled in the mesh (proxyless auto mTLS).
const EndpointTLSKind = "EndpointTLS"

// noteEndpointTLS turns an endpoints-only change into a config change when it changes what
// clusters read of endpoints, so cached clusters, keyed on ConfigVersion, are rebuilt and
// pushed. Rare: identities and mesh labels seldom change as pods come and go.
func (s *Store) noteEndpointTLS(ch *Change, snap *Snapshot) {
	for h := range ch.Endpoints {
		// Every namespace's service of the hostname (see ForNamespace), in the same order in
		// both snapshots: an endpoints-only change keeps the services.
		olds := append([]*Service{s.current.Services[h]}, s.current.shadowed[h]...)
		curs := append([]*Service{snap.Services[h]}, snap.shadowed[h]...)
		for i, cur := range curs {
			if i >= len(olds) || olds[i] == nil || cur == nil || sameEndpointTLS(olds[i].Endpoints, cur.Endpoints) {
				continue
			}
			ch.Full = true
			key := ConfigKey{Kind: EndpointTLSKind, Namespace: cur.Spec.GetNamespace(), Name: h}
			ch.addConfig(key, ExportVisibility(cur.Spec.GetNamespace(), cur.Spec.GetExportTo()))
			ch.addHosts(key, HostSet{Hosts: []HostRef{{Namespace: cur.Spec.GetNamespace(), Hostname: h}}})
		}
	}
	if ch.Full {
		snap.ConfigVersion = s.version
	}
}

func sameEndpointTLS(a, b []*discoveryv1.Endpoint) bool {
	return EndpointsInMesh(a) == EndpointsInMesh(b) && slices.Equal(serviceAccounts(a), serviceAccounts(b))
}

// EndpointsInMesh reports whether there are endpoints and all are labelled in the mesh.
func EndpointsInMesh(eps []*discoveryv1.Endpoint) bool {
	for _, ep := range eps {
		if ep.GetLabels()[TLSModeLabel] != "istio" {
			return false
		}
	}
	return len(eps) > 0
}

func serviceAccounts(eps []*discoveryv1.Endpoint) []string {
	var out []string
	for _, ep := range eps {
		if sa := ep.GetServiceAccount(); sa != "" {
			out = append(out, sa)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Snapshot builds an immutable snapshot of the current state without consuming pending
// changes (for tools and tests; the server uses Next). Resources are shared, not copied: bus
// resources are immutable by contract.
func (s *Store) Snapshot() *Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.build()
}

func (s *Store) build() *Snapshot {
	snap := &Snapshot{Services: map[string]*Service{}, Mesh: &meshv1alpha1.MeshConfig{}, workloads: &workloadIndex{}, drs: &drIndexOnce{}, networks: &networkGatewaysOnce{}}

	// Several registries may publish one hostname in different namespaces; the first bus name
	// in order wins so the result does not depend on map iteration.
	for _, r := range sortedResources(s.state[schema.Service.TypeURL]) {
		svc := r.Body.(*discoveryv1.Service)
		if svc.GetHostname() == "" {
			continue
		}
		entry := &Service{Spec: svc, EndpointsVersion: s.epVersion[svc.GetHostname()]}
		if _, dup := snap.Services[svc.GetHostname()]; dup {
			if snap.shadowed == nil {
				snap.shadowed = map[string][]*Service{}
			}
			snap.shadowed[svc.GetHostname()] = append(snap.shadowed[svc.GetHostname()], entry)
			continue
		}
		snap.Services[svc.GetHostname()] = entry
	}
	for _, r := range sortedResources(s.state[schema.Endpoints.TypeURL]) {
		eps := r.Body.(*discoveryv1.Endpoints)
		for _, svc := range append([]*Service{snap.Services[eps.GetHostname()]}, snap.shadowed[eps.GetHostname()]...) {
			if svc == nil || svc.Endpoints != nil || svc.Spec.GetNamespace() != eps.GetNamespace() {
				continue
			}
			svc.Endpoints = eps.GetEndpoints()
			if svc.Endpoints == nil {
				svc.Endpoints = []*discoveryv1.Endpoint{}
			}
		}
	}
	snap.VirtualServices = configs[*networking.VirtualService](s.state[schema.VirtualService.TypeURL])
	snap.DestinationRules = configs[*networking.DestinationRule](s.state[schema.DestinationRule.TypeURL])
	snap.Gateways = configs[*networking.Gateway](s.state[schema.Gateway.TypeURL])
	snap.Sidecars = configs[*networking.Sidecar](s.state[schema.Sidecar.TypeURL])
	snap.AuthorizationPolicies = configs[*security.AuthorizationPolicy](s.state[schema.AuthorizationPolicy.TypeURL])
	snap.RequestAuthentications = configs[*security.RequestAuthentication](s.state[schema.RequestAuthentication.TypeURL])
	snap.PeerAuthentications = configs[*security.PeerAuthentication](s.state[schema.PeerAuthentication.TypeURL])
	snap.JWKS = maps.Clone(s.jwks)
	for _, r := range s.state[schema.MeshConfig.TypeURL] {
		snap.Mesh = r.Body.(*meshv1alpha1.MeshConfig)
	}
	for _, r := range s.state[schema.MeshNetworks.TypeURL] {
		snap.MeshNetworks = r.Body.(*meshv1alpha1.MeshNetworks)
	}
	withGatewayAPI(snap, s.gatewayAPIOutput(snap))
	return snap
}

// patchEndpoints derives the next snapshot from the current one, replacing only the services
// of hosts, with the same result build would give.
func (s *Store) patchEndpoints(hosts map[string]struct{}) *Snapshot {
	next := *s.current
	next.workloads = &workloadIndex{}
	next.Services = make(map[string]*Service, len(s.current.Services))
	for h, svc := range s.current.Services {
		next.Services[h] = svc
	}
	// The shadowed services of hosts change too; the map is shared with the current snapshot.
	next.shadowed = maps.Clone(s.current.shadowed)
	for h := range hosts {
		old := next.Services[h]
		if old == nil {
			continue
		}
		next.Services[h] = &Service{Spec: old.Spec, Endpoints: s.endpointsOf(old.Spec), EndpointsVersion: s.epVersion[h]}
		if sh := s.current.shadowed[h]; len(sh) > 0 {
			patched := make([]*Service, len(sh))
			for i, o := range sh {
				patched[i] = &Service{Spec: o.Spec, Endpoints: s.endpointsOf(o.Spec), EndpointsVersion: s.epVersion[h]}
			}
			next.shadowed[h] = patched
		}
	}
	return &next
}

// endpointsOf finds the endpoints build would attach to svc: the first Endpoints resource by
// bus name with the same hostname and namespace, normally named "<namespace>/<hostname>".
func (s *Store) endpointsOf(svc *discoveryv1.Service) []*discoveryv1.Endpoint {
	m := s.state[schema.Endpoints.TypeURL]
	match := func(r *bus.Resource) bool {
		eps := r.Body.(*discoveryv1.Endpoints)
		return eps.GetHostname() == svc.GetHostname() && eps.GetNamespace() == svc.GetNamespace()
	}
	var found *bus.Resource
	if r, ok := m[schema.Name(svc.GetNamespace(), svc.GetHostname())]; ok && match(r) {
		found = r
		// A differently named resource sorting before it would win in build; rare enough to
		// scan for only when names are not canonical.
		for name, o := range m {
			if name < found.Name && match(o) {
				found = o
			}
		}
	} else {
		for _, o := range sortedResources(m) {
			if match(o) {
				found = o
				break
			}
		}
	}
	if found == nil {
		return nil
	}
	eps := found.Body.(*discoveryv1.Endpoints).GetEndpoints()
	if eps == nil {
		eps = []*discoveryv1.Endpoint{}
	}
	return eps
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

// Resources are the bus resources of a type the store holds, by name (for debug endpoints).
func (s *Store) Resources(typeURL string) []*bus.Resource {
	s.mu.Lock()
	defer s.mu.Unlock()
	return sortedResources(s.state[typeURL])
}
