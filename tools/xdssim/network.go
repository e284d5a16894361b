package xdssim

import (
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
)

const (
	hcmName      = "envoy.filters.network.http_connection_manager"
	tcpProxyName = "envoy.filters.network.tcp_proxy"
	tlsSocket    = "envoy.transport_sockets.tls"
)

// network runs the filter chain: its transport socket, then its terminal network filter.
func (s *Simulator) network(res *Result, fc *listenerv3.FilterChain, req Request) error {
	terminates, err := downstreamTLS(res, fc)
	if err != nil {
		return err
	}
	if terminates && !req.TLS {
		return fail(res, ErrTLSMismatch, "filter chain %s terminates TLS; the request is plaintext", res.FilterChain)
	}
	for _, f := range fc.GetFilters() {
		switch {
		case f.GetName() == hcmName || f.GetTypedConfig().MessageIs(&hcmv3.HttpConnectionManager{}):
			if req.Protocol == TCP {
				return fail(res, ErrUnsupported, "filter chain %s speaks HTTP; the request is raw TCP", res.FilterChain)
			}
			if req.TLS && !terminates {
				return fail(res, ErrTLSMismatch, "filter chain %s speaks plaintext HTTP; the request is TLS", res.FilterChain)
			}
			hcm := &hcmv3.HttpConnectionManager{}
			if err := f.GetTypedConfig().UnmarshalTo(hcm); err != nil {
				return fail(res, ErrInvalid, "listener %s: %v", res.Listener, err)
			}
			res.NetworkFilter = hcmName
			return s.http(res, hcm, req)
		case f.GetName() == tcpProxyName || f.GetTypedConfig().MessageIs(&tcpv3.TcpProxy{}):
			tp := &tcpv3.TcpProxy{}
			if err := f.GetTypedConfig().UnmarshalTo(tp); err != nil {
				return fail(res, ErrInvalid, "listener %s: %v", res.Listener, err)
			}
			res.NetworkFilter = tcpProxyName
			res.Action = Forward
			cluster := tp.GetCluster()
			if wc := tp.GetWeightedClusters(); wc != nil {
				var ws []weighted
				for _, c := range wc.GetClusters() {
					ws = append(ws, weighted{c.GetName(), c.GetWeight()})
					res.WeightedClusters = append(res.WeightedClusters, WeightedCluster{c.GetName(), c.GetWeight()})
				}
				cluster = pickWeighted(ws, req.Pick)
			}
			if tp.GetIdleTimeout() != nil {
				res.IdleTimeout = durationOf(tp.GetIdleTimeout())
			}
			return s.upstream(res, cluster, req)
		}
	}
	return fail(res, ErrUnsupported, "listener %s filter chain %s: no http_connection_manager or tcp_proxy", res.Listener, res.FilterChain)
}

func downstreamTLS(res *Result, fc *listenerv3.FilterChain) (bool, error) {
	ts := fc.GetTransportSocket()
	if ts == nil || (ts.GetName() != tlsSocket && !ts.GetTypedConfig().MessageIs(&tlsv3.DownstreamTlsContext{})) {
		return false, nil
	}
	ctx := &tlsv3.DownstreamTlsContext{}
	if err := ts.GetTypedConfig().UnmarshalTo(ctx); err != nil {
		return false, fail(res, ErrInvalid, "filter chain %s transport socket: %v", res.FilterChain, err)
	}
	d := &DownstreamTLS{ALPN: ctx.GetCommonTlsContext().GetAlpnProtocols(), RequireClientCert: ctx.GetRequireClientCertificate().GetValue()}
	for _, c := range ctx.GetCommonTlsContext().GetTlsCertificateSdsSecretConfigs() {
		d.Certificates = append(d.Certificates, c.GetName())
	}
	if len(ctx.GetCommonTlsContext().GetTlsCertificates()) > 0 {
		d.Certificates = append(d.Certificates, "<inline>")
	}
	res.DownstreamTLS = d
	return true, nil
}

// http runs the HTTP connection manager: its route configuration, then the route.
func (s *Simulator) http(res *Result, hcm *hcmv3.HttpConnectionManager, req Request) error {
	var rc *routev3.RouteConfiguration
	switch {
	case hcm.GetRds() != nil:
		res.RouteConfig = hcm.GetRds().GetRouteConfigName()
		rc = s.routes[res.RouteConfig]
		if rc == nil {
			// Envoy waits for the RDS resource; until then no listener is active.
			return fail(res, ErrNoListener, "route configuration %q was not sent (the listener stays warming)", res.RouteConfig)
		}
	case hcm.GetRouteConfig() != nil:
		res.RouteConfig, rc = "<inline>", hcm.GetRouteConfig()
	default:
		return fail(res, ErrUnsupported, "listener %s: scoped routes", res.Listener)
	}
	hreq, err := newHTTPRequest(hcm, req)
	if err != nil {
		return fail(res, ErrInvalid, "%v", err)
	}
	return s.route(res, rc, hcm, hreq, req)
}
