// Package loadgen simulates Envoy sidecars against an xDS server and measures how fast the
// control plane converges: after a connect storm, after a VirtualService change and after an
// endpoint change. It also drives the scenario: it writes the config, starts the control plane
// as processes, samples their CPU and memory, and writes results as a table, JSON and SVG.
package loadgen

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"sailplane.dev/shared/bufpool"
	"sailplane.dev/shared/grpcserver"
)

// xDS type URLs the simulated sidecars use.
const (
	ClusterType  = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	EndpointType = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
	ListenerType = "type.googleapis.com/envoy.config.listener.v3.Listener"
	RouteType    = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
)

// ErrProtocol reports a response the simulated proxy cannot make sense of.
var ErrProtocol = errors.New("loadgen: xDS protocol error")

// ProxyConfig describes one simulated sidecar.
type ProxyConfig struct {
	// Addr is the xDS server, host:port.
	Addr string
	// Delta selects incremental xDS instead of state of the world.
	Delta bool
	// Index numbers the proxy: it names the pod and picks the IP when IP is empty.
	Index     int
	Namespace string
	// IP is the workload address; default ProxyIP(Index).
	IP     string
	Labels map[string]string
	Logger *slog.Logger
	// Shared is state shared by every proxy of a run (decode cache, markers, counters);
	// nil gives the proxy its own.
	Shared *Shared
	// SourceIP, when set, is the local address the proxy connects from: spreading thousands
	// of connections over several loopback addresses keeps each address's ephemeral ports
	// from running out.
	SourceIP string
	// Router makes the proxy a gateway (node type "router", as istio-proxy in a gateway pod)
	// instead of a sidecar.
	Router bool
}

// ProxyIP is the address of proxy i: 198.18.0.0/15 is set aside for benchmarks.
func ProxyIP(i int) string {
	n := i + 1
	return fmt.Sprintf("198.%d.%d.%d", 18+(n>>16)&1, (n>>8)&0xff, n&0xff)
}

// Shared is what the proxies of one run share: a cache of decoded resources (the server sends
// the same bytes to many proxies, so each is decoded once), the active markers and counters.
type Shared struct {
	seed     maphash.Seed
	mu       sync.Mutex
	clusters map[uint64]clusterInfo
	lists    map[string][]string // typeURL + " " + SotW version -> derived names
	listener map[uint64][]string

	markerMu sync.Mutex
	markers  []*Marker

	BytesReceived atomic.Int64
	Responses     atomic.Int64
	// Retries counts streams opened again after ending before their first response, Refused
	// those of them the server refused as overloaded (Unavailable with a retry delay).
	Retries, Refused atomic.Int64

	codec   *requestCodec
	buffers *bufpool.Dirty
}

type clusterInfo struct{ name, eds string }

// NewShared returns empty shared state.
func NewShared() *Shared {
	return &Shared{seed: maphash.MakeSeed(), clusters: map[uint64]clusterInfo{}, lists: map[string][]string{},
		listener: map[uint64][]string{}, codec: newRequestCodec(), buffers: &bufpool.Dirty{}}
}

// Proxy is one simulated Envoy sidecar: it subscribes to CDS and LDS (wildcard), then to EDS
// for the EDS clusters and RDS for the route names its listeners use, and ACKs every response.
type Proxy struct {
	cfg    ProxyConfig
	shared *Shared
	log    *slog.Logger
	node   *corev3.Node

	started time.Time
	synced  chan struct{}
	// syncedAt is when the proxy first held CDS, LDS and every EDS and RDS resource it asked
	// for (unix nanoseconds; 0 = not yet).
	syncedAt atomic.Int64
	opened   atomic.Int64
	bytes    atomic.Int64
	resps    atomic.Int64

	mu    sync.Mutex // guards types against Watching, called by the driver
	types map[string]*typeState
}

type typeState struct {
	version, nonce string
	names          []string // subscribed names, sorted (EDS/RDS); nil for wildcard types
	got            map[string]struct{}
	responded      bool
	// delta: what the proxy holds, name -> version, and for clusters their EDS service name.
	held map[string]string
	eds  map[string]string
}

