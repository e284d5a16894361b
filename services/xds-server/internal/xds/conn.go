package xds

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/shared/grpcserver"
)

// conn is one ADS stream.
type conn struct {
	s     *Server
	id    int64
	delta bool
	log   *slog.Logger
	// peer is the client's authenticated identity (certificate or token), "" without one.
	peer string
	// connectedAt is when the stream opened; address is the client's address.
	connectedAt time.Time
	address     string
	// ctx is the stream's context.
	ctx context.Context

	proxy *model.Proxy
	gen   Generator

	// send sends a *preparedResponse (grpc.ServerStream.SendMsg): the server's gRPC codec
	// must be Codec().
	send func(any) error

	pushes chan *pushItem
	done   chan struct{}
	nonce  int
	// info is the stream as observers see it; its Proxy is set when the proxy identifies itself.
	info StreamInfo
	// pushing is the push being carried out, nil between pushes.
	pushing *PushRequest
	// building is when building the response being sent began.
	building time.Time

	// mu guards watches and their subscriptions against Push's affected check and the debug
	// types' readers; only the stream's goroutine writes.
	mu      sync.Mutex
	watches map[string]*watch

	// queries run on the stream's goroutine, which alone reads and writes the watches' client
	// state (config dumps).
	queries chan func()
	// debugNonces are the nonces of the last debug answers, by type: requests carrying them are
	// their ACKs.
	debugNonces map[string]string
	// debugNode is the node of a first request asking for a debug type, which identifies no
	// proxy, kept in case the stream later asks for proxy types.
	debugNode *corev3.Node

	// holdTimer wakes the stream (resume, nil before the first hold) when the earliest hold a
	// RequestGate put on one of its watches ends, at holdEnds (zero: not armed).
	holdTimer Timer
	resume    <-chan time.Time
	holdEnds  time.Time
}

// watch is the state of one type on one stream.
type watch struct {
	typeURL  string
	wildcard bool
	// sub is the names subscribed to, shared with the watches asking for the same.
	sub *subscription

	// client is what the client holds, name -> version, as far as we know.
	client clientState
	// nacked are versions the client rejected: not sent again until they change.
	nacked map[string]string
	// nackedVersion is the rejected state-of-the-world response version of a full-state type.
	nackedVersion string
	// outstanding are responses not yet ACKed or NACKed: nonce -> client versions before it.
	outstanding map[string]*sentResponse
	lastNonce   string
	// lastSet is the set the last response came from (make-before-break keeps its removed
	// entries until the end of the push).
	lastSet *set
	// needResponse: the client asked and must be answered even if nothing changed.
	needResponse bool
	// newNames are delta subscriptions to answer, with a removal when they do not exist.
	newNames map[string]struct{}
	// heldUntil: a RequestGate holds back this type's responses until then.
	heldUntil time.Time
}

// sentResponse is kept until the client answers; slices rather than maps because every
// connection holds one per type in flight, each as large as the type's resources.
type sentResponse struct {
	prev    []heldEntry // in recording order
	sent    []*entry
	version string
	resp    Response // as observers were told
}

// heldEntry is what the client held under name; e nil: nothing.
type heldEntry struct {
	name string
	e    *entry
}

func newWatch(typeURL string) *watch {
	return &watch{typeURL: typeURL, sub: emptySubscription,
		nacked: map[string]string{}, outstanding: map[string]*sentResponse{},
		newNames: map[string]struct{}{}}
}

// identify reads the proxy from the node of the stream's first request (or of the debug
// request before it).
func (c *conn) identify(node *corev3.Node) error {
	if c.proxy != nil {
		return nil
	}
	if node == nil {
		node = c.debugNode
	}
	p, err := model.ParseProxy(node)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "node %q: %v", node.GetId(), err)
	}
	info := c.info
	info.Proxy = p
	if err := c.s.obs.admit(info); err != nil {
		return err
	}
	c.proxy, c.info = p, info
	if c.s.opts.Generator != nil {
		c.gen = c.s.opts.Generator(p)
	}
	c.log = c.s.log.With("node", grpcserver.ClientText(p.NodeID), "conn", c.id)
	if c.peer != "" {
		c.log = c.log.With("peer", c.peer)
	}
	c.log.Debug("proxy connected", "type", p.Type, "delta", c.delta)
	c.s.obs.Connected(c.info)
	c.s.addConn(c)
	return nil
}

