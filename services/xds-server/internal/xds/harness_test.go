package xds

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"
	networking "istio.io/api/networking/v1alpha3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/testlog"
	"sailplane.dev/shared/testwait"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const waitFor = 20 * time.Second

func testLogger(t testing.TB) *slog.Logger {
	return testlog.New(t, slog.LevelInfo)
}

// fakeGen is a small, deterministic generator: per visible service host h one cluster and one
// load assignment "outbound|80||h", one listener "h:80" and one route "outbound|80||h". A
// DestinationRule for h turns the cluster's policy to ring hash; the route counts the
// VirtualServices naming h.
type fakeGen struct {
	calls atomic.Int64
	// leakNode puts the node ID into clusters: output that depends on the proxy beyond its
	// scope, which the cache assertion must catch.
	leakNode bool
}

var (
	_ Generator = (*fakeGen)(nil)
	_ Scoper    = (*fakeGen)(nil)
)

func (g *fakeGen) CacheScope(_ *model.Snapshot, p *model.Proxy, _ string) string { return p.Namespace }

func cluster(h string) string { return "outbound|80||" + h }

func (g *fakeGen) Generate(snap *model.Snapshot, p *model.Proxy, typeURL string, names []string) ([]types.Resource, error) {
	if !slices.Contains(pushOrder, typeURL) {
		return nil, fmt.Errorf("%w: %s", ErrUnsupported, typeURL)
	}
	g.calls.Add(1)
	var out []types.Resource
	for _, h := range snap.Hostnames() {
		svc := snap.Services[h]
		if !model.ExportVisibility(svc.Spec.GetNamespace(), svc.Spec.GetExportTo()).Sees(p.Namespace) {
			continue
		}
		var r types.Resource
		switch typeURL {
		case resourcev3.ClusterType:
			c := &clusterv3.Cluster{Name: cluster(h), ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS}}
			for _, dr := range snap.DestinationRules {
				if model.ResolveHost(dr.Spec.GetHost(), dr.Namespace) == h {
					c.LbPolicy = clusterv3.Cluster_RING_HASH
				}
			}
			if g.leakNode {
				c.AltStatName = p.NodeID
			}
			r = c
		case resourcev3.EndpointType:
			cla := &endpointv3.ClusterLoadAssignment{ClusterName: cluster(h)}
			for _, ep := range svc.Endpoints {
				cla.Endpoints = append(cla.Endpoints, &endpointv3.LocalityLbEndpoints{LbEndpoints: []*endpointv3.LbEndpoint{{
					HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: &corev3.Address{
						Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{Address: ep.GetAddress()}}}}},
				}}})
			}
			r = cla
		case resourcev3.ListenerType:
			r = &listenerv3.Listener{Name: h + ":80"}
		case resourcev3.RouteType:
			n := 0
			for _, vs := range snap.VirtualServices {
				if slices.Contains(vs.Spec.GetHosts(), h) {
					n++
				}
			}
			r = &routev3.RouteConfiguration{Name: cluster(h), VirtualHosts: []*routev3.VirtualHost{{Name: strconv.Itoa(n), Domains: []string{h}}}}
		default:
			return nil, fmt.Errorf("%w: %s", ErrUnsupported, typeURL)
		}
		out = append(out, r)
	}
	if len(names) > 0 {
		out = slices.DeleteFunc(out, func(r types.Resource) bool { return !slices.Contains(names, nameOf(r)) })
	}
	return out, nil
}

func nameOf(r types.Resource) string {
	if cla, ok := r.(*endpointv3.ClusterLoadAssignment); ok {
		return cla.GetClusterName()
	}
	return r.(interface{ GetName() string }).GetName()
}

// env is an ADS server on loopback fed from a model.Store.
type env struct {
	t     *testing.T
	store *model.Store
	h     bus.Handler
	srv   *Server
	gen   *fakeGen
	addr  string
}

func newEnv(t *testing.T, opts Options, initial ...bus.Change) *env {
	t.Helper()
	e := &env{t: t, store: model.NewStore(), gen: &fakeGen{}}
	e.h = e.store.Handler(nil)
	opts.Logger = testLogger(t)
	if opts.Generator == nil {
		opts.Generator = func(*model.Proxy) Generator { return e.gen }
	}
	e.srv = NewServer(opts)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = lis.Addr().String()
	gs := grpc.NewServer(grpc.ForceServerCodecV2(Codec()))
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(gs, e.srv)
	ctx, cancel := context.WithCancel(context.Background())
	runDone, serveDone := make(chan struct{}), make(chan struct{})
	go func() { defer close(runDone); _ = e.srv.Run(ctx) }()
	go func() { defer close(serveDone); _ = gs.Serve(lis) }()
	t.Cleanup(func() {
		cancel()
		<-runDone
		gs.Stop()
		<-serveDone
	})
	for _, c := range initial {
		e.apply(c)
	}
	if len(initial) > 0 {
		e.push()
	}
	return e
}

func (e *env) apply(changes ...bus.Change) {
	e.t.Helper()
	for _, c := range changes {
		if err := e.h.Apply(c); err != nil {
			e.t.Fatal(err)
		}
	}
}

