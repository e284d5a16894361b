package xds

import (
	"cmp"
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"sailplane.dev/shared/grpcserver"
)

// Istio's debug types, which istioctl asks istiod for over ADS.
const (
	// DebugTypePrefix starts every debug type URL.
	DebugTypePrefix = "istio.io/debug/"
	// TypeSyncz answers one envoy.service.status.v3.ClientConfig per connected proxy: each
	// watched type's status (SYNCED, STALE, NOT_SENT, ERROR for a NACK) and versions.
	TypeSyncz = DebugTypePrefix + "syncz"
	// TypeConfigDump answers, for the proxy the one resource name names, what it holds of what
	// this server sent: the Configs of an envoy.admin.v3.ConfigDump, one resource each.
	TypeConfigDump = DebugTypePrefix + "config_dump"
)

// ComponentName is the Component of the control plane identifier in debug responses.
const ComponentName = "xds-server"

// configDumpWait bounds how long a config dump waits for the proxy's stream to be free (it is
// read on the stream's own goroutine, which may be busy sending).
const configDumpWait = 10 * time.Second

// watchStatus is what the last response of a watch became, as the debug types report it.
type watchStatus struct {
	sentNonce, sentVersion string
	sentAt                 time.Time
	ackedNonce             string
	ackedVersion           string
	// nackError is the last NACK's detail, until the client ACKs again.
	nackError     string
	nackedVersion string
	nackedAt      time.Time
}

// configStatus is istiod's: a NACK not followed by an ACK is ERROR, nothing sent is
// NOT_SENT, the last response ACKed is SYNCED, anything else (sent, not answered yet) STALE.
func (ws *watchStatus) configStatus() statusv3.ConfigStatus {
	switch {
	case ws.nackError != "":
		return statusv3.ConfigStatus_ERROR
	case ws.sentNonce == "":
		return statusv3.ConfigStatus_NOT_SENT
	case ws.ackedNonce == ws.sentNonce:
		return statusv3.ConfigStatus_SYNCED
	default:
		return statusv3.ConfigStatus_STALE
	}
}

// syncStatus is the Observer keeping what the debug types report of each stream: per type, its
// last response and what the client made of it.
type syncStatus struct {
	NopObserver
	mu      sync.Mutex
	streams map[int64]map[string]*watchStatus // stream ID -> type URL ->
}

var _ Observer = (*syncStatus)(nil)

func newSyncStatus() *syncStatus {
	return &syncStatus{streams: map[int64]map[string]*watchStatus{}}
}

func (ss *syncStatus) Responded(r Response) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	types := ss.streams[r.Stream.ID]
	if types == nil {
		types = map[string]*watchStatus{}
		ss.streams[r.Stream.ID] = types
	}
	ws := types[r.TypeURL]
	if ws == nil {
		ws = &watchStatus{}
		types[r.TypeURL] = ws
	}
	ws.sentNonce, ws.sentVersion, ws.sentAt = r.Nonce, r.Version, r.Sent
}

func (ss *syncStatus) Answered(a Answer) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ws := ss.streams[a.Stream.ID][a.Response.TypeURL]
	if ws == nil {
		return
	}
	if a.Err == nil {
		ws.ackedNonce, ws.ackedVersion, ws.nackError = a.Response.Nonce, a.Response.Version, ""
		return
	}
	ws.nackError = cmp.Or(grpcserver.ClientText(a.Err.Message()), "rejected without a message")
	ws.nackedVersion, ws.nackedAt = a.Response.Version, a.At
}

func (ss *syncStatus) Disconnected(s StreamInfo) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	delete(ss.streams, s.ID)
}

// of is a copy of the status of stream id's types.
func (ss *syncStatus) of(id int64) map[string]watchStatus {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	out := make(map[string]watchStatus, len(ss.streams[id]))
	for t, ws := range ss.streams[id] {
		out[t] = *ws
	}
	return out
}

// controlPlane names this replica in every response, with istiod's identifier (its JSON
// IstioControlPlaneInstance: component, pod name, version), so that istioctl and a proxy's
// config dump show which replica and version served it. istiod sets it on its debug
// responses only; a proxy's own responses carry it here too, encoded once: with several
// replicas behind one address, "who sent this" is the first question of a debugging session.
type controlPlane struct {
	msg *corev3.ControlPlane
	// sotw and delta are msg as the encoded control_plane field of a DiscoveryResponse and of
	// a DeltaDiscoveryResponse, as buffers to send (made once: a conversion allocates).
	sotw, delta mem.Buffer
}

func newControlPlane(replica, version string) controlPlane {
	type info struct {
		Version string `json:"version"`
	}
	id, _ := json.Marshal(struct {
		Component string
		ID        string
		Info      info
	}{ComponentName, replica, info{version}})
	cp := controlPlane{msg: &corev3.ControlPlane{Identifier: string(id)}}
	enc, _ := proto.Marshal(cp.msg)
	field := func(num protowire.Number) mem.Buffer {
		b := protowire.AppendTag(nil, num, protowire.BytesType)
		return mem.SliceBuffer(protowire.AppendBytes(b, enc))
	}
	cp.sotw, cp.delta = field(sotwControlPlaneField), field(deltaControlPlaneField)
	return cp
}

