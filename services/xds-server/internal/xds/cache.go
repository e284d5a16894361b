package xds

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/shared/xdstype"
)

// ErrCacheInconsistent reports that one cache key was written with two different values: the
// key misses an input of the generator (see Scoper).
var ErrCacheInconsistent = errors.New("xds cache: one key, two values")

// entry is one encoded resource, shared by every connection that receives it.
type entry struct {
	name    string
	version string // hash of the encoding: equal content, equal version, on every replica
	any     *anypb.Any
	host    string // for endpoints: the hostname whose endpoints it reads

	// anyEnc is the encoded Any; sotwPrefix and deltaPrefix, followed by anyEnc, encode the
	// entry as an element of DiscoveryResponse.resources and DeltaDiscoveryResponse.resources.
	anyEnc, sotwPrefix, deltaPrefix []byte
}

// set is every resource of one type for one cache scope at one snapshot. Immutable.
type set struct {
	typeURL       string
	version       uint64 // snapshot Version it reflects
	configVersion uint64
	entries       map[string]*entry
	names         []string // sorted keys of entries

	// byHost indexes endpoint names by host, built on first use.
	byHostOnce sync.Once
	byHost     map[string][]string
}

// namesOfHosts lists, sorted, the entries reading the endpoints of hosts.
func (s *set) namesOfHosts(hosts map[string]struct{}) []string {
	s.byHostOnce.Do(func() {
		s.byHost = map[string][]string{}
		for _, n := range s.names {
			h := s.entries[n].host
			s.byHost[h] = append(s.byHost[h], n)
		}
	})
	var out []string
	for h := range hosts {
		out = append(out, s.byHost[h]...)
	}
	if len(hosts) > 1 {
		slices.Sort(out)
	}
	return out
}

// cache holds the latest set per (type, scope). The key's other inputs are the snapshot's
// ConfigVersion and, for endpoints, each host's EndpointsVersion: a set is reused while they
// are unchanged and patched per host when only endpoints changed.
type cache struct {
	log         *slog.Logger
	assert      bool
	onViolation func(error)

	mu    sync.Mutex
	slots map[slotKey]*slot
	// seen is the assertion mode's record of every key ever written.
	seen map[assertKey]string
}

type slotKey struct{ typeURL, scope string }

type slot struct {
	mu  sync.Mutex // one generation per slot at a time: the others wait and share it
	set *set
}

type assertKey struct {
	typeURL, scope, name string
	configVersion        uint64
	endpointsVersion     uint64
}

func newCache(log *slog.Logger, assert bool, onViolation func(error)) *cache {
	if onViolation == nil {
		onViolation = func(err error) { panic(err) }
	}
	return &cache{log: log, assert: assert, onViolation: onViolation, slots: map[slotKey]*slot{}, seen: map[assertKey]string{}}
}

func scopeOf(gen Generator, snap *model.Snapshot, p *model.Proxy, typeURL string) string {
	if s, ok := gen.(Scoper); ok {
		return "s:" + s.CacheScope(snap, p, typeURL)
	}
	return "p:" + p.NodeID
}

// get returns the set of typeURL for proxy at snap, generating only what changed.
func (c *cache) get(gen Generator, snap *model.Snapshot, p *model.Proxy, typeURL string) (*set, error) {
	scope := scopeOf(gen, snap, p, typeURL)
	c.mu.Lock()
	sl := c.slots[slotKey{typeURL, scope}]
	if sl == nil {
		sl = &slot{}
		c.slots[slotKey{typeURL, scope}] = sl
	}
	c.mu.Unlock()

	sl.mu.Lock()
	defer sl.mu.Unlock()
	cur := sl.set
	switch {
	case c.assert:
		// Always regenerate and compare with what the key held before.
	case cur != nil && cur.version >= snap.Version:
		return cur, nil
	case cur != nil && cur.configVersion == snap.ConfigVersion && typeURL != resourcev3.EndpointType &&
		(typeURL != xdstype.NameTable || !namedEndpointsSince(snap, cur.version)):
		sl.set = &set{typeURL: cur.typeURL, version: snap.Version, configVersion: cur.configVersion,
			entries: cur.entries, names: cur.names}
		return sl.set, nil
	case cur != nil && cur.configVersion == snap.ConfigVersion:
		next, err := c.patchEndpoints(gen, snap, p, cur, scope)
		if err != nil {
			return nil, err
		}
		sl.set = next
		return next, nil
	}
	next, err := c.generate(gen, snap, p, typeURL, scope, nil)
	if err != nil {
		return nil, err
	}
	next.version, next.configVersion = snap.Version, snap.ConfigVersion
	sl.set = next
	return next, nil
}

// namedEndpointsSince reports whether the endpoints of a service the name table answers with
// its endpoints changed after snapshot version v.
func namedEndpointsSince(snap *model.Snapshot, v uint64) bool {
	for _, svc := range snap.Services {
		if svc.EndpointsVersion > v && model.NamesEndpoints(svc.Spec) {
			return true
		}
	}
	return false
}

// patchEndpoints regenerates only the load assignments of hosts whose endpoints changed.
func (c *cache) patchEndpoints(gen Generator, snap *model.Snapshot, p *model.Proxy, cur *set, scope string) (*set, error) {
	var names []string
	for name, e := range cur.entries {
		svc := snap.Services[e.host]
		if e.host == "" || svc == nil || svc.EndpointsVersion > cur.version {
			names = append(names, name)
		}
	}
	next := &set{typeURL: cur.typeURL, version: snap.Version, configVersion: cur.configVersion, entries: cur.entries, names: cur.names}
	if len(names) == 0 {
		return next, nil
	}
	slices.Sort(names)
	fresh, err := c.generate(gen, snap, p, cur.typeURL, scope, names)
	if err != nil {
		return nil, err
	}
	next.entries = make(map[string]*entry, len(cur.entries))
	for n, e := range cur.entries {
		next.entries[n] = e
	}
	for _, n := range names {
		if e, ok := fresh.entries[n]; ok {
			next.entries[n] = e
		} else {
			delete(next.entries, n)
		}
	}
	next.names = sortedKeys(next.entries)
	return next, nil
}

