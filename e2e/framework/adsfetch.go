package framework

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"sailplane.dev/tools/xdsdiff"
)

// XDSNode is who FetchXDS connects as.
type XDSNode struct {
	ID       string
	Metadata map[string]any
	// Listeners, when set, are the listeners asked for by name, as a proxyless gRPC client asks
	// for the "host:port" it dials; their routes, the clusters those name and the clusters'
	// endpoints are then asked for by name, as the client does. Empty: every cluster and
	// listener (wildcard), then the endpoints and routes they name, as Envoy does.
	Listeners []string
}

const hcmFilter = "envoy.filters.network.http_connection_manager"

// FetchXDS opens one ADS stream (state of the world) to the plaintext xDS server at addr as
// node, subscribes as the node's kind of client does and ACKs every answer, and returns every
// resource held once each subscription has been answered with every name it asked for. An
// answer that leaves a requested name out (a route or endpoints the server does not have)
// would never be completed: after quiet without a message the fetch ends with what it has, so
// that the name shows as missing rather than as a hang. ctx bounds the whole fetch.
func FetchXDS(ctx context.Context, addr string, node XDSNode, quiet time.Duration) (xdsdiff.Snapshot, error) {
	md, err := structpb.NewStruct(node.Metadata)
	if err != nil {
		return nil, fmt.Errorf("node %s metadata: %w", node.ID, err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return nil, fmt.Errorf("ADS to %s: %w", addr, err)
	}
	f := &adsFetch{
		stream: stream,
		node:   &corev3.Node{Id: node.ID, Metadata: md, UserAgentName: "envoy"},
		subs:   map[string]*subscription{},
	}
	if len(node.Listeners) > 0 {
		f.proxyless = true
		f.node.UserAgentName = "grpc-go"
		err = f.subscribe(xdsdiff.ListenerType, node.Listeners)
	} else {
		if err = f.subscribe(xdsdiff.ClusterType, nil); err == nil {
			err = f.subscribe(xdsdiff.ListenerType, nil)
		}
	}
	if err != nil {
		return nil, err
	}

	type recv struct {
		resp *discoveryv3.DiscoveryResponse
		err  error
	}
	ch := make(chan recv)
	go func() {
		for {
			resp, err := stream.Recv()
			select {
			case ch <- recv{resp, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	timer := time.NewTimer(quiet)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("ADS to %s as %s: %w; %s", addr, node.ID, ctx.Err(), f.missing())
		case <-timer.C:
			if f.allAnswered() {
				return f.snapshot(), nil
			}
			timer.Reset(quiet)
		case r := <-ch:
			if r.err != nil {
				return nil, fmt.Errorf("ADS to %s as %s: %w", addr, node.ID, r.err)
			}
			if err := f.handle(r.resp); err != nil {
				return nil, fmt.Errorf("ADS to %s as %s: %w", addr, node.ID, err)
			}
			if f.complete() {
				return f.snapshot(), nil
			}
			timer.Reset(quiet)
		}
	}
}

// subscription is one type's state on the stream.
type subscription struct {
	names    []string // nil: wildcard
	version  string
	nonce    string
	answered bool // an answer arrived since names last changed
	got      map[string]*anypb.Any
}

type adsFetch struct {
	stream    discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	node      *corev3.Node
	proxyless bool
	subs      map[string]*subscription
	sentNode  bool
}

func (f *adsFetch) send(typeURL string, s *subscription) error {
	req := &discoveryv3.DiscoveryRequest{TypeUrl: typeURL, VersionInfo: s.version, ResponseNonce: s.nonce, ResourceNames: s.names}
	// The node goes in the first request of the stream, as Envoy sends it.
	if !f.sentNode {
		req.Node, f.sentNode = f.node, true
	}
	return f.stream.Send(req)
}

// subscribe asks for names of typeURL (nil: wildcard), replacing what was asked before; a set
// that did not change sends nothing.
func (f *adsFetch) subscribe(typeURL string, names []string) error {
	s := f.subs[typeURL]
	if s == nil {
		if names != nil && len(names) == 0 {
			// An empty first request would be a wildcard to a server.
			return nil
		}
		s = &subscription{got: map[string]*anypb.Any{}}
		f.subs[typeURL] = s
	} else if slices.Equal(s.names, names) {
		return nil
	}
	s.names, s.answered = names, false
	for n := range s.got {
		if names != nil && !slices.Contains(names, n) {
			delete(s.got, n)
		}
	}
	return f.send(typeURL, s)
}

func (f *adsFetch) handle(resp *discoveryv3.DiscoveryResponse) error {
	typeURL := resp.GetTypeUrl()
	s := f.subs[typeURL]
	if s == nil {
		return fmt.Errorf("answer of type %s, which was not asked for", typeURL)
	}
	// Clusters and listeners are answered with the whole state of what is asked for (xDS's
	// state of the world); routes and endpoints may come a few at a time.
	if typeURL == xdsdiff.ClusterType || typeURL == xdsdiff.ListenerType {
		s.got = map[string]*anypb.Any{}
	}
	for _, a := range resp.GetResources() {
		name, err := resourceName(a)
		if err != nil {
			return fmt.Errorf("%s: %w", typeURL, err)
		}
		if s.names == nil || slices.Contains(s.names, name) {
			s.got[name] = a
		}
	}
	s.version, s.nonce, s.answered = resp.GetVersionInfo(), resp.GetNonce(), true
	if err := f.send(typeURL, s); err != nil { // the ACK
		return err
	}
	switch typeURL {
	case xdsdiff.ClusterType:
		return f.subscribe(xdsdiff.EndpointType, edsNames(s.got))
	case xdsdiff.ListenerType:
		return f.subscribe(xdsdiff.RouteType, rdsNames(s.got))
	case xdsdiff.RouteType:
		if f.proxyless {
			return f.subscribe(xdsdiff.ClusterType, routeClusters(s.got))
		}
	}
	return nil
}

// allAnswered reports whether each subscription had an answer since it last changed.
func (f *adsFetch) allAnswered() bool {
	for _, s := range f.subs {
		if !s.answered && (s.names == nil || len(s.names) > 0) {
			return false
		}
	}
	return true
}

// complete reports whether every subscription was answered with all it asked for.
func (f *adsFetch) complete() bool {
	if !f.allAnswered() {
		return false
	}
	for _, s := range f.subs {
		for _, n := range s.names {
			if s.got[n] == nil {
				return false
			}
		}
	}
	return true
}

func (f *adsFetch) missing() string {
	var b []string
	for _, t := range slices.Sorted(maps.Keys(f.subs)) {
		s := f.subs[t]
		if !s.answered {
			b = append(b, fmt.Sprintf("%s not answered (asked %d names)", t, len(s.names)))
		}
	}
	if len(b) == 0 {
		return "every subscription answered"
	}
	return strings.Join(b, "; ")
}

func (f *adsFetch) snapshot() xdsdiff.Snapshot {
	out := xdsdiff.Snapshot{}
	for t, s := range f.subs {
		for _, n := range slices.Sorted(maps.Keys(s.got)) {
			out[t] = append(out[t], s.got[n])
		}
	}
	return out
}

// resourceName is the name of an xDS resource.
func resourceName(a *anypb.Any) (string, error) {
	m, err := a.UnmarshalNew()
	if err != nil {
		return "", err
	}
	switch r := m.(type) {
	case *clusterv3.Cluster:
		return r.GetName(), nil
	case *listenerv3.Listener:
		return r.GetName(), nil
	case *routev3.RouteConfiguration:
		return r.GetName(), nil
	case interface{ GetClusterName() string }: // ClusterLoadAssignment
		return r.GetClusterName(), nil
	}
	return "", fmt.Errorf("resource of unexpected type %s", a.GetTypeUrl())
}

// edsNames are the load assignments the EDS clusters name.
func edsNames(clusters map[string]*anypb.Any) []string {
	var names []string
	for _, a := range clusters {
		var c clusterv3.Cluster
		if a.UnmarshalTo(&c) != nil || c.GetType() != clusterv3.Cluster_EDS || c.GetClusterType() != nil {
			continue
		}
		n := c.GetEdsClusterConfig().GetServiceName()
		if n == "" {
			n = c.GetName()
		}
		names = append(names, n)
	}
	return sortedSet(names)
}

// rdsNames are the route configurations the listeners' HTTP connection managers name, in
// filter chains and in API listeners (proxyless gRPC).
func rdsNames(listeners map[string]*anypb.Any) []string {
	var names []string
	hcm := func(a *anypb.Any) {
		var h hcmv3.HttpConnectionManager
		if a.UnmarshalTo(&h) == nil {
			if n := h.GetRds().GetRouteConfigName(); n != "" {
				names = append(names, n)
			}
		}
	}
	for _, a := range listeners {
		var l listenerv3.Listener
		if a.UnmarshalTo(&l) != nil {
			continue
		}
		if api := l.GetApiListener().GetApiListener(); api != nil {
			hcm(api)
		}
		chains := l.GetFilterChains()
		if l.GetDefaultFilterChain() != nil {
			chains = append(chains, l.GetDefaultFilterChain())
		}
		for _, fc := range chains {
			for _, nf := range fc.GetFilters() {
				if tc := nf.GetTypedConfig(); tc != nil && (nf.GetName() == hcmFilter || strings.HasSuffix(tc.GetTypeUrl(), ".HttpConnectionManager")) {
					hcm(tc)
				}
			}
		}
	}
	return sortedSet(names)
}

// routeClusters are the clusters the routes send to.
func routeClusters(routes map[string]*anypb.Any) []string {
	var names []string
	for _, a := range routes {
		var rc routev3.RouteConfiguration
		if a.UnmarshalTo(&rc) != nil {
			continue
		}
		for _, vh := range rc.GetVirtualHosts() {
			for _, r := range vh.GetRoutes() {
				if c := r.GetRoute().GetCluster(); c != "" {
					names = append(names, c)
				}
				for _, wc := range r.GetRoute().GetWeightedClusters().GetClusters() {
					names = append(names, wc.GetName())
				}
			}
		}
	}
	return sortedSet(names)
}

// sortedSet is names sorted without duplicates, never nil (an empty subscription is not a
// wildcard).
func sortedSet(names []string) []string {
	slices.Sort(names)
	return append([]string{}, slices.Compact(names)...)
}