// NewProxy returns a proxy; Run connects it.
func NewProxy(cfg ProxyConfig) *Proxy {
	if cfg.IP == "" {
		cfg.IP = ProxyIP(cfg.Index)
	}
	if cfg.Namespace == "" {
		cfg.Namespace = "default"
	}
	if cfg.Shared == nil {
		cfg.Shared = NewShared()
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	pod := fmt.Sprintf("pod-%d", cfg.Index)
	labels := map[string]any{}
	for k, v := range cfg.Labels {
		labels[k] = v
	}
	md, err := structpb.NewStruct(map[string]any{
		"NAMESPACE":       cfg.Namespace,
		"LABELS":          labels,
		"SERVICE_ACCOUNT": "default",
		"CLUSTER_ID":      "Kubernetes",
		"ISTIO_VERSION":   "1.31.1",
		"POD_NAME":        pod,
		"INSTANCE_IPS":    cfg.IP,
	})
	if err != nil {
		panic(err) // only strings and string maps: cannot fail
	}
	nodeType := "sidecar"
	if cfg.Router {
		nodeType = "router"
	}
	return &Proxy{
		cfg: cfg, shared: cfg.Shared, log: log.With("proxy", cfg.Index),
		node: &corev3.Node{
			Id:       nodeType + "~" + cfg.IP + "~" + pod + "." + cfg.Namespace + "~" + cfg.Namespace + ".svc.cluster.local",
			Cluster:  "loadgen." + cfg.Namespace,
			Metadata: md,
		},
		synced: make(chan struct{}),
		types:  map[string]*typeState{},
	}
}

// NodeID is the proxy's xDS node ID.
func (p *Proxy) NodeID() string { return p.node.GetId() }

// Synced is closed once the proxy holds its whole initial configuration.
func (p *Proxy) Synced() <-chan struct{} { return p.synced }

// SyncedAfter is how long the proxy took from Run to synced; ok is false if not synced.
func (p *Proxy) SyncedAfter() (time.Duration, bool) {
	at := p.syncedAt.Load()
	if at == 0 {
		return 0, false
	}
	return time.Unix(0, at).Sub(p.started), true
}

// BytesReceived counts the encoded size of every response the proxy got.
func (p *Proxy) BytesReceived() int64 { return p.bytes.Load() }

// Responses counts the responses the proxy got, of every type.
func (p *Proxy) Responses() int64 { return p.resps.Load() }

// Watching reports whether the proxy subscribes to resource name of typeURL (EDS or RDS).
func (p *Proxy) Watching(typeURL, name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.types[typeURL]
	if st == nil {
		return false
	}
	_, ok := slices.BinarySearch(st.names, name)
	return ok
}

// Names lists what the proxy subscribes to of typeURL (EDS or RDS), sorted.
func (p *Proxy) Names(typeURL string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st := p.types[typeURL]; st != nil {
		return slices.Clone(st.names)
	}
	return nil
}

// Run connects and serves the proxy's ADS stream until ctx ends (nil) or the stream fails after
// it got a response. A stream that ends before its first response (an overloaded server's
// Unavailable, a connection that could not be made) is opened again with backoff, as Envoy and
// gRPC's xDS client do, never sooner than the server's retry delay.
func (p *Proxy) Run(ctx context.Context) error {
	p.started = time.Now()
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<30), grpc.ForceCodecV2(p.shared.codec)),
		// Envoy's HTTP/2 windows are large (256 MiB by default): a sidecar never makes the
		// server wait for window updates in the middle of a response.
		grpc.WithInitialWindowSize(16 << 20), grpc.WithInitialConnWindowSize(16 << 20),
		grpc.WithReadBufferSize(256 << 10),
		// Frames are read into buffers not cleared first: a tenth of the CPU at 10,000 sidecars.
		experimental.WithBufferPool(p.shared.buffers),
	}
	if p.cfg.SourceIP != "" {
		local := &net.TCPAddr{IP: net.ParseIP(p.cfg.SourceIP)}
		opts = append(opts, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{LocalAddr: local}).DialContext(ctx, "tcp", addr)
		}))
	}
	cc, err := grpc.NewClient(p.cfg.Addr, opts...)
	if err != nil {
		return fmt.Errorf("loadgen: dial %s: %w", p.cfg.Addr, err)
	}
	defer cc.Close()
	client := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc)
	b := grpcserver.Backoff{Initial: 100 * time.Millisecond, Max: 10 * time.Second}
	for {
		if p.cfg.Delta {
			err = p.runDelta(ctx, client)
		} else {
			err = p.runSotW(ctx, client)
		}
		if ctx.Err() != nil {
			return nil
		}
		if p.bytes.Load() > 0 {
			return err
		}
		p.shared.Retries.Add(1)
		if _, ok := grpcserver.RetryAfter(err); ok {
			p.shared.Refused.Add(1)
		}
		t := time.NewTimer(b.Next(err))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

func (p *Proxy) state(typeURL string) *typeState {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.types[typeURL]
	if st == nil {
		st = &typeState{got: map[string]struct{}{}, held: map[string]string{}, eds: map[string]string{}}
		p.types[typeURL] = st
	}
	return st
}

func (p *Proxy) setNames(st *typeState, names []string) {
	p.mu.Lock()
	st.names = names
	p.mu.Unlock()
}

// checkSynced marks the proxy synced once CDS and LDS arrived and every subscribed EDS and RDS
// name was received.
func (p *Proxy) checkSynced() {
	if p.syncedAt.Load() != 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, t := range []string{ClusterType, ListenerType} {
		if st := p.types[t]; st == nil || !st.responded {
			return
		}
	}
	for _, t := range []string{EndpointType, RouteType} {
		st := p.types[t]
		if st == nil {
			continue // nothing to ask for
		}
		for _, n := range st.names {
			if _, ok := st.got[n]; !ok {
				return
			}
		}
	}
	p.syncedAt.Store(time.Now().UnixNano())
	for _, st := range p.types {
		st.got = nil // only needed until synced
	}
	close(p.synced)
}

func (p *Proxy) received(typeURL string, size int) {
	p.bytes.Add(int64(size))
	p.resps.Add(1)
	p.shared.BytesReceived.Add(int64(size))
	p.shared.Responses.Add(1)
}

// --- state of the world ---

func (p *Proxy) runSotW(ctx context.Context, client discoverygrpc.AggregatedDiscoveryServiceClient) error {
	stream, err := client.StreamAggregatedResources(ctx)
	if err != nil {
		return fmt.Errorf("loadgen: open ADS stream: %w", err)
	}
	first := true
	send := func(typeURL string, st *typeState, names []string) error {
		req := &discoverygrpc.DiscoveryRequest{TypeUrl: typeURL, VersionInfo: st.version, ResponseNonce: st.nonce,
			ResourceNames: names}
		if first {
			req.Node, first = p.node, false
		}
		if err := stream.Send(req); err != nil {
			return fmt.Errorf("loadgen: send %s: %w", typeURL, streamStatus(stream, err))
		}
		return nil
	}
	for _, t := range []string{ClusterType, ListenerType} {
		if err := send(t, p.state(t), nil); err != nil {
			return err
		}
	}
	p.opened.Store(time.Now().UnixNano())
	var resp sotwResponse
	defer resp.free()
	for {
		if err := stream.RecvMsg(&resp); err != nil {
			return fmt.Errorf("loadgen: receive: %w", err)
		}
		t := resp.typeURL
		p.received(t, resp.size)
		st := p.state(t)
		st.version, st.nonce = resp.version, resp.nonce
		switch t {
		case ClusterType, ListenerType:
			child, names, err := p.dependents(t, resp.version, resp.values)
			if err != nil {
				return err
			}
			cst := p.state(child)
			if !slices.Equal(cst.names, names) {
				p.setNames(cst, names)
				// Envoy asks for the new cluster's endpoints (listener's routes) before it ACKs.
				if err := send(child, cst, names); err != nil {
					return err
				}
			}
			if err := send(t, st, nil); err != nil {
				return err
			}
		case EndpointType, RouteType:
			for _, v := range resp.values {
				name := nameField(v.prefix(maxNameLen))
				if st.got != nil {
					st.got[name] = struct{}{}
				}
				p.shared.observe(p, t, name, v)
			}
			if err := send(t, st, st.names); err != nil {
				return err
			}
		default:
			if err := send(t, st, nil); err != nil {
				return err
			}
		}
		st.responded = true
		p.checkSynced()
	}
}

// dependents decodes a SotW CDS or LDS response into the sorted EDS (RDS) names it needs.
// Equal versions mean equal content, so each version is decoded once per run.
func (p *Proxy) dependents(typeURL, version string, values []segment) (string, []string, error) {
	child := EndpointType
	if typeURL == ListenerType {
		child = RouteType
	}
	key := typeURL + " " + version
	p.shared.mu.Lock()
	names, ok := p.shared.lists[key]
	p.shared.mu.Unlock()
	if ok && version != "" {
		return child, names, nil
	}
	set := map[string]struct{}{}
	for _, v := range values {
		var deps []string
		var err error
		if typeURL == ClusterType {
			var ci clusterInfo
			ci, err = p.shared.cluster(v.bytes())
			if ci.eds != "" {
				deps = []string{ci.eds}
			}
		} else {
			deps, err = p.shared.listenerRoutes(v.bytes())
		}
		if err != nil {
			return "", nil, err
		}
		for _, d := range deps {
			set[d] = struct{}{}
		}
	}
	names = make([]string, 0, len(set))
	for n := range set {
		names = append(names, n)
	}
	slices.Sort(names)
	p.shared.mu.Lock()
	p.shared.lists[key] = names
	p.shared.mu.Unlock()
	return child, names, nil
}

// --- delta ---

func (p *Proxy) runDelta(ctx context.Context, client discoverygrpc.AggregatedDiscoveryServiceClient) error {
	stream, err := client.DeltaAggregatedResources(ctx)
	if err != nil {
		return fmt.Errorf("loadgen: open delta ADS stream: %w", err)
	}
	first := true
	send := func(req *discoverygrpc.DeltaDiscoveryRequest) error {
		if first {
			req.Node, first = p.node, false
		}
		if err := stream.Send(req); err != nil {
			return fmt.Errorf("loadgen: send %s: %w", req.GetTypeUrl(), streamStatus(stream, err))
		}
		return nil
	}
	for _, t := range []string{ClusterType, ListenerType} {
		p.state(t)
		if err := send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: t}); err != nil {
			return err
		}
	}
	p.opened.Store(time.Now().UnixNano())
	for {
		resp, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("loadgen: receive: %w", err)
		}
		t := resp.GetTypeUrl()
		p.received(t, proto.Size(resp))
		st := p.state(t)
		for _, n := range resp.GetRemovedResources() {
			delete(st.held, n)
			delete(st.eds, n)
		}
		var childChanged bool
		for _, r := range resp.GetResources() {
			st.held[r.GetName()] = r.GetVersion()
			if st.got != nil {
				st.got[r.GetName()] = struct{}{}
			}
			v := r.GetResource().GetValue()
			switch t {
			case ClusterType:
				ci, err := p.shared.cluster(v)
				if err != nil {
					return err
				}
				if st.eds[r.GetName()] != ci.eds {
					childChanged = true
				}
				st.eds[r.GetName()] = ci.eds
			case ListenerType:
				routes, err := p.shared.listenerRoutes(v)
				if err != nil {
					return err
				}
				// Keep the routes joined: one string per listener.
				joined := joinNames(routes)
				if st.eds[r.GetName()] != joined {
					childChanged = true
				}
				st.eds[r.GetName()] = joined
			case EndpointType, RouteType:
				p.shared.observe(p, t, r.GetName(), segment{v})
			}
		}
		if len(resp.GetRemovedResources()) > 0 {
			childChanged = true
		}
		if (t == ClusterType || t == ListenerType) && (childChanged || !st.responded) {
			child := EndpointType
			if t == ListenerType {
				child = RouteType
			}
			set := map[string]struct{}{}
			for _, v := range st.eds {
				for _, n := range splitNames(v) {
					set[n] = struct{}{}
				}
			}
			want := make([]string, 0, len(set))
			for n := range set {
				want = append(want, n)
			}
			slices.Sort(want)
			cst := p.state(child)
			sub, unsub := diffSorted(cst.names, want)
			if len(sub) > 0 || len(unsub) > 0 {
				p.setNames(cst, want)
				if err := send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: child, ResourceNamesSubscribe: sub,
					ResourceNamesUnsubscribe: unsub}); err != nil {
					return err
				}
			}
		}
		if err := send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: t, ResponseNonce: resp.GetNonce()}); err != nil {
			return err
		}
		st.responded = true
		p.checkSynced()
	}
}