// gate asks the RequestGates about a request of typeURL; w, when not nil, is its watch, which
// a delay holds back.
func (c *conn) gate(w *watch, typeURL, nonce string, errDetail *status.Status) error {
	if len(c.s.obs.gates) == 0 {
		return nil
	}
	d, err := c.s.obs.request(Request{Stream: c.info, Context: c.ctx, TypeURL: typeURL, Nonce: nonce, Err: errDetail})
	if err != nil || d <= 0 || w == nil {
		return err
	}
	if until := c.s.clock.Now().Add(d); until.After(w.heldUntil) {
		w.heldUntil = until
	}
	c.log.Debug("holding back responses", "type", typeURL, "for", d)
	c.armHold(w.heldUntil)
	return nil
}

// armHold makes the hold timer fire at until, unless it fires earlier already.
func (c *conn) armHold(until time.Time) {
	if !c.holdEnds.IsZero() && !until.Before(c.holdEnds) {
		return
	}
	d := until.Sub(c.s.clock.Now())
	if c.holdTimer == nil {
		c.holdTimer = c.s.clock.NewTimer(d)
		c.resume = c.holdTimer.C()
	} else {
		c.holdTimer.Reset(d)
	}
	c.holdEnds = until
}

// holdEnded brings the stream up to date once a hold ended, through the push queue (so that
// many proxies' holds ending together take the workers, not a goroutine each), and arms the
// timer for the next hold still on.
func (c *conn) holdEnded() {
	c.holdEnds = time.Time{}
	now := c.s.clock.Now()
	for _, w := range c.watches {
		if w.heldUntil.After(now) {
			c.armHold(w.heldUntil)
		}
	}
	c.s.queue.Enqueue(c, &PushRequest{Forced: true, Start: now})
}

func (c *conn) setNames(w *watch, add, remove []string) {
	next := c.s.subs.derive(w.sub, w.typeURL, add, remove)
	c.mu.Lock()
	w.sub = next
	c.mu.Unlock()
}

// ack handles the nonce of a request: true when it is the reply to the latest response.
func (c *conn) ack(w *watch, nonce string, errDetail *status.Status) bool {
	sent, ok := w.outstanding[nonce]
	if !ok {
		return nonce == w.lastNonce
	}
	delete(w.outstanding, nonce)
	c.s.obs.Answered(Answer{Stream: c.info, Response: sent.resp, Err: errDetail, At: time.Now()})
	if errDetail != nil {
		// The client kept its previous state: go back to it, and remember what it refused.
		// In reverse, so a name recorded twice ends at its first, oldest version.
		for i := len(sent.prev) - 1; i >= 0; i-- {
			if p := sent.prev[i]; p.e == nil {
				w.client.del(p.name)
			} else {
				w.client.set(p.e)
			}
		}
		for _, e := range sent.sent {
			w.nacked[e.name] = e.version
		}
		if !c.delta && fullState(w.typeURL) {
			w.nackedVersion = sent.version
			// Names no longer in the state served leave the account of what the client holds:
			// the next full response replaces them anyway, and a proxy whose NACKs come late
			// (after the next response went out) would otherwise have each NACK bring back the
			// names of the response before, version after version, each holding its entry.
			if w.lastSet != nil {
				var stale []string
				w.client.names(func(name string) {
					if w.lastSet.entries[name] == nil {
						stale = append(stale, name)
					}
				})
				for _, name := range stale {
					w.client.del(name)
				}
			}
		}
	}
	return nonce == w.lastNonce
}

