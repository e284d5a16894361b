// Package dialin merges the registries that remote endpoint-watchers publish by dialing in
// (bus.DialOut, --publish-to) into this endpoint-watcher's registry, as remote Kubernetes
// clusters are merged: a service in several clusters is one service, the union of their ports
// and the endpoints of every cluster.
package dialin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"

	"google.golang.org/protobuf/proto"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/spiffe"
)

// Types are the registry types a remote publishes.
var Types = []string{schema.Service.TypeURL, schema.Endpoints.TypeURL}

// Merger publishes, per type and name, the merge of its layers: the local registry (layer "")
// first, then each remote cluster in cluster ID order.
type Merger struct {
	out    bus.Publisher
	mu     sync.Mutex
	layers map[string]map[string]map[string]*bus.Resource // layer -> type -> name
}

// NewMerger returns a Merger publishing into out.
func NewMerger(out bus.Publisher) *Merger {
	return &Merger{out: out, layers: map[string]map[string]map[string]*bus.Resource{}}
}

// Layer is the Publisher of one layer: "" for the local registries, else a cluster ID.
func (m *Merger) Layer(id string) bus.Publisher { return layer{m, id} }

type layer struct {
	m  *Merger
	id string
}

func (l layer) Upsert(typeURL string, resources ...*bus.Resource) error {
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	byName := l.m.typeOf(l.id, typeURL)
	names := make([]string, 0, len(resources))
	for _, r := range resources {
		byName[r.Name] = r
		names = append(names, r.Name)
	}
	return l.m.publish(typeURL, names)
}

func (l layer) Delete(typeURL string, names ...string) {
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	byName := l.m.typeOf(l.id, typeURL)
	for _, n := range names {
		delete(byName, n)
	}
	_ = l.m.publish(typeURL, names) // deleting publishes merges of fewer parts: never too large alone
}

func (l layer) Replace(typeURL string, resources []*bus.Resource) error {
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	byName := l.m.typeOf(l.id, typeURL)
	names := slices.Collect(maps.Keys(byName))
	clear(byName)
	for _, r := range resources {
		byName[r.Name] = r
		names = append(names, r.Name)
	}
	return l.m.publish(typeURL, names)
}

func (m *Merger) typeOf(id, typeURL string) map[string]*bus.Resource {
	if m.layers[id] == nil {
		m.layers[id] = map[string]map[string]*bus.Resource{}
	}
	if m.layers[id][typeURL] == nil {
		m.layers[id][typeURL] = map[string]*bus.Resource{}
	}
	return m.layers[id][typeURL]
}

// publish republishes the merge of names.
func (m *Merger) publish(typeURL string, names []string) error {
	ids := slices.Sorted(maps.Keys(m.layers)) // "" (local) sorts first
	var upsert []*bus.Resource
	var gone []string
	for _, name := range slices.Compact(slices.Sorted(slices.Values(names))) {
		var parts []*bus.Resource
		for _, id := range ids {
			if r := m.layers[id][typeURL][name]; r != nil {
				parts = append(parts, r)
			}
		}
		switch len(parts) {
		case 0:
			gone = append(gone, name)
		case 1:
			upsert = append(upsert, parts[0])
		default:
			upsert = append(upsert, merge(parts))
		}
	}
	if len(gone) > 0 {
		m.out.Delete(typeURL, gone...)
	}
	if len(upsert) == 0 {
		return nil
	}
	return m.out.Upsert(typeURL, upsert...)
}

// merge is one service of several clusters: the first's Service with the ports of the others
// added, or the endpoints of every cluster.
func merge(parts []*bus.Resource) *bus.Resource {
	out := *parts[0]
	out.Version = "" // derived from the merged content
	switch first := parts[0].Body.(type) {
	case *discoveryv1.Service:
		svc := proto.CloneOf(first)
		for _, p := range parts[1:] {
			other, ok := p.Body.(*discoveryv1.Service)
			if !ok {
				continue
			}
			for _, port := range other.GetPorts() {
				if !slices.ContainsFunc(svc.Ports, func(q *discoveryv1.Port) bool { return q.GetName() == port.GetName() }) {
					svc.Ports = append(svc.Ports, port)
				}
			}
		}
		out.Body = svc
	case *discoveryv1.Endpoints:
		eps := proto.CloneOf(first)
		for _, p := range parts[1:] {
			if other, ok := p.Body.(*discoveryv1.Endpoints); ok {
				eps.Endpoints = append(eps.Endpoints, other.GetEndpoints()...)
			}
		}
		out.Body = eps
	}
	return &out
}