// isDebugType reports whether typeURL is one of Istio's debug types.
func isDebugType(typeURL string) bool { return strings.HasPrefix(typeURL, DebugTypePrefix) }

// debugAnswer is a debug request's response: its resources, named.
type debugAnswer struct {
	names []string
	res   []*anypb.Any
}

// handleDebug answers a debug request the RequestGates let through (Options.DebugAccess is the
// first). Debug clients are not proxies: they are not listed, pushed or watched; each request
// gets one response.
func (c *conn) handleDebug(ctx context.Context, node *corev3.Node, typeURL, nonce string, names []string, respond func(*debugAnswer, string) error) error {
	if err := c.gate(nil, typeURL, nonce, nil); err != nil {
		return err // Options.DebugAccess among others
	}
	if c.debugNode == nil {
		c.debugNode = node
	}
	if last, ok := c.debugNonces[typeURL]; ok && nonce == last {
		return nil // the ACK (or NACK) of our answer
	}
	var ans *debugAnswer
	switch typeURL {
	case TypeSyncz:
		ans = c.s.syncz()
	case TypeConfigDump:
		if len(names) != 1 {
			return status.Errorf(codes.InvalidArgument, "%s wants exactly one resource name, the proxy (<pod>.<namespace> or its node ID); got %d", typeURL, len(names))
		}
		var err error
		if ans, err = c.s.configDump(ctx, c, names[0]); err != nil {
			return err
		}
	default:
		return status.Errorf(codes.Unimplemented, "xds-server: debug type %s is not served (only %s and %s)", grpcserver.ClientText(typeURL), TypeSyncz, TypeConfigDump)
	}
	n := c.nextNonce()
	if c.debugNonces == nil {
		c.debugNonces = map[string]string{}
	}
	c.debugNonces[typeURL] = n
	return respond(ans, n)
}

func (c *conn) handleDebugSotW(ctx context.Context, req *discoverygrpc.DiscoveryRequest) error {
	return c.handleDebug(ctx, req.GetNode(), req.GetTypeUrl(), req.GetResponseNonce(), req.GetResourceNames(), func(a *debugAnswer, nonce string) error {
		return c.send(&discoverygrpc.DiscoveryResponse{
			TypeUrl: req.GetTypeUrl(), Nonce: nonce, VersionInfo: debugVersion(),
			Resources: a.res, ControlPlane: c.s.cp.msg,
		})
	})
}

func (c *conn) handleDebugDelta(ctx context.Context, req *discoverygrpc.DeltaDiscoveryRequest) error {
	return c.handleDebug(ctx, req.GetNode(), req.GetTypeUrl(), req.GetResponseNonce(), req.GetResourceNamesSubscribe(), func(a *debugAnswer, nonce string) error {
		resp := &discoverygrpc.DeltaDiscoveryResponse{
			TypeUrl: req.GetTypeUrl(), Nonce: nonce, SystemVersionInfo: debugVersion(), ControlPlane: c.s.cp.msg,
		}
		for i, r := range a.res {
			resp.Resources = append(resp.Resources, &discoverygrpc.Resource{Name: a.names[i], Version: debugVersion(), Resource: r})
		}
		return c.send(resp)
	})
}

// debugVersion versions a debug answer by when it was made: each is a new picture.
func debugVersion() string { return strconv.FormatInt(time.Now().UnixNano(), 10) }

// syncz is one ClientConfig per connected proxy, ordered by name. Every proxy is listed,
// proxyless gRPC clients included (istiod lists only proxies whose metadata has PROXY_CONFIG,
// which gRPC clients lack; here they are half of what is served).
func (s *Server) syncz() *debugAnswer {
	ans := &debugAnswer{}
	for _, ps := range s.Proxies() {
		cc := ps.clientConfig()
		a, err := anypb.New(cc)
		if err != nil {
			s.log.Error("encoding a proxy's sync status", "node", ps.Proxy.NodeID, "err", err)
			continue
		}
		ans.names = append(ans.names, cc.GetNode().GetId())
		ans.res = append(ans.res, a)
	}
	return ans
}

// clientConfig is the proxy's sync status, shaped as istiod's syncz shapes it (the node named
// by its ID's "<pod>.<namespace>" part, with CLUSTER_ID, NAMESPACE and ISTIO_VERSION metadata).
// Each type's xds_config is Sailplane's detail, a google.protobuf.Struct: nonceSent,
// nonceAcked, versionAcked.
func (ps ProxySync) clientConfig() *statusv3.ClientConfig {
	p := ps.Proxy
	md := map[string]any{"CLUSTER_ID": p.ClusterID, "NAMESPACE": p.Namespace}
	if p.IstioVersion != "" {
		md["ISTIO_VERSION"] = p.IstioVersion
	}
	if p.Generator != "" {
		md["GENERATOR"] = p.Generator
	}
	meta, _ := structpb.NewStruct(md)
	cc := &statusv3.ClientConfig{Node: &corev3.Node{Id: p.ID, Metadata: meta}}
	for _, ws := range ps.Watches {
		gc := &statusv3.ClientConfig_GenericXdsConfig{TypeUrl: ws.TypeURL, ConfigStatus: ws.Status, VersionInfo: ws.SentVersion}
		if !ws.SentAt.IsZero() {
			gc.LastUpdated = timestamppb.New(ws.SentAt)
		}
		if ws.NackError != "" {
			gc.ErrorState = &adminv3.UpdateFailureState{
				LastUpdateAttempt: timestamppb.New(ws.NackedAt), Details: ws.NackError, VersionInfo: ws.NackedVersion,
			}
		}
		detail, _ := structpb.NewStruct(map[string]any{
			"nonceSent": ws.SentNonce, "nonceAcked": ws.AckedNonce, "versionAcked": ws.AckedVersion,
		})
		gc.XdsConfig, _ = anypb.New(detail)
		cc.GenericXdsConfigs = append(cc.GenericXdsConfigs, gc)
	}
	return cc
}