func (c *conn) handleSotW(req *discoverygrpc.DiscoveryRequest) error {
	if err := c.identify(req.GetNode()); err != nil {
		return err
	}
	t := req.GetTypeUrl()
	if t == "" {
		return status.Error(codes.InvalidArgument, "request without type_url")
	}
	w := c.watches[t]
	first := w == nil
	if first {
		w = newWatch(t)
		c.mu.Lock()
		c.watches[t] = w
		c.mu.Unlock()
	}
	var errDetail *status.Status
	if d := req.GetErrorDetail(); d != nil {
		errDetail = status.FromProto(d)
	}
	if err := c.gate(w, t, req.GetResponseNonce(), errDetail); err != nil {
		return err
	}
	if !first && !c.ack(w, req.GetResponseNonce(), errDetail) {
		return nil // stale: a newer response is on its way and will be answered
	}
	names := req.GetResourceNames()
	if !first && sameNames(w, names) {
		// An ACK repeating the subscription: SotW clients resend every name with every
		// request, thousands for EDS, so skip rebuilding the sets.
		return c.respond(w)
	}
	wildcard := slices.Contains(names, "*") || (len(names) == 0 && (first || w.wildcard))
	var added, removed []string
	want := map[string]struct{}{}
	for _, n := range names {
		if n == "*" {
			continue
		}
		want[n] = struct{}{}
		if !w.sub.has(n) {
			added = append(added, n)
		}
	}
	for _, n := range w.sub.sorted {
		if _, ok := want[n]; !ok {
			removed = append(removed, n)
			w.client.del(n) // the client forgets what it unsubscribes from
		}
	}
	c.setNames(w, added, removed)
	if wildcard != w.wildcard || len(added) > 0 || first {
		w.needResponse = true
	}
	w.wildcard = wildcard
	return c.respond(w)
}

// sameNames reports whether a SotW request's names are exactly w's subscription. Only sorted
// lists without duplicates are checked (what Envoy and gRPC send); others take the long way.
func sameNames(w *watch, names []string) bool {
	// Equal sorted lists: cheaper than a map lookup per name.
	return slices.Equal(names, w.sub.sorted)
}

func (c *conn) handleDelta(req *discoverygrpc.DeltaDiscoveryRequest) error {
	if err := c.identify(req.GetNode()); err != nil {
		return err
	}
	t := req.GetTypeUrl()
	if t == "" {
		return status.Error(codes.InvalidArgument, "request without type_url")
	}
	w := c.watches[t]
	if w == nil {
		w = newWatch(t)
		// Legacy wildcard: a first request naming nothing subscribes to everything.
		w.wildcard = len(req.GetResourceNamesSubscribe()) == 0
		for n, v := range req.GetInitialResourceVersions() {
			if v != "" {
				w.client.set(&entry{name: n, version: v}) // content unknown until we send it
			}
		}
		w.needResponse = true
		c.mu.Lock()
		c.watches[t] = w
		c.mu.Unlock()
	}
	var errDetail *status.Status
	if d := req.GetErrorDetail(); d != nil {
		errDetail = status.FromProto(d)
	}
	if err := c.gate(w, t, req.GetResponseNonce(), errDetail); err != nil {
		return err
	}
	if nonce := req.GetResponseNonce(); nonce != "" {
		c.ack(w, nonce, errDetail)
	}
	var add, remove []string
	for _, n := range req.GetResourceNamesSubscribe() {
		if n == "*" {
			w.wildcard, w.needResponse = true, true
			continue
		}
		if !w.sub.has(n) {
			add = append(add, n)
			w.newNames[n] = struct{}{}
			w.needResponse = true
		}
	}
	for _, n := range req.GetResourceNamesUnsubscribe() {
		if n == "*" {
			w.wildcard = false
			continue
		}
		remove = append(remove, n)
		delete(w.newNames, n)
		if !w.wildcard {
			w.client.del(n)
		}
	}
	c.setNames(w, add, remove)
	return c.respond(w)
}

// respond answers a request that needs it, now if a snapshot exists, else at the first push.
func (c *conn) respond(w *watch) error {
	snap := c.s.snap.Load()
	if !w.needResponse || snap == nil {
		return nil
	}
	// An answer to a request is one response: nothing to order it against.
	_, _, err := c.sync(snap, w, nil, nil, true)
	return err
}

