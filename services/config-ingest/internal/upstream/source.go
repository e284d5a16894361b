package upstream

import (
	"cmp"
	"context"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"

	networking "istio.io/api/networking/v1alpha3"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/config"
	gwvalidation "sailplane.dev/shared/gatewayapi/validation"
	"sailplane.dev/shared/schema"
)

// source is one upstream: a bus subscription to its every config type, published in its layer.
type source struct {
	address string
	client  bus.Source
	pub     bus.Publisher
	held    func(typ, name string) *bus.Resource // what the layer holds (restored or received)
	log     *slog.Logger
	synced  chan struct{}

	mu      sync.Mutex
	seen    map[string]bool         // types whose first full state arrived
	invalid map[key][]*config.Error // resources refused, keeping their last valid version
	self    string                  // this config-ingest's instance ID, stamped in PathAnnotation
	cycles  map[key]bool            // resources dropped as having passed through self already
}

type key struct{ typ, name string }

func newSource(address, self string, client bus.Source, pub bus.Publisher, held func(typ, name string) *bus.Resource, log *slog.Logger) *source {
	return &source{
		address: address, self: self, client: client, pub: pub, held: held, log: log, synced: make(chan struct{}),
		seen: map[string]bool{}, invalid: map[key][]*config.Error{}, cycles: map[key]bool{},
	}
}

// Types are the bus types read from an upstream: every config kind config-ingest reads. The
// mesh config is not: the local one is the mesh's.
func Types() []string { return schema.TypeURLs(schema.ConfigKinds) }

func (s *source) run(ctx context.Context) error {
	return s.client.Subscribe(ctx, Types(), s)
}

// Apply takes one change of the upstream. The first of a type is its full state (the bus
// consumer starts empty): it replaces what the layer held, restored from the saved state, so
// resources the upstream deleted while config-ingest was down go only now. Never an error: a
// NACK would hold back every other resource of the type; an invalid resource keeps its last
// valid version and is reported instead.
func (s *source) Apply(c bus.Change) error {
	kind, ok := schema.ByTypeURL(c.TypeURL)
	if !ok {
		return nil
	}
	s.mu.Lock()
	first := !s.seen[kind.TypeURL]
	s.seen[kind.TypeURL] = true
	s.mu.Unlock()

	var accepted []*bus.Resource
	var cycled []string
	for _, r := range c.Updated {
		if onPath(r, s.self) {
			// It came from here: serving it back would keep it alive after its deletion here.
			s.cycle(kind, r.Name)
			cycled = append(cycled, r.Name)
			continue
		}
		if kind.TypeURL == schema.ServiceEntry.TypeURL && synthetic(r) {
			// istiod adds a ServiceEntry for each of its Kubernetes services; the registry
			// (endpoint-watcher) has those services already.
			s.drop(kind.TypeURL, r.Name)
			continue
		}
		own, err := s.validate(kind, r)
		if err != nil {
			if prev := s.held(kind.TypeURL, r.Name); prev != nil && first {
				accepted = append(accepted, prev)
			}
			continue
		}
		s.drop(kind.TypeURL, r.Name)
		accepted = append(accepted, stamp(own, s.self))
	}
	for _, n := range c.Removed {
		s.drop(kind.TypeURL, n)
	}
	if !first && len(cycled) > 0 {
		s.pub.Delete(kind.TypeURL, cycled...) // a version that had not passed here may be held
	}
	if first {
		return s.report(kind, s.pub.Replace(kind.TypeURL, accepted))
	}
	if len(c.Removed) > 0 {
		s.pub.Delete(kind.TypeURL, c.Removed...)
	}
	if len(accepted) > 0 {
		return s.report(kind, s.pub.Upsert(kind.TypeURL, accepted...))
	}
	return nil
}

// report logs what the bus refused (too large): its previous version stays served.
func (s *source) report(kind schema.Kind, err error) error {
	if err != nil {
		s.log.Error("upstream config not published", "source", s.address, "kind", kind.Kind, "error", err)
	}
	return nil
}

func (s *source) Synced() {
	s.log.Info("upstream config source synced: its first full state is served", "source", s.address)
	close(s.synced)
}

// validate checks r as a file's resource is checked, and returns the version to publish: the
// Gateway API kinds with their CRD's defaults set, as the API server stores them. The version is
// left to the Store (from the content): two upstreams may use the same version strings, and a
// switch from one to the other must reach the consumers.
func (s *source) validate(kind schema.Kind, r *bus.Resource) (*bus.Resource, error) {
	c := config.FromResource(kind, r)
	_, err := config.Validate(c)
	if err == nil && kind.Group == schema.GatewayAPIGroup {
		c, err = gwvalidation.Validate(c)
	}
	if err == nil {
		own := c.Resource()
		own.Trace = r.Trace
		return own, nil
	}
	// The source stands where a file would: each error names it, then the resource and field.
	errs := config.Errors(err)
	for _, e := range errs {
		e.File, e.Kind, e.Namespace, e.Name = s.address, kind.Kind, c.Namespace, c.Name
	}
	s.mu.Lock()
	_, known := s.invalid[key{kind.TypeURL, r.Name}]
	s.invalid[key{kind.TypeURL, r.Name}] = errs
	s.mu.Unlock()
	if !known {
		s.log.Warn("invalid upstream config: its last valid version, if any, stays served", "source", s.address,
			"kind", kind.Kind, "name", r.Name, "error", err)
	}
	return nil, err
}

func (s *source) drop(typ, name string) {
	s.mu.Lock()
	delete(s.invalid, key{typ, name})
	delete(s.cycles, key{typ, name})
	s.mu.Unlock()
}

// cycle records a resource dropped as a cycle, logged once.
func (s *source) cycle(kind schema.Kind, name string) {
	s.mu.Lock()
	delete(s.invalid, key{kind.TypeURL, name})
	known := s.cycles[key{kind.TypeURL, name}]
	s.cycles[key{kind.TypeURL, name}] = true
	s.mu.Unlock()
	if !known {
		s.log.Warn("config source cycle: a resource that passed through this config-ingest came back from an upstream; it is not served from it",
			"source", s.address, "kind", kind.Kind, "name", name)
	}
}

// problems returns the invalid resources, sorted.
func (s *source) problems() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := slices.SortedFunc(maps.Keys(s.invalid), func(a, b key) int {
		return cmp.Or(strings.Compare(a.typ, b.typ), strings.Compare(a.name, b.name))
	})
	out := make([]error, 0, len(keys))
	for _, k := range keys {
		for _, e := range s.invalid[k] {
			out = append(out, e)
		}
	}
	cycles := slices.SortedFunc(maps.Keys(s.cycles), func(a, b key) int {
		return cmp.Or(strings.Compare(a.typ, b.typ), strings.Compare(a.name, b.name))
	})
	for _, k := range cycles {
		out = append(out, &CycleError{Kind: kindName(k.typ), Name: k.name, Source: s.address})
	}
	return out
}

// synthetic reports whether r is one of the ServiceEntries istiod's api generator makes of a
// Kubernetes service: named synthetic-<service>, its one host <service>.<namespace>.svc.<domain>.
func synthetic(r *bus.Resource) bool {
	ns, name := schema.SplitName(r.Name)
	svc, ok := strings.CutPrefix(name, "synthetic-")
	se, isSE := r.Body.(*networking.ServiceEntry)
	if !ok || !isSE || len(se.GetHosts()) != 1 {
		return false
	}
	return strings.HasPrefix(se.GetHosts()[0], svc+"."+ns+".svc.")
}