// push hands the store's next snapshot to the server, as the debouncer does.
func (e *env) push() {
	snap, ch := e.store.Next()
	e.srv.Push(snap, ch, nil)
}

func (e *env) update(changes ...bus.Change) {
	e.t.Helper()
	e.apply(changes...)
	e.push()
}

// updatePushed is update, then waits until a push has started. A connection handles pushes and
// requests on one goroutine, so a drain() after it sees that push's responses; a drain() right
// after update could be answered before the queued push begins.
func (e *env) updatePushed(changes ...bus.Change) {
	e.t.Helper()
	before := e.srv.pushes.Load()
	e.update(changes...)
	waitUntil(e.t, func() bool { return e.srv.pushes.Load() > before })
}

func services(ns string, hosts ...string) bus.Change {
	c := bus.Change{TypeURL: schema.Service.TypeURL}
	for _, h := range hosts {
		c.Updated = append(c.Updated, &bus.Resource{Name: ns + "/" + h, Body: &discoveryv1.Service{Hostname: h, Namespace: ns,
			Ports: []*discoveryv1.Port{{Name: "http", Number: 80, Protocol: "HTTP"}}}})
	}
	return c
}

func exportedService(ns, h string, exportTo ...string) bus.Change {
	c := services(ns, h)
	c.Updated[0].Body.(*discoveryv1.Service).ExportTo = exportTo
	return c
}

func endpoints(ns, h string, addrs ...string) bus.Change {
	eps := &discoveryv1.Endpoints{Hostname: h, Namespace: ns}
	for _, a := range addrs {
		eps.Endpoints = append(eps.Endpoints, &discoveryv1.Endpoint{Address: a})
	}
	return bus.Change{TypeURL: schema.Endpoints.TypeURL, Updated: []*bus.Resource{{Name: ns + "/" + h, Body: eps}}}
}

func removeService(ns, h string) bus.Change {
	return bus.Change{TypeURL: schema.Service.TypeURL, Removed: []string{ns + "/" + h}}
}

func destinationRule(ns, name, host string) bus.Change {
	return bus.Change{TypeURL: schema.DestinationRule.TypeURL, Updated: []*bus.Resource{{Name: ns + "/" + name,
		Body: &networking.DestinationRule{Host: host, TrafficPolicy: &networking.TrafficPolicy{}}}}}
}

func virtualService(ns, name string, exportTo []string, hosts ...string) bus.Change {
	return bus.Change{TypeURL: schema.VirtualService.TypeURL, Updated: []*bus.Resource{{Name: ns + "/" + name,
		Body: &networking.VirtualService{Hosts: hosts, ExportTo: exportTo}}}}
}

func gateway(ns, name string) bus.Change {
	return bus.Change{TypeURL: schema.Gateway.TypeURL, Updated: []*bus.Resource{{Name: ns + "/" + name, Body: &networking.Gateway{}}}}
}

// node is a proxy of namespace ns; proxyless when grpc.
func node(name, ns string, proxyless bool) *corev3.Node {
	md := map[string]any{"NAMESPACE": ns}
	if proxyless {
		md["GENERATOR"] = "grpc"
	}
	s, _ := structpb.NewStruct(md)
	return &corev3.Node{Id: "sidecar~10.0.0.1~" + name + "." + ns + "~" + ns + ".svc.cluster.local", Metadata: s}
}

func dial(t *testing.T, addr string) discoverygrpc.AggregatedDiscoveryServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return discoverygrpc.NewAggregatedDiscoveryServiceClient(conn)
}

func streamCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	t.Cleanup(cancel)
	return ctx
}

// sotw drives a state-of-the-world stream by hand.
type sotw struct {
	t       *testing.T
	s       discoverygrpc.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	node    *corev3.Node
	barrier int
	// last response per type, to ACK with.
	last map[string]*discoverygrpc.DiscoveryResponse
	// names subscribed per type.
	names map[string][]string
}

func newSotW(t *testing.T, addr string, n *corev3.Node) *sotw {
	t.Helper()
	s, err := dial(t, addr).StreamAggregatedResources(streamCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	return &sotw{t: t, s: s, node: n, last: map[string]*discoverygrpc.DiscoveryResponse{}, names: map[string][]string{}}
}

func (c *sotw) send(req *discoverygrpc.DiscoveryRequest) {
	c.t.Helper()
	if c.node != nil {
		req.Node, c.node = c.node, nil
	}
	if err := c.s.Send(req); err != nil {
		c.t.Fatal(err)
	}
}

// subscribe asks for typeURL (names empty: wildcard).
func (c *sotw) subscribe(typeURL string, names ...string) {
	c.t.Helper()
	c.names[typeURL] = names
	req := &discoverygrpc.DiscoveryRequest{TypeUrl: typeURL, ResourceNames: names}
	if l := c.last[typeURL]; l != nil {
		req.ResponseNonce, req.VersionInfo = l.GetNonce(), l.GetVersionInfo()
	}
	c.send(req)
}

// recv returns the next response, ACKed.
func (c *sotw) recv() *discoverygrpc.DiscoveryResponse {
	c.t.Helper()
	resp := c.recvRaw()
	c.send(&discoverygrpc.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce(),
		VersionInfo: resp.GetVersionInfo(), ResourceNames: c.names[resp.GetTypeUrl()]})
	return resp
}

