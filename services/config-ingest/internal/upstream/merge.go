// Package upstream reads config from other control planes (configSources entries
// xds://HOST:PORT: istiod, or another Sailplane's config-ingest) and merges it with the local
// config (files or Kubernetes) before it reaches the bus.
package upstream

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"

	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
)

// Local names the layer of config-ingest's own sources (the config folders, or Kubernetes).
const Local = "local"

// ErrConflict marks a resource defined by several sources: the one of the source that comes
// first (local sources, then configSources order) is served, the others are not.
var ErrConflict = errors.New("defined by another source that takes precedence")

// ConflictError is a resource of Source not served because Winner defines it too.
type ConflictError struct {
	Kind, Name     string // Name is the bus name, namespace/name
	Source, Winner string // layer names: Local or an xds:// address
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("%s %s from %s is not served: %v (%s); local sources come first, then configSources in order",
		e.Kind, e.Name, describe(e.Source), ErrConflict, describe(e.Winner))
}

func (e *ConflictError) Unwrap() error { return ErrConflict }

func describe(layer string) string {
	if layer == Local {
		return "the local config"
	}
	return layer
}

// Merger publishes, for each resource key (type and name), the version of the layer that comes
// first: Local, then the upstreams in their configured order. Each layer publishes through its
// own bus.Publisher, as if it were alone on the bus.
type Merger struct {
	out      bus.Publisher
	log      *slog.Logger
	onMesh   func(*meshv1alpha1.MeshConfig)
	onChange func(layer string)

	mu        sync.Mutex
	order     []string                                       // Local first
	layers    map[string]map[string]map[string]*bus.Resource // layer → type → name
	published map[string]map[string]*bus.Resource            // type → name → what out holds
	conflicts map[conflictKey]string                         // reported conflicts: the winner
}

type conflictKey struct{ typ, name, loser string }

// NewMerger returns a Merger publishing to out. onMesh is called with every mesh config the
// local layer publishes (it carries configSources), onChange after every change of a layer
// other than Local; both are called with the Merger's lock held and must not call it back.
func NewMerger(out bus.Publisher, log *slog.Logger, onMesh func(*meshv1alpha1.MeshConfig), onChange func(layer string)) *Merger {
	return &Merger{
		out: out, log: log, onMesh: onMesh, onChange: onChange,
		order:     []string{Local},
		layers:    map[string]map[string]map[string]*bus.Resource{},
		published: map[string]map[string]*bus.Resource{},
		conflicts: map[conflictKey]string{},
	}
}

// Publisher is the bus.Publisher of one layer.
func (m *Merger) Publisher(layer string) bus.Publisher { return &layerPublisher{m: m, layer: layer} }

// SetOrder sets the upstream layers, by precedence (after Local). The resources of a layer not
// listed are dropped: where another layer defines them, its version is served instead.
func (m *Merger) SetOrder(upstreams []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.order = append([]string{Local}, upstreams...)
	for layer := range m.layers {
		if !slices.Contains(m.order, layer) {
			m.removeLayerLocked(layer)
		}
	}
	for typ := range m.allTypesLocked() {
		m.recomputeLocked(typ, m.namesLocked(typ))
	}
}

// Layers lists the layers holding something.
func (m *Merger) Layers() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Sorted(maps.Keys(m.layers))
}

// Snapshot returns what a layer holds, by type.
func (m *Merger) Snapshot(layer string) map[string][]*bus.Resource {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string][]*bus.Resource{}
	for typ, rs := range m.layers[layer] {
		out[typ] = slices.SortedFunc(maps.Values(rs), func(a, b *bus.Resource) int { return strings.Compare(a.Name, b.Name) })
	}
	return out
}

// Get returns a layer's version of a resource, nil when it has none.
func (m *Merger) Get(layer, typ, name string) *bus.Resource {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.layers[layer][typ][name]
}

// Conflicts returns the resources not served because a source that comes first defines them
// too (*ConflictError), sorted.
func (m *Merger) Conflicts() []error {
	m.mu.Lock()
	defer m.mu.Unlock()
	keys := slices.SortedFunc(maps.Keys(m.conflicts), func(a, b conflictKey) int {
		return cmp.Or(strings.Compare(a.typ, b.typ), strings.Compare(a.name, b.name), strings.Compare(a.loser, b.loser))
	})
	out := make([]error, 0, len(keys))
	for _, k := range keys {
		out = append(out, &ConflictError{Kind: kindName(k.typ), Name: k.name, Source: k.loser, Winner: m.conflicts[k]})
	}
	return out
}

func kindName(typ string) string {
	if k, ok := schema.ByTypeURL(typ); ok {
		return k.Kind
	}
	return typ
}

func (m *Merger) removeLayerLocked(layer string) {
	types := m.layers[layer]
	delete(m.layers, layer)
	for typ, rs := range types {
		m.recomputeLocked(typ, slices.Collect(maps.Keys(rs)))
	}
}

func (m *Merger) allTypesLocked() map[string]bool {
	out := map[string]bool{}
	for _, types := range m.layers {
		for typ := range types {
			out[typ] = true
		}
	}
	for typ := range m.published {
		out[typ] = true
	}
	return out
}

// namesLocked is every name of typ held by a layer or published.
func (m *Merger) namesLocked(typ string) []string {
	names := map[string]bool{}
	for _, types := range m.layers {
		for n := range types[typ] {
			names[n] = true
		}
	}
	for n := range m.published[typ] {
		names[n] = true
	}
	return slices.Collect(maps.Keys(names))
}

