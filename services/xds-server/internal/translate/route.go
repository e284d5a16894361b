package translate

import (
	"fmt"
	"slices"
	"strconv"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	networking "istio.io/api/networking/v1alpha3"

	"sailplane.dev/services/xds-server/internal/model"
)

// ClusterName is istiod's outbound cluster name: "outbound|<port>|<subset>|<host>".
func ClusterName(port uint32, subset, host string) string {
	return "outbound|" + strconv.FormatUint(uint64(port), 10) + "|" + subset + "|" + host
}

// DestinationPort is the port a route destination goes to: its explicit port, else the
// listener's port for the same host, else the destination service's only port, else the
// listener's port.
func DestinationPort(services map[string]*model.Service, dest *networking.Destination, destHost, host string,
	port uint32) uint32 {
	if n := dest.GetPort().GetNumber(); n != 0 {
		return n
	}
	if destHost == host {
		return port
	}
	if ds := services[destHost]; ds != nil && len(ds.Spec.GetPorts()) == 1 {
		return ds.Spec.GetPorts()[0].GetNumber()
	}
	return port
}

// WeightedDest is a route destination resolved to its cluster.
type WeightedDest struct {
	Cluster, Host, Subset string
	Port, Weight          uint32
}

// WeightedDestinations resolves route destinations (of a VirtualService in namespace ns, routing
// host:port) to clusters, merging repeats and dropping zero weights from splits. A lone
// destination weighs 100.
func WeightedDestinations[D routeDestination](services map[string]*model.Service, rds []D, ns, host string, port uint32) []WeightedDest {
	return weightedDestinations(services, rds, ns, host, port, false)
}

// UnknownCluster is the cluster istiod routes a Gateway API backend to that is missing or not
// allowed (a destination without host): no such cluster exists, so Envoy answers with the
// route's cluster_not_found_response_code, 500 as the Gateway API asks.
const UnknownCluster = "UnknownService"

// GatewayAPIDestinations is WeightedDestinations for config translated from the Gateway API:
// a destination without host keeps its weight, on UnknownCluster, so that its share of the
// requests fails rather than going to the other backends.
func GatewayAPIDestinations[D routeDestination](services map[string]*model.Service, rds []D, ns, host string, port uint32) []WeightedDest {
	return weightedDestinations(services, rds, ns, host, port, true)
}

type routeDestination interface {
	GetDestination() *networking.Destination
	GetWeight() int32
}

func weightedDestinations[D routeDestination](services map[string]*model.Service, rds []D, ns, host string, port uint32,
	unknown bool) []WeightedDest {
	var dests []WeightedDest
	for _, d := range rds {
		dest := d.GetDestination()
		var name, h string
		var p uint32
		switch {
		case dest.GetHost() != "":
			h = model.ResolveHost(dest.GetHost(), ns)
			p = DestinationPort(services, dest, h, host, port)
			name = ClusterName(p, dest.GetSubset(), h)
		case unknown:
			name = UnknownCluster
		default:
			continue
		}
		w := uint32(max(d.GetWeight(), 0))
		if i := slices.IndexFunc(dests, func(x WeightedDest) bool { return x.Cluster == name }); i >= 0 {
			dests[i].Weight += w
			continue
		}
		dests = append(dests, WeightedDest{Cluster: name, Host: h, Subset: dest.GetSubset(), Port: p, Weight: w})
	}
	if len(dests) > 1 {
		nonZero := dests[:0:0]
		for _, d := range dests {
			if d.Weight > 0 {
				nonZero = append(nonZero, d)
			}
		}
		if len(nonZero) == 0 {
			// All unweighted: split evenly rather than refuse (Istio's validation rejects this).
			for i := range dests {
				dests[i].Weight = 1
			}
		} else {
			dests = nonZero
		}
	}
	if len(dests) == 1 && dests[0].Weight == 0 {
		dests[0].Weight = 100
	}
	return dests
}

// HashTarget is the destination a route's hash policy is taken from: the host (and subset)
// every destination of the route shares; ok false when they differ, and then no hash applies.
func HashTarget(dests []WeightedDest) (host string, port uint32, subset string, ok bool) {
	if len(dests) == 0 {
		return "", 0, "", false
	}
	subset = dests[0].Subset
	for _, d := range dests[1:] {
		if d.Host != dests[0].Host {
			return "", 0, "", false
		}
		if d.Subset != subset {
			subset = ""
		}
	}
	return dests[0].Host, dests[0].Port, subset, true
}

// HashPolicy is the route side of a consistent-hash DestinationRule for port and subset of its
// host. For client Proxyless only a header key is expressible; any other key gives no hash
// policy and a reason naming the key.
func HashPolicy(dr *networking.DestinationRule, port uint32, subset string, client Client) ([]*routev3.RouteAction_HashPolicy, string) {
	ch := TrafficPolicy(dr, port, subset).LB.GetConsistentHash()
	if ch == nil {
		return nil, ""
	}
	var hp *routev3.RouteAction_HashPolicy
	switch k := ch.GetHashKey().(type) {
	case *networking.LoadBalancerSettings_ConsistentHashLB_HttpHeaderName:
		hp = &routev3.RouteAction_HashPolicy{PolicySpecifier: &routev3.RouteAction_HashPolicy_Header_{
			Header: &routev3.RouteAction_HashPolicy_Header{HeaderName: k.HttpHeaderName}}}
	case *networking.LoadBalancerSettings_ConsistentHashLB_HttpCookie:
		hp = &routev3.RouteAction_HashPolicy{PolicySpecifier: &routev3.RouteAction_HashPolicy_Cookie_{
			Cookie: &routev3.RouteAction_HashPolicy_Cookie{Name: k.HttpCookie.GetName(), Path: k.HttpCookie.GetPath(),
				Ttl: k.HttpCookie.GetTtl()}}}
	case *networking.LoadBalancerSettings_ConsistentHashLB_UseSourceIp:
		hp = &routev3.RouteAction_HashPolicy{PolicySpecifier: &routev3.RouteAction_HashPolicy_ConnectionProperties_{
			ConnectionProperties: &routev3.RouteAction_HashPolicy_ConnectionProperties{SourceIp: true}}}
	case *networking.LoadBalancerSettings_ConsistentHashLB_HttpQueryParameterName:
		hp = &routev3.RouteAction_HashPolicy{PolicySpecifier: &routev3.RouteAction_HashPolicy_QueryParameter_{
			QueryParameter: &routev3.RouteAction_HashPolicy_QueryParameter{Name: k.HttpQueryParameterName}}}
	default:
		return nil, ""
	}
	if client == Proxyless && hp.GetHeader() == nil {
		return nil, fmt.Sprintf("%T", ch.GetHashKey())
	}
	return []*routev3.RouteAction_HashPolicy{hp}, ""
}

// DefaultRoute sends everything to cluster, with no timeout and istiod's default retries: the
// route of a service no VirtualService routes.
func DefaultRoute(cluster string, hash []*routev3.RouteAction_HashPolicy) *routev3.Route {
	return &routev3.Route{
		Name:  "default",
		Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
		Action: &routev3.Route_Route{Route: &routev3.RouteAction{
			ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster},
			Timeout:          durationpb.New(0),
			RetryPolicy:      DefaultRetryPolicy(),
			HashPolicy:       hash,
		}},
	}
}
