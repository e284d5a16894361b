package bus

import (
	"slices"
	"strconv"
	"strings"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
)

// DeltaAggregatedResources serves one delta ADS stream: any number of types, each wildcard or
// by name, resuming from initial_resource_versions.
func (srv *Server) DeltaAggregatedResources(stream grpc.BidiStreamingServer[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse]) error {
	ctx := stream.Context()
	ds := &deltaStream{srv: srv, stream: stream, w: newWatcher(), types: map[string]*deltaType{}}
	defer func() {
		for typ := range ds.types {
			srv.store.unwatch(ds.w, typ)
		}
	}()
	reqs := receive(ctx, stream.Recv)
	for {
		select {
		case <-ctx.Done():
			return nil
		case r := <-reqs:
			if r.err != nil {
				return nil // the client went away; nothing to report to it
			}
			if err := ds.handle(r.req); err != nil {
				return err
			}
		case <-ds.w.notify:
			dirty, since := ds.w.take()
			for typ, names := range dirty {
				dt := ds.types[typ]
				if dt == nil {
					continue
				}
				found, missing := srv.store.lookup(typ, names)
				if err := ds.send(dt, found, missing, false, since[typ]); err != nil {
					return err
				}
			}
		}
	}
}

type deltaStream struct {
	srv    *Server
	stream grpc.BidiStreamingServer[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse]
	w      *watcher
	nodeID string
	nonces nonces
	types  map[string]*deltaType // by canonical type URL
}

// deltaType is one subscribed type on a delta stream.
type deltaType struct {
	canonical string
	wireURL   string // the spelling the client asked for; responses use it
	wildcard  bool
	names     map[string]struct{}
	// sent is what the server believes the client holds (name -> version), updated when a
	// response is sent and rolled back on NACK.
	sent map[string]string
	// rejected versions are never sent again on this stream.
	rejected map[string]string
	pending  map[uint64]*deltaPending // by nonce
}

type deltaPending struct {
	updated []deltaSent
	removed []deltaSent
	// since is when the first change the response delivers was published (in the last part of
	// a split response only); zero for responses to the client's own requests.
	since time.Time
}

// deltaSent is one resource of a response: its version and what the client had before.
type deltaSent struct {
	name, version, prev string
	hadPrev             bool
}

func (dt *deltaType) subscribed(name string) bool {
	if dt.wildcard {
		return true
	}
	_, ok := dt.names[name]
	return ok
}

func (ds *deltaStream) handle(req *discoveryv3.DeltaDiscoveryRequest) error {
	if ds.nodeID == "" && req.GetNode() != nil {
		ds.nodeID = req.GetNode().GetId()
	}
	typ := canonicalType(req.GetTypeUrl())
	dt := ds.types[typ]
	if dt == nil {
		return ds.subscribe(req, typ)
	}
	if nonce := req.GetResponseNonce(); nonce != "" {
		ds.ack(dt, nonce, req.GetErrorDetail().GetMessage(), req.GetErrorDetail() != nil)
	}

	// Later subscription changes.
	added := map[string]struct{}{}
	wasWildcard := dt.wildcard
	for _, n := range req.GetResourceNamesSubscribe() {
		if n == "*" {
			dt.wildcard = true
			continue
		}
		if _, ok := dt.names[n]; !ok {
			dt.names[n] = struct{}{}
			added[n] = struct{}{}
		}
	}
	for _, n := range req.GetResourceNamesUnsubscribe() {
		if n == "*" {
			dt.wildcard = false
			continue
		}
		delete(dt.names, n)
		added[n] = struct{}{} // recheck below: still wanted only if wildcard
	}
	// The client drops what it no longer subscribes to; forget it so a resubscribe resends.
	for n := range dt.sent {
		if !dt.subscribed(n) {
			delete(dt.sent, n)
		}
	}
	if dt.wildcard && !wasWildcard {
		entries, _ := ds.srv.store.snapshot(typ)
		return ds.send(dt, entries, nil, false, time.Time{})
	}
	if len(added) > 0 {
		found, _ := ds.srv.store.lookup(typ, added)
		return ds.send(dt, found, nil, false, time.Time{})
	}
	return nil
}