// streamStatus is why a stream ended when Send says only io.EOF: the status Recv returns.
func streamStatus(stream interface{ RecvMsg(any) error }, err error) error {
	if !errors.Is(err, io.EOF) {
		return err
	}
	if rerr := stream.RecvMsg(new(discoverygrpc.DiscoveryResponse)); rerr != nil {
		return rerr
	}
	return err
}

func joinNames(ns []string) string {
	var b bytes.Buffer
	for i, n := range ns {
		if i > 0 {
			b.WriteByte(0)
		}
		b.WriteString(n)
	}
	return b.String()
}

func splitNames(s string) []string {
	if s == "" {
		return nil
	}
	var out []string
	for len(s) > 0 {
		i := bytes.IndexByte([]byte(s), 0)
		if i < 0 {
			out = append(out, s)
			break
		}
		out = append(out, s[:i])
		s = s[i+1:]
	}
	return out
}

// diffSorted returns what is in want but not have, and in have but not want.
func diffSorted(have, want []string) (add, remove []string) {
	i, j := 0, 0
	for i < len(have) || j < len(want) {
		switch {
		case j == len(want) || (i < len(have) && have[i] < want[j]):
			remove = append(remove, have[i])
			i++
		case i == len(have) || want[j] < have[i]:
			add = append(add, want[j])
			j++
		default:
			i++
			j++
		}
	}
	return add, remove
}