func (c *sotw) recvRaw() *discoverygrpc.DiscoveryResponse {
	c.t.Helper()
	resp, err := c.s.Recv()
	if err != nil {
		c.t.Fatal(err)
	}
	c.last[resp.GetTypeUrl()] = resp
	return resp
}

// recvType receives one response and checks its type.
func (c *sotw) recvType(typeURL string) *discoverygrpc.DiscoveryResponse {
	c.t.Helper()
	resp := c.recv()
	if resp.GetTypeUrl() != typeURL {
		c.t.Fatalf("got %s, want %s", short(resp.GetTypeUrl()), short(typeURL))
	}
	return resp
}

// drain asks for a fresh type and returns, ACKed, every response that came before its answer:
// the stream is ordered, so nothing pushed before the barrier can arrive after it.
func (c *sotw) drain() []*discoverygrpc.DiscoveryResponse {
	c.t.Helper()
	c.barrier++
	bt := "type.googleapis.com/test.Barrier" + strconv.Itoa(c.barrier)
	c.send(&discoverygrpc.DiscoveryRequest{TypeUrl: bt})
	var out []*discoverygrpc.DiscoveryResponse
	for {
		resp := c.recv()
		if resp.GetTypeUrl() == bt {
			return out
		}
		out = append(out, resp)
	}
}

// delta drives a delta stream by hand.
type delta struct {
	t       *testing.T
	s       discoverygrpc.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
	node    *corev3.Node
	barrier int
	// have is what the client holds: type -> name -> version.
	have map[string]map[string]string
}

func newDelta(t *testing.T, addr string, n *corev3.Node) *delta {
	t.Helper()
	s, err := dial(t, addr).DeltaAggregatedResources(streamCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	return &delta{t: t, s: s, node: n, have: map[string]map[string]string{}}
}

func (c *delta) send(req *discoverygrpc.DeltaDiscoveryRequest) {
	c.t.Helper()
	if c.node != nil {
		req.Node, c.node = c.node, nil
	}
	if err := c.s.Send(req); err != nil {
		c.t.Fatal(err)
	}
}

func (c *delta) recvRaw() *discoverygrpc.DeltaDiscoveryResponse {
	c.t.Helper()
	resp, err := c.s.Recv()
	if err != nil {
		c.t.Fatal(err)
	}
	return resp
}

// recv returns the next response, applied and ACKed.
func (c *delta) recv() *discoverygrpc.DeltaDiscoveryResponse {
	c.t.Helper()
	resp := c.recvRaw()
	m := c.have[resp.GetTypeUrl()]
	if m == nil {
		m = map[string]string{}
		c.have[resp.GetTypeUrl()] = m
	}
	for _, r := range resp.GetResources() {
		m[r.GetName()] = r.GetVersion()
	}
	for _, n := range resp.GetRemovedResources() {
		delete(m, n)
	}
	c.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()})
	return resp
}

func (c *delta) recvType(typeURL string) *discoverygrpc.DeltaDiscoveryResponse {
	c.t.Helper()
	resp := c.recv()
	if resp.GetTypeUrl() != typeURL {
		c.t.Fatalf("got %s, want %s", short(resp.GetTypeUrl()), short(typeURL))
	}
	return resp
}

func (c *delta) drain() []*discoverygrpc.DeltaDiscoveryResponse {
	c.t.Helper()
	c.barrier++
	bt := "type.googleapis.com/test.Barrier" + strconv.Itoa(c.barrier)
	c.send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: bt})
	var out []*discoverygrpc.DeltaDiscoveryResponse
	for {
		resp := c.recv()
		if resp.GetTypeUrl() == bt {
			return out
		}
		out = append(out, resp)
	}
}

func short(typeURL string) string {
	if i := bytes.LastIndexByte([]byte(typeURL), '.'); i >= 0 {
		return typeURL[i+1:]
	}
	return typeURL
}

func names(resources []*discoverygrpc.Resource) []string {
	var out []string
	for _, r := range resources {
		out = append(out, r.GetName())
	}
	slices.Sort(out)
	return out
}

func sotwNames(t *testing.T, resp *discoverygrpc.DiscoveryResponse) []string {
	t.Helper()
	var out []string
	for _, a := range resp.GetResources() {
		m, err := a.UnmarshalNew()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, nameOf(m.(types.Resource)))
	}
	slices.Sort(out)
	return out
}

func types_(resps []*discoverygrpc.DiscoveryResponse) []string {
	var out []string
	for _, r := range resps {
		out = append(out, short(r.GetTypeUrl()))
	}
	return out
}

func deltaTypes(resps []*discoverygrpc.DeltaDiscoveryResponse) []string {
	var out []string
	for _, r := range resps {
		out = append(out, short(r.GetTypeUrl()))
	}
	return out
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	testwait.Until(t, waitFor, "condition", cond)
}