// findProxy is the newest connection of the proxy named name: its "<pod>.<namespace>" ID (what
// istioctl sends) or its whole node ID.
func (s *Server) findProxy(name string) *conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	var found *conn
	for c := range s.conns {
		if (c.proxy.ID == name || c.proxy.NodeID == name) && (found == nil || c.id > found.id) {
			found = c
		}
	}
	return found
}

// configDump is what the named proxy holds of what this server sent it, as the Configs of an
// Envoy admin ConfigDump; nothing when it is not connected here (another replica may have it).
// caller is the stream asking.
func (s *Server) configDump(ctx context.Context, caller *conn, name string) (*debugAnswer, error) {
	c, dump, err := s.dumpOf(ctx, caller, name)
	if c == nil || err != nil {
		return &debugAnswer{}, err
	}
	return dumpAnswer(c, dump), nil
}

// ConfigDump is what the proxy named name (its "<pod>.<namespace>" ID or node ID) holds of what
// this server sent it, as Envoy's admin config dump; nil when it is not connected here.
func (s *Server) ConfigDump(ctx context.Context, name string) (*adminv3.ConfigDump, error) {
	_, dump, err := s.dumpOf(ctx, nil, name)
	return dump, err
}

// dumpOf reads the named proxy's config dump on its stream's goroutine (caller's own when it
// is the one asking); c is nil when the proxy is not connected here.
func (s *Server) dumpOf(ctx context.Context, caller *conn, name string) (c *conn, dump *adminv3.ConfigDump, err error) {
	c = s.findProxy(name)
	if c == nil {
		s.log.Debug("config dump of a proxy not connected here", "proxy", grpcserver.ClientText(name))
		return nil, nil, nil
	}
	if c == caller {
		// Already on its goroutine.
		return c, c.configDump(), nil
	}
	ctx, cancel := context.WithTimeout(ctx, configDumpWait)
	defer cancel()
	busy := status.Errorf(codes.DeadlineExceeded, "config dump of %s: its stream stayed busy for %v", grpcserver.ClientText(name), configDumpWait)
	result := make(chan *adminv3.ConfigDump, 1)
	select {
	case c.queries <- func() { result <- c.configDump() }:
	case <-c.done:
		return nil, nil, nil
	case <-ctx.Done():
		return nil, nil, busy
	}
	select {
	case dump := <-result:
		return c, dump, nil
	case <-ctx.Done():
		return nil, nil, busy
	}
}

func dumpAnswer(c *conn, dump *adminv3.ConfigDump) *debugAnswer {
	ans := &debugAnswer{res: dump.GetConfigs()}
	for range ans.res {
		ans.names = append(ans.names, c.proxy.ID)
	}
	return ans
}

// configDump builds, on the stream's goroutine, the ConfigDump of what the client holds: each
// resource as last sent (a NACKed response is not held), clusters, endpoints, listeners,
// routes and secrets, in Envoy's order. Secrets never carry key material (redactSecret).
func (c *conn) configDump() *adminv3.ConfigDump {
	held := map[string][]heldResource{}
	for t, w := range c.watches {
		held[t] = c.heldResources(w)
	}
	return buildConfigDump(held, c.log)
}

// heldResource is one resource a client holds.
type heldResource struct {
	name, version string
	res           *anypb.Any
}

// heldResources lists what the client holds of w's type, by name. A version the client said it
// had when it connected (delta) is shown with the content of the current resource of that
// version, if there is one; else it is left out (its content was never seen here).
func (c *conn) heldResources(w *watch) []heldResource {
	var current *set
	var out []heldResource
	w.client.entries(func(e *entry) {
		a := e.any
		if a == nil {
			if current == nil && c.gen != nil {
				if snap := c.s.snap.Load(); snap != nil {
					current, _ = c.s.cache.get(c.gen, snap, c.proxy, w.typeURL)
				}
			}
			if current == nil || current.entries[e.name] == nil || current.entries[e.name].version != e.version {
				return
			}
			a = current.entries[e.name].any
		}
		out = append(out, heldResource{name: e.name, version: e.version, res: a})
	})
	slices.SortFunc(out, func(a, b heldResource) int { return strings.Compare(a.name, b.name) })
	return out
}
