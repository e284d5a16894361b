package bus

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"
	"google.golang.org/protobuf/proto"

	"sailplane.dev/shared/grpcserver"
	"sailplane.dev/shared/schema"
)

// StoreOption configures a Store.
type StoreOption func(*Store)

// WithLogger sets the Store's logger.
func WithLogger(l *slog.Logger) StoreOption {
	return func(s *Store) {
		if l != nil {
			s.log = l
		}
	}
}

// WithMeterProvider sets where the Store, the transports serving it and its in-process
// consumers report their metrics (default: the global provider).
func WithMeterProvider(p metric.MeterProvider) StoreOption {
	return func(s *Store) { s.meterProvider = p }
}

// Size limits of one resource, measured as its wire encoding (the MCP envelope: metadata and
// body). A resource over its limit is refused with a *TooLargeError and its previous version, if
// any, stays published, so one oversized resource never reaches a consumer's receive limit.
const (
	// MaxResourceBytes is the default limit: the Kubernetes API server's limit for one object
	// (etcd's 1.5 MiB request limit), so config a cluster accepts is accepted on the bus.
	MaxResourceBytes = 1536 << 10
	// MaxEndpointsBytes is the limit of schema.Endpoints, which gathers every endpoint of one
	// host (a Service of 20,000 labelled pods is about 8 MiB).
	MaxEndpointsBytes = 64 << 20
)

// WithMaxResourceBytes sets the size limit of one resource of the given types or, when none is
// given, the default limit of every type without a limit of its own.
func WithMaxResourceBytes(n int, typeURLs ...string) StoreOption {
	return func(s *Store) {
		if len(typeURLs) == 0 {
			s.maxBytes = n
		}
		for _, t := range typeURLs {
			s.maxBytesOf[canonicalType(t)] = n
		}
	}
}

// TooLargeError is a resource the Store refused because its encoding is over its type's limit.
type TooLargeError struct {
	TypeURL, Name string
	Size, Limit   int
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("bus: %s %s not published: %d bytes encoded, over the limit of %d bytes per resource",
		e.TypeURL, e.Name, e.Size, e.Limit)
}

// Rejection is a consumer's NACK of one version of one resource.
type Rejection struct {
	Consumer string
	TypeURL  string
	Name     string
	Version  string
	Err      string
	At       time.Time
}

// maxRejections bounds the rejection history: a consumer NACKing in a loop must not grow memory.
const maxRejections = 1024

// Store holds a producer's resources and fans changes out to subscribers. It is safe for
// concurrent use. Publishing hands a Resource over to the Store: callers must not modify it
// afterwards. When a Resource's Version is empty the Store stores a copy with the Version filled
// in from a hash of its content, so the caller's struct is never modified.
type Store struct {
	log           *slog.Logger
	maxBytes      int
	maxBytesOf    map[string]int // by canonical type URL
	meterProvider metric.MeterProvider
	metrics       storeMetrics

	mu       sync.RWMutex
	kinds    map[string]*kindState            // by canonical type URL
	watchers map[string]map[*watcher]struct{} // by canonical type URL

	rejMu      sync.Mutex
	rejections []Rejection

	// holds gates consumers' first view of a type until its producer's initial state is whole.
	holdMu sync.Mutex
	holds  map[string][]<-chan struct{} // by canonical type URL
}

var _ Publisher = (*Store)(nil)

// kindState is the state of one type.
type kindState struct {
	entries map[string]*entry
	// version counts the changes of this type; state-of-the-world responses carry it.
	version uint64
}

// entry is one stored version of a resource, with its wire encoding computed at most once and
// shared by every gRPC consumer.
type entry struct {
	res *Resource
	enc encoding
}

// NewStore returns an empty Store.
func NewStore(opts ...StoreOption) *Store {
	s := &Store{
		log:        slog.New(slog.DiscardHandler),
		maxBytes:   MaxResourceBytes,
		maxBytesOf: map[string]int{schema.Endpoints.TypeURL: MaxEndpointsBytes},
		kinds:      map[string]*kindState{},
		watchers:   map[string]map[*watcher]struct{}{},
	}
	for _, o := range opts {
		o(s)
	}
	s.metrics = newStoreMetrics(s.meterProvider)
	return s
}

