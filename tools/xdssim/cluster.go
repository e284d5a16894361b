package xdssim

import (
	"fmt"
	"net"
	"strconv"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	aggregatev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/clusters/aggregate/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

const httpProtocolOptions = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"

// upstream resolves a cluster to its endpoints, picks one, and its transport socket.
func (s *Simulator) upstream(res *Result, name string, req Request) error {
	return s.upstreamDepth(res, name, req, 0)
}

func (s *Simulator) upstreamDepth(res *Result, name string, req Request, depth int) error {
	c := s.clusters[name]
	if c == nil {
		return fail(res, ErrClusterNotFound, "cluster %q", name)
	}
	res.Cluster = name
	var eps []*endpointv3.LbEndpoint
	switch ct := c.GetClusterDiscoveryType().(type) {
	case *clusterv3.Cluster_Type:
		res.ClusterType = ct.Type.String()
		switch ct.Type {
		case clusterv3.Cluster_EDS:
			svc := c.GetEdsClusterConfig().GetServiceName()
			if svc == "" {
				svc = name
			}
			cla := s.endpoints[svc]
			if cla == nil {
				// Envoy keeps the cluster warming; requests find no host.
				return fail(res, ErrNoHealthyUpstream, "cluster %s: no ClusterLoadAssignment %q", name, svc)
			}
			eps = priorityEndpoints(cla)
		case clusterv3.Cluster_STATIC, clusterv3.Cluster_STRICT_DNS, clusterv3.Cluster_LOGICAL_DNS:
			eps = priorityEndpoints(c.GetLoadAssignment())
		case clusterv3.Cluster_ORIGINAL_DST:
			if req.DestinationIP == "" {
				return fail(res, ErrNoHealthyUpstream, "cluster %s is ORIGINAL_DST; the request has no destination IP", name)
			}
			res.Endpoints = []string{net.JoinHostPort(req.DestinationIP, strconv.Itoa(int(req.Port)))}
			res.Endpoint, res.endpointHost = res.Endpoints[0], res.Endpoints[0]
			return s.transport(res, c, nil)
		}
	case *clusterv3.Cluster_ClusterType:
		agg := &aggregatev3.ClusterConfig{}
		if ct.ClusterType.GetTypedConfig().UnmarshalTo(agg) != nil {
			return fail(res, ErrUnsupported, "cluster %s: custom cluster type %s", name, ct.ClusterType.GetName())
		}
		if depth > 8 {
			return fail(res, ErrInvalid, "cluster %s: aggregate clusters nest too deep", name)
		}
		// An aggregate cluster uses the first of its clusters that has a healthy host.
		var last error
		for _, sub := range agg.GetClusters() {
			if last = s.upstreamDepth(res, sub, req, depth+1); last == nil {
				return nil
			}
		}
		return fail(res, ErrNoHealthyUpstream, "aggregate cluster %s: %v", name, last)
	}
	if len(eps) == 0 {
		return fail(res, ErrNoHealthyUpstream, "cluster %s", name)
	}
	for _, e := range eps {
		res.Endpoints = append(res.Endpoints, endpointAddress(e))
	}
	chosen := eps[req.Pick%uint64(len(eps))]
	res.Endpoint = endpointAddress(chosen)
	res.endpointHost = chosen.GetEndpoint().GetHostname()
	if res.endpointHost == "" {
		res.endpointHost = chosen.GetEndpoint().GetAddress().GetSocketAddress().GetAddress()
	}
	return s.transport(res, c, chosen)
}

// priorityEndpoints returns the healthy endpoints of the highest priority (lowest number)
// that has any. Priority spill-over by overprovisioning is not simulated.
func priorityEndpoints(cla *endpointv3.ClusterLoadAssignment) []*endpointv3.LbEndpoint {
	best := -1
	var out []*endpointv3.LbEndpoint
	for _, loc := range cla.GetEndpoints() {
		if loc.GetLoadBalancingWeight() != nil && loc.GetLoadBalancingWeight().GetValue() == 0 {
			continue
		}
		p := int(loc.GetPriority())
		for _, e := range loc.GetLbEndpoints() {
			if !healthy(e.GetHealthStatus()) || (e.GetLoadBalancingWeight() != nil && e.GetLoadBalancingWeight().GetValue() == 0) {
				continue
			}
			switch {
			case best == -1 || p < best:
				best, out = p, []*endpointv3.LbEndpoint{e}
			case p == best:
				out = append(out, e)
			}
		}
	}
	return out
}

func healthy(h corev3.HealthStatus) bool {
	return h == corev3.HealthStatus_UNKNOWN || h == corev3.HealthStatus_HEALTHY || h == corev3.HealthStatus_DEGRADED
}

func endpointAddress(e *endpointv3.LbEndpoint) string {
	sa := e.GetEndpoint().GetAddress().GetSocketAddress()
	if sa == nil {
		if p := e.GetEndpoint().GetAddress().GetPipe(); p != nil {
			return "unix:" + p.GetPath()
		}
		if ia := e.GetEndpoint().GetAddress().GetEnvoyInternalAddress(); ia != nil {
			return "internal:" + ia.GetServerListenerName()
		}
		return ""
	}
	return net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
}

// transport picks the cluster's transport socket for the endpoint (transport_socket_matches
// by the endpoint's "envoy.transport_socket_match" metadata, else transport_socket) and the
// upstream HTTP protocol.
func (s *Simulator) transport(res *Result, c *clusterv3.Cluster, ep *endpointv3.LbEndpoint) error {
	ts, match := c.GetTransportSocket(), ""
	if len(c.GetTransportSocketMatches()) > 0 {
		var md *structpb.Struct
		if ep != nil {
			md = ep.GetMetadata().GetFilterMetadata()["envoy.transport_socket_match"]
		}
		for _, m := range c.GetTransportSocketMatches() {
			if subsetOf(m.GetMatch(), md) {
				ts, match = m.GetTransportSocket(), m.GetName()
				break
			}
		}
	}
	res.UpstreamTLS = nil
	if ts != nil && (ts.GetName() == tlsSocket || ts.GetTypedConfig().MessageIs(&tlsv3.UpstreamTlsContext{})) {
		u := &tlsv3.UpstreamTlsContext{}
		if err := ts.GetTypedConfig().UnmarshalTo(u); err != nil {
			return fail(res, ErrInvalid, "cluster %s transport socket: %v", c.GetName(), err)
		}
		res.UpstreamTLS = &UpstreamTLS{SNI: u.GetSni(), ALPN: u.GetCommonTlsContext().GetAlpnProtocols(), Match: match}
	}
	res.UpstreamProtocol = HTTP1
	if c.GetHttp2ProtocolOptions() != nil {
		res.UpstreamProtocol = HTTP2
	}
	if a, ok := c.GetTypedExtensionProtocolOptions()[httpProtocolOptions]; ok {
		o := &httpv3.HttpProtocolOptions{}
		if err := a.UnmarshalTo(o); err != nil {
			return fail(res, ErrInvalid, "cluster %s %s: %v", c.GetName(), httpProtocolOptions, err)
		}
		switch {
		case o.GetExplicitHttpConfig().GetHttp2ProtocolOptions() != nil:
			res.UpstreamProtocol = HTTP2
		case o.GetUseDownstreamProtocolConfig() != nil && res.downstreamH2:
			res.UpstreamProtocol = HTTP2
		case o.GetAutoConfig() != nil && res.UpstreamTLS != nil:
			res.UpstreamProtocol = "ALPN" // negotiated with the endpoint
		}
	}
	if res.NetworkFilter == tcpProxyName {
		res.UpstreamProtocol = TCP
	}
	return nil
}

// subsetOf: every field of match equals the same field of md (an empty match matches all).
func subsetOf(match, md *structpb.Struct) bool {
	for k, v := range match.GetFields() {
		got, ok := md.GetFields()[k]
		if !ok || fmt.Sprint(got.AsInterface()) != fmt.Sprint(v.AsInterface()) {
			return false
		}
	}
	return true
}