// --- decoding ---

func (s *Shared) cluster(b []byte) (clusterInfo, error) {
	h := maphash.Bytes(s.seed, b)
	s.mu.Lock()
	ci, ok := s.clusters[h]
	s.mu.Unlock()
	if ok {
		return ci, nil
	}
	var c clusterv3.Cluster
	if err := proto.Unmarshal(b, &c); err != nil {
		return ci, fmt.Errorf("%w: cluster: %w", ErrProtocol, err)
	}
	ci.name = c.GetName()
	if c.GetType() == clusterv3.Cluster_EDS {
		ci.eds = c.GetEdsClusterConfig().GetServiceName()
		if ci.eds == "" {
			ci.eds = c.GetName()
		}
	}
	s.mu.Lock()
	s.clusters[h] = ci
	s.mu.Unlock()
	return ci, nil
}

func (s *Shared) listenerRoutes(b []byte) ([]string, error) {
	h := maphash.Bytes(s.seed, b)
	s.mu.Lock()
	rs, ok := s.listener[h]
	s.mu.Unlock()
	if ok {
		return rs, nil
	}
	var l listenerv3.Listener
	if err := proto.Unmarshal(b, &l); err != nil {
		return nil, fmt.Errorf("%w: listener: %w", ErrProtocol, err)
	}
	set := map[string]struct{}{}
	chains := slices.Clone(l.GetFilterChains())
	if d := l.GetDefaultFilterChain(); d != nil {
		chains = append(chains, d)
	}
	for _, fc := range chains {
		for _, f := range fc.GetFilters() {
			tc := f.GetTypedConfig()
			if tc == nil || tc.GetTypeUrl() != "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager" {
				continue
			}
			var hcm hcmv3.HttpConnectionManager
			if err := proto.Unmarshal(tc.GetValue(), &hcm); err != nil {
				return nil, fmt.Errorf("%w: listener %s: %w", ErrProtocol, l.GetName(), err)
			}
			if n := hcm.GetRds().GetRouteConfigName(); n != "" {
				set[n] = struct{}{}
			}
		}
	}
	for n := range set {
		rs = append(rs, n)
	}
	slices.Sort(rs)
	s.mu.Lock()
	s.listener[h] = rs
	s.mu.Unlock()
	return rs, nil
}