// ClusterError is a dialed-in resource claiming another cluster than its publisher's.
type ClusterError struct {
	Kind, Name, Field, Got, Want string
}

func (e *ClusterError) Error() string {
	return fmt.Sprintf("%s %s: %s is %q, but the dialed-in peer may publish cluster %q only", e.Kind, e.Name, e.Field, e.Got, e.Want)
}

// Accept returns the bus.AcceptFunc of dialed-in registries: the peer's identity is mapped to
// the one cluster it may publish (clusters: SPIFFE ID -> cluster ID); its registry is
// published as that cluster's layer of m. A stream's state replaces the cluster's previous one
// once complete: until a reconnected remote sent its full state, its last one stays.
func Accept(m *Merger, clusters map[spiffe.ID]string, log *slog.Logger) bus.AcceptFunc {
	return func(ctx context.Context, peer spiffe.ID, src bus.Source) {
		cluster, ok := clusters[peer]
		if !ok {
			log.Error("dialed-in registry refused: no cluster for its identity", "peer", peer.String())
			return
		}
		log.Info("dialed-in registry connected", "peer", peer.String(), "cluster", cluster)
		h := &handler{cluster: cluster, pub: m.Layer(cluster), log: log.With("cluster", cluster, "peer", peer.String()),
			staged: map[string]map[string]*bus.Resource{}}
		err := src.Subscribe(ctx, Types, h)
		if err != nil && !errors.Is(err, bus.ErrStreamEnded) {
			log.Error("dialed-in registry", "cluster", cluster, "err", err)
		}
		log.Info("dialed-in registry disconnected; its last state is kept until it reconnects", "cluster", cluster)
	}
}

// handler applies one stream of a remote's registry.
type handler struct {
	cluster string
	pub     bus.Publisher
	log     *slog.Logger
	synced  bool
	// staged is the stream's state until its first full state is in.
	staged map[string]map[string]*bus.Resource
}

func (h *handler) Apply(c bus.Change) error {
	for _, r := range c.Updated {
		if err := h.check(r); err != nil {
			h.log.Error("dialed-in resource refused", "kind", err.Kind, "name", err.Name, "field", err.Field,
				"got", err.Got, "want", err.Want)
			return err
		}
	}
	if !h.synced {
		byName := h.staged[c.TypeURL]
		if byName == nil {
			byName = map[string]*bus.Resource{}
			h.staged[c.TypeURL] = byName
		}
		for _, r := range c.Updated {
			byName[r.Name] = r
		}
		for _, n := range c.Removed {
			delete(byName, n)
		}
		return nil
	}
	if len(c.Removed) > 0 {
		h.pub.Delete(c.TypeURL, c.Removed...)
	}
	if len(c.Updated) > 0 {
		if err := h.pub.Upsert(c.TypeURL, c.Updated...); err != nil {
			h.log.Error("publishing dialed-in resources", "type", c.TypeURL, "err", err)
		}
	}
	return nil
}

func (h *handler) Synced() {
	for _, typ := range Types {
		if err := h.pub.Replace(typ, slices.Collect(maps.Values(h.staged[typ]))); err != nil {
			h.log.Error("publishing dialed-in resources", "type", typ, "err", err)
		}
	}
	h.staged = nil
	h.synced = true
	h.log.Info("dialed-in registry synced")
}

// check refuses a resource of another cluster than the peer's.
func (h *handler) check(r *bus.Resource) *ClusterError {
	switch b := r.Body.(type) {
	case *discoveryv1.Service:
		if b.GetClusterId() != h.cluster {
			return &ClusterError{"Service", r.Name, "cluster_id", b.GetClusterId(), h.cluster}
		}
	case *discoveryv1.Endpoints:
		for i, ep := range b.GetEndpoints() {
			if ep.GetClusterId() != h.cluster {
				return &ClusterError{"Endpoints", r.Name, fmt.Sprintf("endpoints[%d].cluster_id", i), ep.GetClusterId(), h.cluster}
			}
		}
	default:
		return &ClusterError{Kind: fmt.Sprintf("%T", r.Body), Name: r.Name, Field: "type", Got: "unexpected", Want: h.cluster}
	}
	return nil
}