// subscribe handles the first request of a type: it always gets a response, even empty, so the
// client knows the type's state (an unknown type simply has no resources).
func (ds *deltaStream) subscribe(req *discoveryv3.DeltaDiscoveryRequest, typ string) error {
	dt := &deltaType{
		canonical: typ,
		wireURL:   req.GetTypeUrl(),
		names:     map[string]struct{}{},
		sent:      map[string]string{},
		rejected:  map[string]string{},
		pending:   map[uint64]*deltaPending{},
	}
	subs := req.GetResourceNamesSubscribe()
	dt.wildcard = len(subs) == 0
	for _, n := range subs {
		if n == "*" {
			dt.wildcard = true
		} else {
			dt.names[n] = struct{}{}
		}
	}
	for n, v := range req.GetInitialResourceVersions() {
		if dt.subscribed(n) {
			dt.sent[n] = v
		}
	}
	ds.types[typ] = dt
	entries, _, err := ds.srv.store.watch(ds.stream.Context(), ds.w, typ)
	if err != nil {
		return err
	}
	if !dt.wildcard {
		entries = slices.DeleteFunc(entries, func(e *entry) bool { return !dt.subscribed(e.res.Name) })
	}
	// What the client has but the store no longer does is removed.
	present := make(map[string]struct{}, len(entries))
	for _, e := range entries {
		present[e.res.Name] = struct{}{}
	}
	var missing []string
	for n := range dt.sent {
		if _, ok := present[n]; !ok {
			missing = append(missing, n)
		}
	}
	return ds.send(dt, entries, missing, true, time.Time{})
}

// ack processes the client's answer to a response.
func (ds *deltaStream) ack(dt *deltaType, nonce, errMsg string, nack bool) {
	n, err := strconv.ParseUint(nonce, 10, 64)
	if err != nil {
		return
	}
	p := dt.pending[n]
	if p == nil {
		return
	}
	// Clients answer responses in order: anything older was answered, or never will be.
	for k, older := range dt.pending {
		if k <= n {
			ds.srv.store.metrics.delivered(dt.canonical, older.since)
			delete(dt.pending, k)
		}
	}
	if !nack {
		return
	}
	now := time.Now()
	for _, s := range p.updated {
		dt.rejected[s.name] = s.version
		ds.srv.store.reject(Rejection{Consumer: ds.nodeID, TypeURL: dt.canonical, Name: s.name,
			Version: s.version, Err: errMsg, At: now})
		// Roll back only if nothing newer was sent since.
		if dt.sent[s.name] == s.version {
			if s.hadPrev {
				dt.sent[s.name] = s.prev
			} else {
				delete(dt.sent, s.name)
			}
		}
	}
	for _, s := range p.removed {
		ds.srv.store.reject(Rejection{Consumer: ds.nodeID, TypeURL: dt.canonical, Name: s.name,
			Err: errMsg, At: now})
		if _, ok := dt.sent[s.name]; !ok {
			dt.sent[s.name] = s.prev
		}
	}
}

// maxResponseBytes bounds the resources of one delta response. A larger change goes in several
// responses (parts), each with its own nonce; a resource larger than the bound alone has a part
// of its own. With resources under MaxResourceBytes, every part fits gRPC's default 4 MiB
// receive limit.
const maxResponseBytes = 2 << 20

// partPrefix starts the system_version_info (a field the protocol leaves for debugging) of each
// part of a split response: "<prefix>i/n". A consumer counts a type as received only after its
// last part, so "synced" never follows a partial state.
const partPrefix = "sailplane-bus-part "