// canonicalType maps the legacy spellings of a known kind's type URL to the one the Store keys
// by, so producers and consumers may use either.
func canonicalType(typeURL string) string {
	if k, ok := schema.ByTypeURL(typeURL); ok {
		return k.TypeURL
	}
	return typeURL
}

// Upsert adds or replaces resources of one type. A resource whose version equals the stored
// one is ignored. Resources over the size limit are refused (the error joins a *TooLargeError
// for each) and keep their previous version; the others are stored.
func (s *Store) Upsert(typeURL string, resources ...*Resource) error {
	typ := canonicalType(typeURL)
	prepared, _, err := s.prepare(typ, resources)
	if len(prepared) == 0 {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ks := s.kind(typ)
	var changed []string
	for _, r := range prepared {
		if old, ok := ks.entries[r.Name]; ok && old.res.Version == r.Version {
			continue
		}
		ks.entries[r.Name] = &entry{res: r}
		changed = append(changed, r.Name)
	}
	s.changedLocked(typ, ks, changed)
	return err
}

// Delete removes resources of one type by name; unknown names are ignored.
func (s *Store) Delete(typeURL string, names ...string) {
	typ := canonicalType(typeURL)
	s.mu.Lock()
	defer s.mu.Unlock()
	ks := s.kinds[typ]
	if ks == nil {
		return
	}
	var changed []string
	for _, n := range names {
		if _, ok := ks.entries[n]; ok {
			delete(ks.entries, n)
			changed = append(changed, n)
		}
	}
	s.changedLocked(typ, ks, changed)
}

// Replace sets the whole state of one type: what is not in resources is deleted. Resources over
// the size limit are refused as in Upsert and keep their previous version.
func (s *Store) Replace(typeURL string, resources []*Resource) error {
	typ := canonicalType(typeURL)
	prepared, refused, err := s.prepare(typ, resources)
	s.mu.Lock()
	defer s.mu.Unlock()
	ks := s.kind(typ)
	keep := make(map[string]struct{}, len(prepared)+len(refused))
	for _, n := range refused {
		keep[n] = struct{}{}
	}
	var changed []string
	for _, r := range prepared {
		keep[r.Name] = struct{}{}
		if old, ok := ks.entries[r.Name]; ok && old.res.Version == r.Version {
			continue
		}
		ks.entries[r.Name] = &entry{res: r}
		changed = append(changed, r.Name)
	}
	for n := range ks.entries {
		if _, ok := keep[n]; !ok {
			delete(ks.entries, n)
			changed = append(changed, n)
		}
	}
	s.changedLocked(typ, ks, changed)
	return err
}

// Get returns the stored resource, which the caller must not modify.
func (s *Store) Get(typeURL, name string) (*Resource, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	ks := s.kinds[canonicalType(typeURL)]
	if ks == nil {
		return nil, false
	}
	e, ok := ks.entries[name]
	if !ok {
		return nil, false
	}
	return e.res, true
}

// List returns the stored resources of one type sorted by name; the caller must not modify them.
func (s *Store) List(typeURL string) []*Resource {
	entries, _ := s.snapshot(canonicalType(typeURL))
	out := make([]*Resource, len(entries))
	for i, e := range entries {
		out[i] = e.res
	}
	return out
}

// Rejections returns the NACKs consumers sent, oldest first (the most recent 1024).
func (s *Store) Rejections() []Rejection {
	s.rejMu.Lock()
	defer s.rejMu.Unlock()
	return slices.Clone(s.rejections)
}

// reject records and logs a consumer's NACK. What a gRPC consumer sent (its node ID, its error
// text) is bounded first: it could otherwise flood the log and, 1,024 times over, memory.
func (s *Store) reject(r Rejection) {
	if r.At.IsZero() {
		r.At = time.Now()
	}
	r.Consumer, r.Err = grpcserver.ClientText(r.Consumer), grpcserver.ClientText(r.Err)
	s.log.Warn("bus: consumer rejected resource", "consumer", r.Consumer, "type", r.TypeURL,
		"name", r.Name, "version", r.Version, "err", r.Err)
	s.rejMu.Lock()
	defer s.rejMu.Unlock()
	if len(s.rejections) >= maxRejections {
		s.rejections = slices.Delete(s.rejections, 0, len(s.rejections)-maxRejections+1)
	}
	s.rejections = append(s.rejections, r)
}

func (s *Store) kind(typ string) *kindState {
	ks := s.kinds[typ]
	if ks == nil {
		ks = &kindState{entries: map[string]*entry{}}
		s.kinds[typ] = ks
	}
	return ks
}

// changedLocked bumps the type's version and marks the names dirty for every watcher of the
// type. Marking never blocks, so a slow consumer cannot stall the producer.
func (s *Store) changedLocked(typ string, ks *kindState, names []string) {
	s.metrics.resources.Record(context.Background(), int64(len(ks.entries)), typeAttr(typ))
	if len(names) == 0 {
		return
	}
	ks.version++
	now := time.Now()
	for w := range s.watchers[typ] {
		w.mark(typ, names, now)
	}
}

// snapshot returns the entries of a type sorted by name and the type's version.
func (s *Store) snapshot(typ string) ([]*entry, uint64) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.snapshotLocked(typ)
}