// push sends what req changed, in make-before-break order: upserts of clusters, endpoints,
// listeners and routes, then removals in reverse order.
func (c *conn) push(req *PushRequest) error {
	snap := c.s.snap.Load()
	if snap == nil {
		return nil
	}
	c.s.pushes.Add(1)
	if c.s.pushHook != nil {
		c.s.pushHook()
	}
	c.pushing = req
	defer func() { c.pushing = nil }()
	types := affectedTypes(c.proxy, req, snap)
	var removals []func() error
	var changedClusters []string
	for _, t := range pushOrder {
		w := c.watches[t]
		if w == nil {
			continue
		}
		var force map[string]bool
		if t == resourcev3.EndpointType && len(changedClusters) > 0 {
			// A new or changed cluster warms only once its endpoints arrive, even unchanged.
			force = map[string]bool{}
			for _, n := range changedClusters {
				force[n] = true
			}
		}
		if req.Resend {
			force = map[string]bool{}
			w.client.names(func(n string) { force[n] = true })
		}
		if !types[t] && force == nil && !w.needResponse {
			continue
		}
		var onlyHosts map[string]struct{}
		if t == resourcev3.EndpointType && !req.Full && !req.Forced && force == nil {
			onlyHosts = req.Endpoints
		}
		changed, removal, err := c.sync(snap, w, onlyHosts, force, false)
		if err != nil {
			return err
		}
		if t == resourcev3.ClusterType {
			changedClusters = changed
		}
		if removal != nil {
			removals = append(removals, removal)
		}
	}
	// Other watched types are answered once, empty, when first asked; secrets, last (Envoy asks
	// for them once it holds what uses them), also when they changed.
	for t, w := range c.watches {
		secrets := t == resourcev3.SecretType && c.s.opts.Secrets != nil && (req.Secrets || req.Forced)
		if !slices.Contains(pushOrder, t) && (w.needResponse || secrets) {
			if _, removal, err := c.sync(snap, w, nil, nil, false); err != nil {
				return err
			} else if removal != nil {
				removals = append(removals, removal)
			}
		}
	}
	for i := len(removals) - 1; i >= 0; i-- {
		if err := removals[i](); err != nil {
			return err
		}
	}
	return nil
}

func (c *conn) nextNonce() string {
	c.nonce++
	return strconv.Itoa(c.nonce)
}

// sync brings one watched type up to date with snap. It sends additions and updates at once
// and returns the names it sent plus, when something must go, a func sending the removals.
// onlyHosts limits an endpoints push to those hostnames; force resends names even unchanged;
// single sends additions and removals in one response.
func (c *conn) sync(snap *model.Snapshot, w *watch, onlyHosts map[string]struct{}, force map[string]bool,
	single bool) ([]string, func() error, error) {
	if !w.heldUntil.IsZero() {
		if c.s.clock.Now().Before(w.heldUntil) {
			return nil, nil, nil // held back: brought up to date when the hold ends (holdEnded)
		}
		w.heldUntil = time.Time{}
	}
	c.building = time.Now()
	st := &set{typeURL: w.typeURL}
	if w.typeURL == resourcev3.SecretType && c.s.opts.Secrets != nil {
		st = c.secrets(snap, w)
	} else if c.gen != nil {
		var err error
		if st, err = c.s.cache.get(c.gen, snap, c.proxy, w.typeURL); err != nil {
			c.log.Error("generating configuration", "type", w.typeURL, "err", err)
			return nil, nil, nil // keep the client on its last good config
		}
	}
	// Rejected resources that no longer exist are forgotten: a proxy rejecting everything
	// must not hold every name it was ever sent.
	for name := range w.nacked {
		if st.entries[name] == nil {
			delete(w.nacked, name)
		}
	}
	inScope := func(name string) bool {
		if w.wildcard {
			return true
		}
		return w.sub.has(name)
	}
	// Upserts.
	var target []*entry // every resource the client should hold, sorted (SotW full-state only)
	needTarget := !c.delta && fullState(w.typeURL)
	var upserts []*entry
	names := st.sortedNames()
	if onlyHosts != nil && !needTarget {
		// An endpoints push looks only at the changed hosts' load assignments.
		names = st.namesOfHosts(onlyHosts)
	}
	for _, name := range names {
		if !inScope(name) {
			continue
		}
		e := st.entries[name]
		if needTarget {
			target = append(target, e)
		}
		if onlyHosts != nil {
			if _, ok := onlyHosts[e.host]; !ok {
				continue
			}
		}
		if (w.client.get(name) == e.version && !force[name]) || w.nacked[name] == e.version {
			continue
		}
		upserts = append(upserts, e)
	}
	// Removals: what the client holds that it should not.
	var removed []string
	// A secret the proxy holds and still asks for stays with it when it can no longer be
	// built (its Secret went bad or away), as istiod's SDS leaves it: removing it would take
	// down the listeners using it, and the proxy's copy is no weaker than what it was given.
	keepHeld := w.typeURL == resourcev3.SecretType && c.s.opts.Secrets != nil
	if onlyHosts == nil {
		if w.client.base != st || len(w.client.over) > 0 || !w.wildcard {
			w.client.names(func(name string) {
				if e := st.entries[name]; (e == nil && !(keepHeld && inScope(name))) || !inScope(name) {
					removed = append(removed, name)
				}
			})
		}
		for name := range w.newNames {
			if st.entries[name] == nil && w.client.get(name) == "" {
				removed = append(removed, name)
			}
		}
		slices.Sort(removed)
		removed = slices.Compact(removed)
	}
	clear(w.newNames)
	needResponse := w.needResponse
	w.needResponse = false
	if len(upserts) == 0 && len(removed) == 0 && !needResponse {
		return nil, nil, nil
	}
	changed := make([]string, len(upserts))
	for i, e := range upserts {
		changed[i] = e.name
	}
	var removal func() error
	var err error
	if c.delta {
		removal, err = c.syncDelta(w, st, upserts, removed, needResponse, single)
	} else {
		removal, err = c.syncSotW(w, st, target, upserts, removed, needResponse, single)
	}
	return changed, removal, err
}

