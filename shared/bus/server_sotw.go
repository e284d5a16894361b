package bus

import (
	"strconv"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"
)

// StreamAggregatedResources serves one state-of-the-world ADS stream: every response carries the
// full state of its type, version_info is the type's change counter.
func (srv *Server) StreamAggregatedResources(stream grpc.BidiStreamingServer[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]) error {
	ctx := stream.Context()
	ss := &sotwStream{srv: srv, stream: stream, w: newWatcher(), types: map[string]*sotwType{}}
	defer func() {
		for typ := range ss.types {
			srv.store.unwatch(ss.w, typ)
		}
	}()
	reqs := receive(ctx, stream.Recv)
	for {
		select {
		case <-ctx.Done():
			return nil
		case r := <-reqs:
			if r.err != nil {
				return nil
			}
			if err := ss.handle(r.req); err != nil {
				return err
			}
		case <-ss.w.notify:
			dirty, since := ss.w.take()
			for typ, names := range dirty {
				st := ss.types[typ]
				if st == nil || !st.affected(names) {
					continue
				}
				entries, version := srv.store.snapshot(typ)
				if version == st.sentVersion {
					continue // already sent: the change was coalesced into an earlier response
				}
				if st.since.IsZero() {
					st.since = since[typ]
				}
				if err := ss.send(st, entries, version); err != nil {
					return err
				}
			}
		}
	}
}

type sotwStream struct {
	srv    *Server
	stream grpc.BidiStreamingServer[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse]
	w      *watcher
	nodeID string
	nonces nonces
	types  map[string]*sotwType // by canonical type URL
}

// sotwType is one subscribed type on a state-of-the-world stream.
type sotwType struct {
	canonical string
	wireURL   string
	names     map[string]struct{} // nil: wildcard
	nonce     string              // of the last response
	// sent is the last response's content, acked the last content the client accepted; their
	// difference is what a NACK rejects.
	sent, acked map[string]string
	sentVersion uint64
	// since is when the first change sent but not yet answered was published.
	since time.Time
}

func (st *sotwType) affected(names map[string]struct{}) bool {
	if st.names == nil {
		return true
	}
	for n := range names {
		if _, ok := st.names[n]; ok {
			return true
		}
	}
	return false
}

func namesOf(list []string) map[string]struct{} {
	if len(list) == 0 || (len(list) == 1 && list[0] == "*") {
		return nil
	}
	m := make(map[string]struct{}, len(list))
	for _, n := range list {
		m[n] = struct{}{}
	}
	return m
}

func sameNames(a, b map[string]struct{}) bool {
	if (a == nil) != (b == nil) || len(a) != len(b) {
		return false
	}
	for n := range a {
		if _, ok := b[n]; !ok {
			return false
		}
	}
	return true
}

func (ss *sotwStream) handle(req *discoveryv3.DiscoveryRequest) error {
	if ss.nodeID == "" && req.GetNode() != nil {
		ss.nodeID = req.GetNode().GetId()
	}
	typ := canonicalType(req.GetTypeUrl())
	st := ss.types[typ]
	names := namesOf(req.GetResourceNames())
	if st == nil {
		st = &sotwType{canonical: typ, wireURL: req.GetTypeUrl(), names: names, acked: map[string]string{}}
		ss.types[typ] = st
		entries, version, err := ss.srv.store.watch(ss.stream.Context(), ss.w, typ)
		if err != nil {
			return err
		}
		return ss.send(st, entries, version)
	}
	nonce := req.GetResponseNonce()
	if nonce != "" && nonce != st.nonce {
		return nil // answers a response superseded since: ignore, as xDS prescribes
	}
	if nonce != "" {
		ss.srv.store.metrics.delivered(typ, st.since)
		st.since = time.Time{}
		if req.GetErrorDetail() != nil {
			ss.nack(st, req.GetErrorDetail().GetMessage())
		} else {
			st.acked = st.sent
		}
		if sameNames(names, st.names) {
			return nil
		}
	}
	// A new request (no nonce) or changed resource names: answer with the full state.
	st.names = names
	entries, version := ss.srv.store.snapshot(typ)
	return ss.send(st, entries, version)
}

// nack records a Rejection for each resource of the rejected response that the client had not
// accepted before. The response is not resent: the next change sends a newer state.
func (ss *sotwStream) nack(st *sotwType, msg string) {
	now := time.Now()
	for n, v := range st.sent {
		if st.acked[n] == v {
			continue
		}
		ss.srv.store.reject(Rejection{Consumer: ss.nodeID, TypeURL: st.canonical, Name: n,
			Version: v, Err: msg, At: now})
	}
}

// send sends the whole state of a type in one response. Unlike delta responses it is never
// split: in state of the world every response is the type's full state, and consumers (istiod's
// xds:// config source included) delete whatever a response lacks, so a part would delete the
// rest. Its size is bounded by the per-resource limit times the resource count; consumers accept
// such messages (Sailplane's and istiod's MCP clients take up to 2 GiB), and Sailplane's own
// consumers use delta.
func (ss *sotwStream) send(st *sotwType, entries []*entry, version uint64) error {
	resp := &discoveryv3.DiscoveryResponse{
		TypeUrl:     st.wireURL,
		VersionInfo: strconv.FormatUint(version, 10),
		Resources:   make([]*anypb.Any, 0, len(entries)),
	}
	sent := make(map[string]string, len(entries))
	for _, e := range entries {
		if st.names != nil {
			if _, ok := st.names[e.res.Name]; !ok {
				continue
			}
		}
		enc, err := e.wire()
		if err != nil {
			ss.srv.log.Error("bus: cannot encode resource", "type", st.canonical, "name", e.res.Name, "err", err)
			continue
		}
		resp.Resources = append(resp.Resources, enc.any)
		sent[e.res.Name] = e.res.Version
	}
	resp.Nonce = strconv.FormatUint(ss.nonces.next(), 10)
	st.nonce, st.sent, st.sentVersion = resp.Nonce, sent, version
	return ss.stream.Send(resp)
}