func (s *Store) snapshotLocked(typ string) ([]*entry, uint64) {
	ks := s.kinds[typ]
	if ks == nil {
		return nil, 0
	}
	out := slices.Collect(maps.Values(ks.entries))
	slices.SortFunc(out, func(a, b *entry) int {
		switch {
		case a.res.Name < b.res.Name:
			return -1
		case a.res.Name > b.res.Name:
			return 1
		}
		return 0
	})
	return out, ks.version
}

// lookup returns the current entries for names; names that do not exist are returned in
// missing.
func (s *Store) lookup(typ string, names map[string]struct{}) (found []*entry, missing []string) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	ks := s.kinds[typ]
	for n := range names {
		var e *entry
		if ks != nil {
			e = ks.entries[n]
		}
		if e == nil {
			missing = append(missing, n)
		} else {
			found = append(found, e)
		}
	}
	return found, missing
}

// SyncAfter holds every consumer's first view of the given types until ready is closed. A
// producer that fills the Store after consumers may already be subscribed calls it first, so no
// consumer reaches "synced" on an empty or partial state. Types never held are served at once.
func (s *Store) SyncAfter(ready <-chan struct{}, typeURLs ...string) {
	s.holdMu.Lock()
	defer s.holdMu.Unlock()
	if s.holds == nil {
		s.holds = map[string][]<-chan struct{}{}
	}
	for _, t := range typeURLs {
		typ := canonicalType(t)
		s.holds[typ] = append(s.holds[typ], ready)
	}
}

// WaitSynced blocks until every producer that holds any type (SyncAfter) is ready, or ctx ends
// (its error then); a hold added while it waits is waited on too. With no holds it returns at
// once: the bus serves what it has. The bus server's health service says SERVING after it.
func (s *Store) WaitSynced(ctx context.Context) error {
	waited := 0
	for {
		s.holdMu.Lock()
		var holds []<-chan struct{}
		for _, typeHolds := range s.holds {
			holds = append(holds, typeHolds...)
		}
		s.holdMu.Unlock()
		if len(holds) == waited {
			return nil
		}
		if err := waitClosed(ctx, holds); err != nil {
			return err
		}
		waited = len(holds)
	}
}

// waitSynced blocks until every producer holding typ is ready, or ctx ends.
func (s *Store) waitSynced(ctx context.Context, typ string) error {
	s.holdMu.Lock()
	holds := slices.Clone(s.holds[typ])
	s.holdMu.Unlock()
	return waitClosed(ctx, holds)
}