// winnerLocked returns the version of the first layer holding typ/name.
func (m *Merger) winnerLocked(typ, name string) (*bus.Resource, string) {
	for _, layer := range m.order {
		if r := m.layers[layer][typ][name]; r != nil {
			return r, layer
		}
	}
	return nil, ""
}

// recomputeLocked publishes the winners of names, and reports each new conflict once.
func (m *Merger) recomputeLocked(typ string, names []string) error {
	slices.Sort(names)
	var ups []*bus.Resource
	var dels []string
	pub := m.published[typ]
	if pub == nil {
		pub = map[string]*bus.Resource{}
		m.published[typ] = pub
	}
	for _, n := range names {
		w, wl := m.winnerLocked(typ, n)
		m.noteConflictsLocked(typ, n, wl)
		switch cur := pub[n]; {
		case w == nil && cur != nil:
			delete(pub, n)
			dels = append(dels, n)
		case w != nil && w != cur:
			pub[n] = w
			ups = append(ups, w)
		}
	}
	if len(dels) > 0 {
		m.out.Delete(typ, dels...)
	}
	if len(ups) > 0 {
		return m.out.Upsert(typ, ups...)
	}
	return nil
}

func (m *Merger) noteConflictsLocked(typ, name, winner string) {
	for _, layer := range m.order {
		k := conflictKey{typ, name, layer}
		if layer == winner || winner == "" || m.layers[layer][typ][name] == nil {
			delete(m.conflicts, k)
			continue
		}
		if m.conflicts[k] == winner {
			continue // reported already
		}
		m.conflicts[k] = winner
		m.log.Warn("config conflict: a resource defined by several sources is served from the first",
			"kind", kindName(typ), "name", name, "source", describe(layer), "served-from", describe(winner))
	}
	// Layers no longer configured hold nothing, but their reports may remain.
	for k := range m.conflicts {
		if k.typ == typ && k.name == name && !slices.Contains(m.order, k.loser) {
			delete(m.conflicts, k)
		}
	}
}

type layerPublisher struct {
	m     *Merger
	layer string
}

var _ bus.Publisher = (*layerPublisher)(nil)

func (p *layerPublisher) types() map[string]map[string]*bus.Resource {
	types := p.m.layers[p.layer]
	if types == nil {
		types = map[string]map[string]*bus.Resource{}
		p.m.layers[p.layer] = types
	}
	return types
}

func (p *layerPublisher) changed() {
	if p.layer != Local && p.m.onChange != nil {
		p.m.onChange(p.layer)
	}
}

// mesh passes the local mesh config through: it has no upstream counterpart.
func (p *layerPublisher) mesh(typ string, rs []*bus.Resource) (bool, error) {
	if typ != schema.MeshConfig.TypeURL {
		return false, nil
	}
	if p.layer != Local {
		return true, nil
	}
	err := p.m.out.Replace(typ, rs)
	for _, r := range rs {
		if mc, ok := r.Body.(*meshv1alpha1.MeshConfig); ok && p.m.onMesh != nil {
			p.m.onMesh(mc)
		}
	}
	return true, err
}

func (p *layerPublisher) Upsert(typ string, rs ...*bus.Resource) error {
	p.m.mu.Lock()
	defer p.m.mu.Unlock()
	if ok, err := p.mesh(typ, rs); ok {
		return err
	}
	byName := p.types()[typ]
	if byName == nil {
		byName = map[string]*bus.Resource{}
		p.types()[typ] = byName
	}
	names := make([]string, 0, len(rs))
	for _, r := range rs {
		byName[r.Name] = r
		names = append(names, r.Name)
	}
	defer p.changed()
	return p.m.recomputeLocked(typ, names)
}

func (p *layerPublisher) Delete(typ string, names ...string) {
	p.m.mu.Lock()
	defer p.m.mu.Unlock()
	if typ == schema.MeshConfig.TypeURL {
		return
	}
	for _, n := range names {
		delete(p.types()[typ], n)
	}
	defer p.changed()
	_ = p.m.recomputeLocked(typ, names) // deletions are never refused
}

func (p *layerPublisher) Replace(typ string, rs []*bus.Resource) error {
	p.m.mu.Lock()
	defer p.m.mu.Unlock()
	if ok, err := p.mesh(typ, rs); ok {
		return err
	}
	old := p.types()[typ]
	byName := make(map[string]*bus.Resource, len(rs))
	for _, r := range rs {
		byName[r.Name] = r
	}
	p.types()[typ] = byName
	defer p.changed()
	if p.layer == Local {
		// The local sources' full state: replaced as a whole on the bus too, so that a type
		// gets its (possibly empty) first state even when no resource changed.
		names := nameSet(p.m.namesLocked(typ))
		for n := range old {
			names[n] = true
		}
		winners := make([]*bus.Resource, 0, len(names))
		pub := map[string]*bus.Resource{}
		for _, n := range slices.Sorted(maps.Keys(names)) {
			w, wl := p.m.winnerLocked(typ, n)
			p.m.noteConflictsLocked(typ, n, wl)
			if w != nil {
				winners = append(winners, w)
				pub[n] = w
			}
		}
		p.m.published[typ] = pub
		return p.m.out.Replace(typ, winners)
	}
	names := slices.Collect(maps.Keys(byName))
	for n := range old {
		if _, ok := byName[n]; !ok {
			names = append(names, n)
		}
	}
	return p.m.recomputeLocked(typ, names)
}

func nameSet(names []string) map[string]bool {
	out := make(map[string]bool, len(names))
	for _, n := range names {
		out[n] = true
	}
	return out
}