// moreParts reports whether a delta response is a part of a split response other than its last.
func moreParts(systemVersionInfo string) bool {
	rest, ok := strings.CutPrefix(systemVersionInfo, partPrefix)
	if !ok {
		return false
	}
	i, n, ok := strings.Cut(rest, "/")
	if !ok {
		return false
	}
	part, err1 := strconv.Atoi(i)
	parts, err2 := strconv.Atoi(n)
	return err1 == nil && err2 == nil && part < parts
}

// deltaItem is one resource update or removal of a response, with its encoded size.
type deltaItem struct {
	res  *discoveryv3.Resource // nil for a removal
	sent deltaSent
	size int
}

// send sends what the client lacks among found, and the removal of the missing names it holds,
// in parts of at most maxResponseBytes. Nothing is sent when there is no difference, unless
// always. since is when the first of the changes sent was published (zero: not a change).
func (ds *deltaStream) send(dt *deltaType, found []*entry, missing []string, always bool, since time.Time) error {
	updates := make([]deltaItem, 0, len(found))
	var removals []deltaItem
	for _, e := range found {
		r := e.res
		if !dt.subscribed(r.Name) {
			continue
		}
		prev, hadPrev := dt.sent[r.Name]
		if hadPrev && prev == r.Version {
			continue
		}
		if rej, ok := dt.rejected[r.Name]; ok && rej == r.Version {
			continue
		}
		enc, err := e.wire()
		if err != nil {
			ds.srv.log.Error("bus: cannot encode resource", "type", dt.canonical, "name", r.Name, "err", err)
			continue
		}
		updates = append(updates, deltaItem{res: enc.delta, size: enc.deltaSize,
			sent: deltaSent{name: r.Name, version: r.Version, prev: prev, hadPrev: hadPrev}})
	}
	for _, n := range missing {
		if prev, ok := dt.sent[n]; ok {
			removals = append(removals, deltaItem{size: lengthDelimited(len(n)),
				sent: deltaSent{name: n, prev: prev, hadPrev: true}})
		}
	}
	if !always && len(updates) == 0 && len(removals) == 0 {
		return nil
	}
	byName := func(a, b deltaItem) int { return strings.Compare(a.sent.name, b.sent.name) }
	slices.SortFunc(updates, byName)
	slices.SortFunc(removals, byName)

	parts := splitParts(append(updates, removals...))
	for i, part := range parts {
		resp := &discoveryv3.DeltaDiscoveryResponse{TypeUrl: dt.wireURL}
		if len(parts) > 1 {
			resp.SystemVersionInfo = partPrefix + strconv.Itoa(i+1) + "/" + strconv.Itoa(len(parts))
		}
		p := &deltaPending{updated: make([]deltaSent, 0, len(part))}
		resp.Resources = make([]*discoveryv3.Resource, 0, len(part))
		for _, it := range part {
			if it.res != nil {
				resp.Resources = append(resp.Resources, it.res)
				p.updated = append(p.updated, it.sent)
				dt.sent[it.sent.name] = it.sent.version
			} else {
				resp.RemovedResources = append(resp.RemovedResources, it.sent.name)
				p.removed = append(p.removed, it.sent)
				delete(dt.sent, it.sent.name)
			}
		}
		if i == len(parts)-1 {
			p.since = since
		}
		nonce := ds.nonces.next()
		resp.Nonce = strconv.FormatUint(nonce, 10)
		dt.pending[nonce] = p
		if err := ds.stream.Send(resp); err != nil {
			return err
		}
	}
	return nil
}

// splitParts cuts items into consecutive parts of at most maxResponseBytes each (an item larger
// than that alone in its part); no items make one empty part. Parts share items' array.
func splitParts(items []deltaItem) [][]deltaItem {
	var parts [][]deltaItem
	start, size := 0, 0
	for i, it := range items {
		if i > start && size+it.size > maxResponseBytes {
			parts = append(parts, items[start:i])
			start, size = i, 0
		}
		size += it.size
	}
	return append(parts, items[start:])
}