// secrets builds the stream's own set of the secrets it subscribed to, by name: a wildcard
// subscription lists none (no proxy is sent every secret it may read).
func (c *conn) secrets(snap *model.Snapshot, w *watch) *set {
	st := &set{typeURL: w.typeURL, version: snap.Version, configVersion: snap.ConfigVersion, entries: map[string]*entry{}}
	if len(w.sub.sorted) > 0 {
		for _, r := range c.s.opts.Secrets.Secrets(c.ctx, c.proxy, c.peer, w.sub.sorted) {
			e, err := encode(w.typeURL, r)
			if err != nil {
				c.log.Warn("dropping unencodable secret", "name", cachev3.GetResourceName(r), "err", err)
				continue
			}
			st.entries[e.name] = e
		}
	}
	st.names = sortedKeys(st.entries)
	return st
}

// watching reports whether the stream subscribed to typeURL.
func (c *conn) watching(typeURL string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.watches[typeURL] != nil
}

func (c *conn) record(w *watch, st *set, nonce, version string, sent []*entry, removed []string) *sentResponse {
	r := &sentResponse{prev: make([]heldEntry, 0, len(sent)+len(removed)), sent: sent, version: version}
	for _, e := range sent {
		r.prev = append(r.prev, heldEntry{e.name, w.client.held(e.name)})
	}
	for _, n := range removed {
		r.prev = append(r.prev, heldEntry{n, w.client.held(n)})
	}
	if covers(st, sent) {
		// The client now holds all of st: share it, keeping apart only what the client holds
		// outside st and keeps.
		var gone map[string]bool
		if len(removed) > 0 {
			gone = make(map[string]bool, len(removed))
			for _, n := range removed {
				gone[n] = true
			}
		}
		var extra []*entry
		w.client.entries(func(e *entry) {
			if st.entries[e.name] == nil && !gone[e.name] {
				extra = append(extra, e)
			}
		})
		w.client = clientState{base: st, n: len(st.names)}
		for _, e := range extra {
			w.client.set(e)
		}
	} else {
		for _, e := range sent {
			w.client.set(e)
		}
		for _, n := range removed {
			w.client.del(n)
		}
		if len(w.client.over) > 64 && len(w.client.over) > len(st.names)/8 {
			w.client.rebase(st)
		}
	}
	// Clients answer every response; bound the bookkeeping for those that do not.
	if len(w.outstanding) > 64 {
		clear(w.outstanding)
	}
	w.outstanding[nonce] = r
	w.lastNonce = nonce
	return r
}

// SendError is a response the stream failed to send.
type SendError struct {
	TypeURL string
	Err     error
}

func (e *SendError) Error() string { return "sending " + e.TypeURL + ": " + e.Err.Error() }

func (e *SendError) Unwrap() error { return e.Err }

