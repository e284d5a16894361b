// Package grpcgen translates the mesh model into the xDS resources proxyless gRPC clients
// (gRPC's xDS resolver) consume, named the way istiod names them so clients move between the
// two unchanged.
package grpcgen

import (
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	faultv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	networking "istio.io/api/networking/v1alpha3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/services/xds-server/internal/translate"
)

// RouterFilterName is the name of the terminal HTTP filter, as istiod writes it.
const RouterFilterName = "envoy.filters.http.router"

// Resources are the generated xDS resources, each list sorted by name.
type Resources struct {
	Listeners []*listenerv3.Listener
	Routes    []*routev3.RouteConfiguration
	Clusters  []*clusterv3.Cluster
	Endpoints []*endpointv3.ClusterLoadAssignment
}

// ClusterName is istiod's outbound cluster name: "outbound|<port>|<subset>|<host>".
func ClusterName(port uint32, subset, host string) string {
	return translate.ClusterName(port, subset, host)
}

// ListenerName is the API listener name a client dialing xds:///<host>:<port> asks for.
func ListenerName(host string, port uint32) string {
	return host + ":" + strconv.FormatUint(uint64(port), 10)
}

// Client is what output depends on of the client asking: where it runs and its labels, which
// locality load balancing reads (EDS priorities and weights).
type Client struct {
	Locality *discoveryv1.Locality
	// Labels include the topology labels (translate.TopologyLabels).
	Labels map[string]string
	// SplitHorizon, in a multi-network mesh, replaces endpoints of other networks by their
	// networks' gateways, as istiod's EDS does for proxyless clients too.
	SplitHorizon *translate.SplitHorizon
}

// Generate translates a snapshot for a client in DNS domain dnsDomain (its node ID's last
// part, "<namespace>.svc.cluster.local", which decides the short names its virtual hosts
// match), seeing config as viewer (its namespace and labels: exportTo, the DestinationRule
// lookup path, and the sourceLabels and sourceNamespace of routes apply to it as to a
// sidecar, as in istiod) and in locality client (nil: unknown); inMesh says the client holds
// mesh certificates (model.Proxy.InMesh), so auto mTLS may apply to its clusters. It never
// fails: config gRPC cannot use is skipped and logged at debug level, so one bad resource
// cannot take the whole mesh down.
func Generate(snap *model.Snapshot, dnsDomain string, viewer *model.Viewer, client *Client, inMesh bool, log *slog.Logger) *Resources {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if viewer == nil {
		viewer = &model.Viewer{}
	}
	g := &generator{snap: snap, dnsDomain: dnsDomain, log: log, viewer: viewer, binds: snap.Bindings(viewer), inMesh: inMesh}
	out := &Resources{}
	for _, host := range snap.Hostnames() {
		svc := snap.Services[host]
		vs := g.binds.VirtualService(host)
		dr := g.binds.DestinationRule(host)
		seen := map[uint32]bool{}
		for _, port := range svc.Spec.GetPorts() {
			// Resource names are per port number; a repeated number would collide.
			if port.GetNumber() == 0 || seen[port.GetNumber()] {
				continue
			}
			seen[port.GetNumber()] = true
			l, err := g.listener(host, port.GetNumber())
			if err != nil {
				// Only invalid UTF-8 in a hostname gets here; the service cannot be named anyway.
				g.log.Debug("skipping service port", "host", host, "port", port.GetNumber(), "err", err)
				continue
			}
			out.Listeners = append(out.Listeners, l)
			out.Routes = append(out.Routes, g.routeConfig(svc, port, vs))
			for _, c := range g.clusters(svc, port, dr) {
				out.Clusters = append(out.Clusters, c.cluster)
				var lb *translate.LocalityLB
				if client != nil && (client.Locality != nil || client.Labels != nil) {
					var spec *networking.DestinationRule
					if dr != nil {
						spec = dr.Spec
					}
					pol := translate.TrafficPolicy(spec, port.GetNumber(), c.subset.GetName())
					lb = translate.NewLocalityLB(pol, snap.Mesh, client.Locality, client.Labels)
				}
				var sh *translate.SplitHorizon
				var istioMTLS func(*discoveryv1.Endpoint) bool
				if client != nil && client.SplitHorizon != nil {
					// Only endpoints taking Istio mTLS are reachable through a gateway.
					sh = client.SplitHorizon
					var spec *networking.DestinationRule
					if dr != nil {
						spec = dr.Spec
					}
					istioMTLS = translate.EndpointMTLS(snap, spec, svc, port, c.subset.GetName(), true)
				}
				out.Endpoints = append(out.Endpoints, translate.LoadAssignmentFor(c.cluster.GetName(), svc, port, c.subset, lb, istioMTLS, sh))
			}
		}
	}
	slices.SortFunc(out.Listeners, func(a, b *listenerv3.Listener) int { return strings.Compare(a.GetName(), b.GetName()) })
	slices.SortFunc(out.Routes, func(a, b *routev3.RouteConfiguration) int { return strings.Compare(a.GetName(), b.GetName()) })
	slices.SortFunc(out.Clusters, func(a, b *clusterv3.Cluster) int { return strings.Compare(a.GetName(), b.GetName()) })
	slices.SortFunc(out.Endpoints, func(a, b *endpointv3.ClusterLoadAssignment) int {
		return strings.Compare(a.GetClusterName(), b.GetClusterName())
	})
	return out
}

type generator struct {
	snap      *model.Snapshot
	dnsDomain string
	log       *slog.Logger
	viewer    *model.Viewer
	binds     *model.Bindings
	inMesh    bool
}

func (g *generator) listener(host string, port uint32) (*listenerv3.Listener, error) {
	routeName := ClusterName(port, "", host)
	router, err := marshalAny(&routerv3.Router{})
	if err != nil {
		return nil, err
	}
	fault, err := marshalAny(&faultv3.HTTPFault{})
	if err != nil {
		return nil, err
	}
	hcm := &hcmv3.HttpConnectionManager{
		StatPrefix: routeName,
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
			ConfigSource:    adsConfigSource(),
			RouteConfigName: routeName,
		}},
		// The fault filter does nothing until a route configures it (gRFC A33), as in istiod.
		HttpFilters: []*hcmv3.HttpFilter{
			{Name: translate.FaultFilter, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: fault}},
			{Name: RouterFilterName, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: router}},
		},
	}
	api, err := marshalAny(hcm)
	if err != nil {
		return nil, err
	}
	return &listenerv3.Listener{
		Name:        ListenerName(host, port),
		ApiListener: &listenerv3.ApiListener{ApiListener: api},
	}, nil
}

func adsConfigSource() *corev3.ConfigSource {
	return &corev3.ConfigSource{
		ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
		ResourceApiVersion:    corev3.ApiVersion_V3,
	}
}

func marshalAny(m proto.Message) (*anypb.Any, error) {
	a, err := anypb.New(m)
	if err != nil {
		return nil, fmt.Errorf("packing %T: %w", m, err)
	}
	return a, nil
}
