package grpcgen

import (
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/services/xds-server/internal/translate"
)

func (g *generator) routeConfig(svc *model.Service, port *discoveryv1.Port,
	vs *model.Config[*networking.VirtualService]) *routev3.RouteConfiguration {
	host := svc.Spec.GetHostname()
	name := ClusterName(port.GetNumber(), "", host)
	// As istiod, a port HTTP routes do not apply to (declared TCP, TLS…) has no virtual host.
	if !model.CarriesHTTP(port.GetProtocol()) {
		return &routev3.RouteConfiguration{Name: name}
	}
	var routes []*routev3.Route
	if vs != nil {
		routes = g.vsRoutes(svc, port, vs)
	}
	// Like istiod, a VirtualService with nothing for this port leaves the port its default route.
	if len(routes) == 0 {
		routes = []*routev3.Route{g.defaultRoute(host, port.GetNumber())}
	}
	return &routev3.RouteConfiguration{
		Name: name,
		VirtualHosts: []*routev3.VirtualHost{{
			Name:    ListenerName(host, port.GetNumber()),
			Domains: translate.WithPort(translate.Domains(svc.Spec, g.dnsDomain), port.GetNumber()),
			Routes:  routes,
		}},
	}
}

func (g *generator) defaultRoute(host string, port uint32) *routev3.Route {
	return translate.DefaultRoute(ClusterName(port, "", host), g.hashPolicy(host, port, ""))
}

// vsRoutes translates a VirtualService's http routes for one port. Routes are matched in
// order, so nothing after one that matches every request is kept, as in istiod.
func (g *generator) vsRoutes(svc *model.Service, port *discoveryv1.Port,
	vs *model.Config[*networking.VirtualService]) []*routev3.Route {
	vs = translate.WithDelegates(g.snap, vs, g.log)
	actions := map[int]*routev3.RouteAction{} // one per http route, for all its matches
	routes, skipped := translate.HTTPRoutes(vs.Spec.GetHttp(), func(i int, http *networking.HTTPRoute,
		m *networking.HTTPMatchRequest) (*routev3.Route, bool) {
		log := g.log.With("virtualService", vs.Namespace+"/"+vs.Name, "http", i, "port", port.GetNumber())
		action, built := actions[i]
		if !built {
			action = g.httpAction(http, svc, port, vs.Namespace, vs.GatewayAPI, log)
			actions[i] = action
		}
		if action == nil {
			return nil, true
		}
		if m.GetPort() != 0 && m.GetPort() != port.GetNumber() {
			return nil, false
		}
		if !model.SourceMatches(m, g.viewer) {
			return nil, false
		}
		r := translate.MatchRoute(http, m, translate.Proxyless, log)
		if r == nil {
			return nil, false
		}
		r.Action = &routev3.Route_Route{Route: action}
		if vs.GatewayAPI {
			translate.GatewaySemantics(r, translate.Proxyless)
		}
		if f := translate.Fault(http.GetFault(), log); f != nil {
			cfg, err := marshalAny(f)
			if err != nil {
				log.Debug("skipping fault injection", "err", err)
			} else {
				r.TypedPerFilterConfig = map[string]*anypb.Any{translate.FaultFilter: cfg}
			}
		}
		return r, false
	})
	if skipped > 0 {
		g.log.Debug("skipping http routes after one that matches every request",
			"virtualService", vs.Namespace+"/"+vs.Name, "port", port.GetNumber(), "skipped", skipped)
	}
	return routes
}

// httpAction is the action of an http route; nil, logged, when gRPC clients cannot use it.
func (g *generator) httpAction(http *networking.HTTPRoute, svc *model.Service, port *discoveryv1.Port,
	ns string, gatewayAPI bool, log interface{ Debug(string, ...any) }) *routev3.RouteAction {
	if len(http.GetRoute()) == 0 {
		log.Debug("skipping http route without destinations (redirect and direct response are not supported for gRPC)")
		return nil
	}
	action := g.routeAction(http, svc, port, ns, gatewayAPI)
	if action == nil {
		log.Debug("skipping http route without usable destination")
	}
	return action
}

func (g *generator) routeAction(http *networking.HTTPRoute, svc *model.Service, port *discoveryv1.Port,
	ns string, gatewayAPI bool) *routev3.RouteAction {
	dests := translate.WeightedDestinations(g.snap.Services, http.GetRoute(), ns, svc.Spec.GetHostname(), port.GetNumber())
	if gatewayAPI {
		dests = translate.GatewayAPIDestinations(g.snap.Services, http.GetRoute(), ns, svc.Spec.GetHostname(), port.GetNumber())
	}
	if len(dests) == 0 {
		return nil
	}
	action := &routev3.RouteAction{}
	if len(dests) == 1 {
		action.ClusterSpecifier = &routev3.RouteAction_Cluster{Cluster: dests[0].Cluster}
	} else {
		wc := &routev3.WeightedCluster{}
		for _, d := range dests {
			wc.Clusters = append(wc.Clusters, &routev3.WeightedCluster_ClusterWeight{
				Name: d.Cluster, Weight: wrapperspb.UInt32(d.Weight)})
		}
		action.ClusterSpecifier = &routev3.RouteAction_WeightedClusters{WeightedClusters: wc}
	}
	if h, p, subset, ok := translate.HashTarget(dests); ok {
		action.HashPolicy = g.hashPolicy(h, p, subset)
	}
	// gRPC retries the gRPC codes of retryOn (gRFC A44), istiod's default when the route sets none.
	action.RetryPolicy = translate.RetryPolicy(http.GetRetries())
	// gRPC applies max_stream_duration as the RPC deadline; it ignores the Envoy route timeout.
	if t := http.GetTimeout(); t != nil && t.AsDuration() > 0 {
		action.MaxStreamDuration = &routev3.RouteAction_MaxStreamDuration{MaxStreamDuration: t}
	}
	return action
}

// hashPolicy returns the route hash policy a consistent-hash DestinationRule asks for, when
// gRPC can honour it (headers only).
func (g *generator) hashPolicy(host string, port uint32, subset string) []*routev3.RouteAction_HashPolicy {
	dr := g.binds.DestinationRule(host)
	if dr == nil {
		return nil
	}
	hp, unsupported := translate.HashPolicy(dr.Spec, port, subset, translate.Proxyless)
	if unsupported != "" {
		g.log.Debug("consistent hash key not supported by gRPC, hashing randomly",
			"destinationRule", dr.Namespace+"/"+dr.Name, "key", unsupported)
	}
	return hp
}
