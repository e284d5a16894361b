package grpcgen

import (
	"fmt"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/services/xds-server/internal/translate"
)

func (g *generator) routeConfig(svc *model.Service, port *discoveryv1.Port,
	vs *model.Config[*networking.VirtualService]) *routev3.RouteConfiguration {
	host := svc.Spec.GetHostname()
	var routes []*routev3.Route
	if vs != nil {
		routes = g.vsRoutes(svc, port, vs)
	}
	// Like istiod, a VirtualService with nothing for this port leaves the port its default route.
	if len(routes) == 0 {
		routes = []*routev3.Route{g.defaultRoute(host, port.GetNumber())}
	}
	return &routev3.RouteConfiguration{
		Name: ClusterName(port.GetNumber(), "", host),
		VirtualHosts: []*routev3.VirtualHost{{
			Name:    ListenerName(host, port.GetNumber()),
			Domains: domains(svc.Spec, port.GetNumber()),
			Routes:  routes,
		}},
	}
}

func (g *generator) defaultRoute(host string, port uint32) *routev3.Route {
	return &routev3.Route{
		Name:  "default",
		Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
		Action: &routev3.Route_Route{Route: &routev3.RouteAction{
			ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: ClusterName(port, "", host)},
			HashPolicy:       g.hashPolicy(host, port, ""),
		}},
	}
}

func (g *generator) vsRoutes(svc *model.Service, port *discoveryv1.Port,
	vs *model.Config[*networking.VirtualService]) []*routev3.Route {
	var routes []*routev3.Route
	for i, http := range vs.Spec.GetHttp() {
		log := g.log.With("virtualService", vs.Namespace+"/"+vs.Name, "http", i, "port", port.GetNumber())
		if len(http.GetRoute()) == 0 {
			log.Debug("skipping http route without destinations (redirect, direct response and delegate are not supported for gRPC)")
			continue
		}
		action := g.routeAction(http, svc, port, vs.Namespace)
		if action == nil {
			log.Debug("skipping http route without usable destination")
			continue
		}
		matches := http.GetMatch()
		if len(matches) == 0 {
			matches = []*networking.HTTPMatchRequest{nil}
		}
		for _, m := range matches {
			if m.GetPort() != 0 && m.GetPort() != port.GetNumber() {
				continue
			}
			if !model.AppliesToMesh(m.GetGateways()) {
				continue
			}
			rm, reason := translate.RouteMatch(m, translate.Proxyless)
			if rm == nil {
				// Dropping the whole match is safer than dropping one condition of it, which
				// would widen what the route catches.
				log.Debug("skipping unsupported match", "reason", reason)
				continue
			}
			name := http.GetName()
			if m.GetName() != "" {
				name = name + "." + m.GetName()
			}
			routes = append(routes, &routev3.Route{Name: name, Match: rm, Action: &routev3.Route_Route{Route: action}})
		}
	}
	return routes
}

type weightedDest struct {
	cluster, host, subset string
	port, weight          uint32
}

func (g *generator) routeAction(http *networking.HTTPRoute, svc *model.Service, port *discoveryv1.Port,
	ns string) *routev3.RouteAction {
	var dests []weightedDest
	for _, d := range http.GetRoute() {
		dest := d.GetDestination()
		if dest.GetHost() == "" {
			continue
		}
		host := model.ResolveHost(dest.GetHost(), ns)
		p := g.destinationPort(dest, host, svc, port)
		w := uint32(max(d.GetWeight(), 0))
		if i := indexCluster(dests, ClusterName(p, dest.GetSubset(), host)); i >= 0 {
			dests[i].weight += w
			continue
		}
		dests = append(dests, weightedDest{cluster: ClusterName(p, dest.GetSubset(), host), host: host,
			subset: dest.GetSubset(), port: p, weight: w})
	}
	if len(dests) > 1 {
		// Destinations weighted 0 take no traffic; drop them so a 0/100 split is a plain route.
		nonZero := dests[:0:0]
		for _, d := range dests {
			if d.weight > 0 {
				nonZero = append(nonZero, d)
			}
		}
		if len(nonZero) == 0 {
			// All unweighted: split evenly rather than refuse (Istio's validation rejects this).
			for i := range dests {
				dests[i].weight = 1
			}
		} else {
			dests = nonZero
		}
	}
	if len(dests) == 0 {
		return nil
	}
	action := &routev3.RouteAction{}
	if len(dests) == 1 {
		action.ClusterSpecifier = &routev3.RouteAction_Cluster{Cluster: dests[0].cluster}
	} else {
		wc := &routev3.WeightedCluster{}
		for _, d := range dests {
			wc.Clusters = append(wc.Clusters, &routev3.WeightedCluster_ClusterWeight{
				Name: d.cluster, Weight: wrapperspb.UInt32(d.weight)})
		}
		action.ClusterSpecifier = &routev3.RouteAction_WeightedClusters{WeightedClusters: wc}
	}
	if same(dests, func(d weightedDest) string { return d.host }) {
		subset := ""
		if same(dests, func(d weightedDest) string { return d.subset }) {
			subset = dests[0].subset
		}
		action.HashPolicy = g.hashPolicy(dests[0].host, dests[0].port, subset)
	}
	// gRPC applies max_stream_duration as the RPC deadline; it ignores the Envoy route timeout.
	if t := http.GetTimeout(); t != nil && t.AsDuration() > 0 {
		action.MaxStreamDuration = &routev3.RouteAction_MaxStreamDuration{MaxStreamDuration: t}
	}
	return action
}

func indexCluster(dests []weightedDest, cluster string) int {
	for i, d := range dests {
		if d.cluster == cluster {
			return i
		}
	}
	return -1
}

func same(dests []weightedDest, key func(weightedDest) string) bool {
	for _, d := range dests[1:] {
		if key(d) != key(dests[0]) {
			return false
		}
	}
	return true
}

// destinationPort is the port a destination without an explicit port goes to: the listener's
// port for the same service, else the destination service's only port.
func (g *generator) destinationPort(dest *networking.Destination, host string, svc *model.Service,
	port *discoveryv1.Port) uint32 {
	if n := dest.GetPort().GetNumber(); n != 0 {
		return n
	}
	if host == svc.Spec.GetHostname() {
		return port.GetNumber()
	}
	if ds := g.snap.Services[host]; ds != nil && len(ds.Spec.GetPorts()) == 1 {
		return ds.Spec.GetPorts()[0].GetNumber()
	}
	return port.GetNumber()
}

// hashPolicy returns the route hash policy a consistent-hash DestinationRule asks for, when
// gRPC can honour it (headers only).
func (g *generator) hashPolicy(host string, port uint32, subset string) []*routev3.RouteAction_HashPolicy {
	dr := g.binds.DestinationRule(host)
	if dr == nil {
		return nil
	}
	ch := effectiveLB(dr.Spec, port, subset).GetConsistentHash()
	if ch == nil {
		return nil
	}
	if h := ch.GetHttpHeaderName(); h != "" {
		return []*routev3.RouteAction_HashPolicy{{
			PolicySpecifier: &routev3.RouteAction_HashPolicy_Header_{
				Header: &routev3.RouteAction_HashPolicy_Header{HeaderName: h}},
		}}
	}
	g.log.Debug("consistent hash key not supported by gRPC, hashing randomly",
		"destinationRule", dr.Namespace+"/"+dr.Name, "key", fmt.Sprintf("%T", ch.GetHashKey()))
	return nil
}