var marshalOpts = proto.MarshalOptions{Deterministic: true}

func (c *cache) generate(gen Generator, snap *model.Snapshot, p *model.Proxy, typeURL, scope string, names []string) (*set, error) {
	res, err := gen.Generate(snap, p, typeURL, names)
	if errors.Is(err, ErrUnsupported) {
		res, err = nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("generating %s for %s: %w", typeURL, p.NodeID, err)
	}
	out := &set{typeURL: typeURL, entries: make(map[string]*entry, len(res))}
	for _, r := range res {
		e, err := encode(typeURL, r)
		if err != nil {
			// One resource that cannot be encoded (invalid UTF-8 from config) is dropped alone.
			c.log.Warn("dropping unencodable resource", "type", typeURL, "err", err)
			continue
		}
		if typeURL == resourcev3.EndpointType {
			e.host = hostOfCluster(e.name)
		}
		out.entries[e.name] = e
		if c.assert {
			c.check(assertKey{typeURL: typeURL, scope: scope, name: e.name, configVersion: snap.ConfigVersion,
				endpointsVersion: endpointsInput(snap, typeURL, e.host)}, e.version)
		}
	}
	out.names = sortedKeys(out.entries)
	return out, nil
}

// endpointsInput is the endpoints version a resource depends on: its host's for load
// assignments, none for other types.
func endpointsInput(snap *model.Snapshot, typeURL, host string) uint64 {
	if typeURL == xdstype.NameTable {
		return snap.Version // headless services' endpoints: only this snapshot is the same input
	}
	if typeURL != resourcev3.EndpointType {
		return 0
	}
	if svc := snap.Services[host]; host != "" && svc != nil {
		return svc.EndpointsVersion
	}
	return snap.Version // unknown dependency: only this snapshot is the same input
}

func (c *cache) check(k assertKey, version string) {
	c.mu.Lock()
	old, ok := c.seen[k]
	if !ok {
		c.seen[k] = version
	}
	c.mu.Unlock()
	if ok && old != version {
		err := fmt.Errorf("%w: %s %q scope %q config %d endpoints %d: %s then %s", ErrCacheInconsistent,
			k.typeURL, k.name, k.scope, k.configVersion, k.endpointsVersion, old, version)
		c.log.Error("cache assertion failed", "err", err)
		c.onViolation(err)
	}
}

func encode(typeURL string, r types.Resource) (*entry, error) {
	b, err := marshalOpts.Marshal(r)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(b)
	return newEntry(cachev3.GetResourceName(r), hex.EncodeToString(sum[:8]), typeURL, b), nil
}

// newEntry encodes, once, the resource as both responses carry it (see preparedResponse): its
// Any, shared by reference, behind a per-protocol prefix. The Any's Value points into it.
func newEntry(name, version, typeURL string, value []byte) *entry {
	var anyEnc []byte
	if typeURL != "" {
		anyEnc = protowire.AppendTag(anyEnc, anyTypeURLField, protowire.BytesType)
		anyEnc = protowire.AppendString(anyEnc, typeURL)
	}
	head := len(anyEnc)
	if len(value) > 0 {
		anyEnc = protowire.AppendTag(anyEnc, anyValueField, protowire.BytesType)
		anyEnc = protowire.AppendVarint(anyEnc, uint64(len(value)))
		head = len(anyEnc)
		anyEnc = append(anyEnc, value...)
	}
	e := &entry{name: name, version: version, anyEnc: anyEnc,
		any: &anypb.Any{TypeUrl: typeURL, Value: anyEnc[head:len(anyEnc):len(anyEnc)]}}
	e.sotwPrefix = protowire.AppendTag(nil, sotwResourcesField, protowire.BytesType)
	e.sotwPrefix = protowire.AppendVarint(e.sotwPrefix, uint64(len(anyEnc)))
	// Delta: Resource{name: 3, version: 1, resource: 2 (last, so the Any follows)}.
	var meta []byte
	if name != "" {
		meta = protowire.AppendTag(meta, 3, protowire.BytesType)
		meta = protowire.AppendString(meta, name)
	}
	if version != "" {
		meta = protowire.AppendTag(meta, 1, protowire.BytesType)
		meta = protowire.AppendString(meta, version)
	}
	meta = protowire.AppendTag(meta, resourceAnyField, protowire.BytesType)
	meta = protowire.AppendVarint(meta, uint64(len(anyEnc)))
	e.deltaPrefix = protowire.AppendTag(nil, deltaResourcesField, protowire.BytesType)
	e.deltaPrefix = protowire.AppendVarint(e.deltaPrefix, uint64(len(meta)+len(anyEnc)))
	e.deltaPrefix = append(e.deltaPrefix, meta...)
	return e
}

// versionOf names a list of entries, for state-of-the-world version_info.
func versionOf(es []*entry) string {
	h := sha256.New()
	// One buffer for every entry: a thousand EDS entries were three thousand allocations.
	buf := make([]byte, 0, 256)
	for _, e := range es {
		buf = strconv.AppendInt(buf[:0], int64(len(e.name)), 10)
		buf = append(append(buf, e.name...), e.version...)
		h.Write(buf)
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}