// waitClosed blocks until every channel of chans is closed, or ctx ends (its error then).
func waitClosed(ctx context.Context, chans []<-chan struct{}) error {
	for _, c := range chans {
		select {
		case <-c:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// watch waits until typ may be served (SyncAfter), then registers w for changes of typ and
// returns the type's current state, atomically, so no change is lost between the snapshot and
// the first notification.
func (s *Store) watch(ctx context.Context, w *watcher, typ string) ([]*entry, uint64, error) {
	if err := s.waitSynced(ctx, typ); err != nil {
		return nil, 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ws := s.watchers[typ]
	if ws == nil {
		ws = map[*watcher]struct{}{}
		s.watchers[typ] = ws
	}
	ws[w] = struct{}{}
	entries, version := s.snapshotLocked(typ)
	return entries, version, nil
}

// unwatch stops notifications of the given types to w.
func (s *Store) unwatch(w *watcher, types ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, typ := range types {
		if ws := s.watchers[typ]; ws != nil {
			delete(ws, w)
			if len(ws) == 0 {
				delete(s.watchers, typ)
			}
		}
	}
}

// watcher is one subscriber's pending work: the names changed per type since it last looked,
// when the first of them changed, and a 1-buffered channel signalling that there is some. The
// subscriber reads the current state of dirty names, so bursts of changes coalesce and the
// latest state wins.
type watcher struct {
	notify chan struct{}
	mu     sync.Mutex
	dirty  map[string]map[string]struct{}
	since  map[string]time.Time
}

func newWatcher() *watcher {
	return &watcher{notify: make(chan struct{}, 1), dirty: map[string]map[string]struct{}{}, since: map[string]time.Time{}}
}

func (w *watcher) mark(typ string, names []string, at time.Time) {
	w.mu.Lock()
	d := w.dirty[typ]
	if d == nil {
		d = make(map[string]struct{}, len(names))
		w.dirty[typ] = d
		w.since[typ] = at
	}
	for _, n := range names {
		d[n] = struct{}{}
	}
	w.mu.Unlock()
	select {
	case w.notify <- struct{}{}:
	default:
	}
}

// take returns and clears the dirty names, and when the first of each type's changed.
func (w *watcher) take() (dirty map[string]map[string]struct{}, since map[string]time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	dirty, since = w.dirty, w.since
	w.dirty, w.since = map[string]map[string]struct{}{}, map[string]time.Time{}
	return dirty, since
}

// prepare drops nil resources, fills empty versions (on copies) and refuses the resources over
// typ's size limit, returning their names and a *TooLargeError for each, joined.
func (s *Store) prepare(typ string, resources []*Resource) (ok []*Resource, refused []string, err error) {
	limit := s.maxBytes
	if n, found := s.maxBytesOf[typ]; found {
		limit = n
	}
	ok = make([]*Resource, 0, len(resources))
	var errs []error
	for _, r := range resources {
		if r == nil {
			continue
		}
		version, bodySize := r.Version, -1
		if version == "" {
			version, bodySize = contentVersion(r)
		}
		if size := wireSize(r, version, bodySize); size > limit {
			tooLarge := &TooLargeError{TypeURL: typ, Name: r.Name, Size: size, Limit: limit}
			s.log.Error("bus: resource refused, its previous version (if any) stays published",
				"type", typ, "name", r.Name, "bytes", size, "limit", limit)
			errs = append(errs, tooLarge)
			refused = append(refused, r.Name)
			continue
		}
		if version != r.Version {
			c := *r
			c.Version = version
			r = &c
		}
		ok = append(ok, r)
	}
	return ok, refused, errors.Join(errs...)
}

// ContentVersion is the version the Store gives a resource published without one: an FNV-64a
// hash of its body (deterministic protobuf encoding), labels and annotations.
func ContentVersion(r *Resource) string {
	v, _ := contentVersion(r)
	return v
}

// contentVersion returns ContentVersion and the size of the body's encoding (-1 when unknown).
func contentVersion(r *Resource) (version string, bodySize int) {
	h := fnv.New64a()
	bodySize = -1
	if r.Body != nil {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(r.Body)
		if err == nil {
			h.Write([]byte(r.Body.ProtoReflect().Descriptor().FullName()))
			h.Write([]byte{0})
			h.Write(b)
			bodySize = len(b)
		}
	}
	writeMap := func(tag byte, m map[string]string) {
		for _, k := range slices.Sorted(maps.Keys(m)) {
			h.Write([]byte{tag})
			h.Write([]byte(k))
			h.Write([]byte{0})
			h.Write([]byte(m[k]))
		}
	}
	writeMap(1, r.Labels)
	writeMap(2, r.Annotations)
	return strconv.FormatUint(h.Sum64(), 16), bodySize
}