// sendResponse sends a response recorded as r and tells the observers.
func (c *conn) sendResponse(w *watch, r *sentResponse, p *preparedResponse, nonce string, removed int) error {
	built := time.Now()
	if err := c.send(p); err != nil {
		return &SendError{TypeURL: w.typeURL, Err: err}
	}
	r.resp = Response{Stream: c.info, TypeURL: w.typeURL, Nonce: nonce, Version: r.version,
		Resources: len(p.entries), Removed: removed, Bytes: p.size, Push: c.pushing,
		Began: c.building, Built: built, Sent: time.Now()}
	c.s.obs.Responded(r.resp)
	return nil
}

// covers reports whether sent is every entry of st (both sorted by name).
func covers(st *set, sent []*entry) bool {
	if st == nil || len(sent) != len(st.names) || len(sent) == 0 {
		return false
	}
	for i, n := range st.names {
		if sent[i] != st.entries[n] {
			return false
		}
	}
	return true
}

func (c *conn) syncDelta(w *watch, st *set, upserts []*entry, removed []string, needResponse, single bool) (func() error, error) {
	send := func(up []*entry, rm []string) error {
		resp := &discoverygrpc.DeltaDiscoveryResponse{TypeUrl: w.typeURL, Nonce: c.nextNonce(), RemovedResources: rm,
			SystemVersionInfo: strconv.FormatUint(st.version, 10)}
		r := c.record(w, st, resp.Nonce, resp.SystemVersionInfo, up, rm)
		return c.sendResponse(w, r, &preparedResponse{head: resp, delta: true, entries: up, controlPlane: c.s.cp.delta}, resp.Nonce, len(rm))
	}
	if single {
		return nil, send(upserts, removed)
	}
	if len(upserts) > 0 || (needResponse && len(removed) == 0) {
		if err := send(upserts, nil); err != nil {
			return nil, err
		}
	}
	if len(removed) == 0 {
		return nil, nil
	}
	return func() error {
		c.building = time.Now()
		return send(nil, removed)
	}, nil
}

func (c *conn) syncSotW(w *watch, st *set, target, upserts []*entry, removed []string, needResponse, single bool) (func() error, error) {
	send := func(es []*entry, rm []string) error {
		version := versionOf(es)
		if fullState(w.typeURL) && version == w.nackedVersion && !needResponse {
			c.log.Debug("not resending rejected configuration", "type", w.typeURL, "version", version)
			return nil
		}
		resp := &discoverygrpc.DiscoveryResponse{TypeUrl: w.typeURL, VersionInfo: version, Nonce: c.nextNonce()}
		r := c.record(w, st, resp.Nonce, version, es, rm)
		w.lastSet = st
		return c.sendResponse(w, r, &preparedResponse{head: resp, entries: es, controlPlane: c.s.cp.sotw}, resp.Nonce, len(rm))
	}
	if !fullState(w.typeURL) {
		// Routes and endpoints: only what changed; removal is the client unsubscribing.
		for _, n := range removed {
			w.client.del(n)
		}
		if len(upserts) == 0 && !needResponse {
			return nil, nil
		}
		return nil, send(upserts, nil)
	}
	if len(removed) == 0 || single {
		return nil, send(target, removed)
	}
	if !needResponse && versionOf(target) == w.nackedVersion {
		// The client rejected this state: send neither it (send would not) nor its make-before-
		// break step, which alone would leave the client holding the removed resources, and
		// the server counting them, for as long as it rejects (a NACKing proxy's clusters
		// piled up version after version).
		c.log.Debug("not resending rejected configuration", "type", w.typeURL, "version", w.nackedVersion)
		return nil, nil
	}
	// Make before break: keep the removed resources until the rest of the push is out.
	keep := slices.Clone(target)
	if w.lastSet != nil {
		for _, n := range removed {
			if e := w.lastSet.entries[n]; e != nil {
				keep = append(keep, e)
			}
		}
	}
	if len(keep) > len(target) && len(upserts) > 0 {
		slices.SortFunc(keep, func(a, b *entry) int { return cmpString(a.name, b.name) })
		if err := send(keep, nil); err != nil {
			return nil, err
		}
	}
	return func() error {
		c.building = time.Now()
		return send(target, removed)
	}, nil
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (s *set) sortedNames() []string { return s.names }