// maxNameLen bounds the resource names nameField finds in a prefix of a resource.
const maxNameLen = 1024

// nameField reads field 1 (name / cluster_name) of a RouteConfiguration or ClusterLoadAssignment
// without decoding the rest.
func nameField(b []byte) string {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		if num == 1 && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return ""
			}
			return string(v)
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return ""
		}
		b = b[n:]
	}
	return ""
}

// --- markers ---

// Marker waits for a distinctive byte string to reach, in a resource of one type and name
// (any name when Name is empty), every proxy expected to receive it.
type Marker struct {
	TypeURL string
	Name    string
	Value   []byte
	Start   time.Time

	mu      sync.Mutex
	pending map[*Proxy]struct{}
	seen    map[*Proxy]time.Duration
	done    chan struct{}
}

// NewMarker starts waiting for value in typeURL resources (named name, if not empty) at every
// proxy of expect. Call Start just before making the change, then Wait.
func (s *Shared) NewMarker(typeURL, name, value string, expect []*Proxy) *Marker {
	m := &Marker{TypeURL: typeURL, Name: name, Value: []byte(value), pending: map[*Proxy]struct{}{},
		seen: map[*Proxy]time.Duration{}, done: make(chan struct{})}
	for _, p := range expect {
		m.pending[p] = struct{}{}
	}
	if len(m.pending) == 0 {
		close(m.done)
	}
	s.markerMu.Lock()
	s.markers = append(s.markers, m)
	s.markerMu.Unlock()
	return m
}

// Begin records the start of the change the marker measures.
func (m *Marker) Begin() {
	m.mu.Lock()
	m.Start = time.Now()
	m.mu.Unlock()
}

// Done is closed once every expected proxy saw the marker.
func (m *Marker) Done() <-chan struct{} { return m.done }

// Latencies are, for each proxy that saw the marker, the time from Begin; missing counts those
// that did not (yet).
func (m *Marker) Latencies() (lat []time.Duration, missing int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, d := range m.seen {
		lat = append(lat, d)
	}
	slices.Sort(lat)
	return lat, len(m.pending)
}

// Remove stops matching m.
func (s *Shared) Remove(m *Marker) {
	s.markerMu.Lock()
	defer s.markerMu.Unlock()
	s.markers = slices.DeleteFunc(s.markers, func(x *Marker) bool { return x == m })
}

func (s *Shared) observe(p *Proxy, typeURL, name string, value segment) {
	s.markerMu.Lock()
	ms := s.markers
	s.markerMu.Unlock()
	for _, m := range ms {
		if m.TypeURL != typeURL || (m.Name != "" && m.Name != name) {
			continue
		}
		m.mu.Lock()
		_, want := m.pending[p]
		m.mu.Unlock()
		if !want || !value.contains(m.Value) {
			continue
		}
		now := time.Now()
		m.mu.Lock()
		if _, ok := m.pending[p]; ok && !m.Start.IsZero() {
			delete(m.pending, p)
			m.seen[p] = now.Sub(m.Start)
			if len(m.pending) == 0 {
				close(m.done)
			}
		}
		m.mu.Unlock()
	}
}

// Percentile of sorted durations (q in [0,1]); 0 for none.
func Percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func itoa(i int) string { return strconv.Itoa(i) }
