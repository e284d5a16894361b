package grpcgen

import (
	"net"
	"slices"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"sailplane.dev/services/xds-server/internal/authn"
	"sailplane.dev/services/xds-server/internal/authz"
	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/services/xds-server/internal/translate"
)

// Server listener names: a gRPC server built with xds.NewGRPCServer asks for the listener of
// the address it serves on, through its bootstrap's server_listener_resource_name_template:
// istio-agent writes istiod's prefix; without a template gRPC uses its own default.
const (
	IstioServerListenerPrefix = "xds.istio.io/grpc/lds/inbound/"
	GRPCServerListenerPrefix  = "grpc/server?xds.resource.listening_address="
)

// Server is what a proxyless gRPC server's listeners depend on.
type Server struct {
	Namespace string
	Labels    map[string]string
	// IPs are the workload's addresses; services whose endpoints are at one of them give
	// the ports it serves.
	IPs []string
}

// ServerPorts lists, sorted, the workload ports of the services with an endpoint at one of
// srv's IPs.
func ServerPorts(snap *model.Snapshot, srv Server) []uint32 {
	// The snapshot's address index answers the common case, a pure client, without a scan.
	if snap.ProxyEndpoint(&model.Proxy{IPs: srv.IPs}) == nil {
		return nil
	}
	var out []uint32
	for _, h := range snap.Hostnames() {
		svc := snap.Services[h]
		for _, ep := range svc.Endpoints {
			if !slices.Contains(srv.IPs, ep.GetAddress()) {
				continue
			}
			for _, p := range svc.Spec.GetPorts() {
				if t := translate.EndpointPort(ep, p); t != 0 && !slices.Contains(out, t) {
					out = append(out, t)
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// ServerListeners are the server-side listeners of srv, for every port it serves and every
// address it may listen on (its IPs and the wildcards), under both name forms, as istiod's
// gRPC generator builds them: one chain whose HTTP manager holds the RBAC filters of the
// AuthorizationPolicies selecting the workload, and a route that serves locally
// (NonForwardingAction). The chain terminates mutual TLS when PeerAuthentication makes the
// port STRICT, or PERMISSIVE on a workload labelled in the mesh (its clients use mTLS);
// otherwise it is plaintext: gRPC servers cannot tell TLS from plaintext on one port (gRFC A36
// drops chains matching a transport protocol), so PERMISSIVE cannot accept both.
func ServerListeners(snap *model.Snapshot, srv Server) []*listenerv3.Listener {
	ports := ServerPorts(snap, srv)
	if len(ports) == 0 {
		return nil
	}
	filters := authz.NewBuilder(snap, srv.Namespace, srv.Labels).GRPC()
	peer := authn.ForWorkload(snap, srv.Namespace, srv.Labels)
	var plaintext, mtls *listenerv3.FilterChain
	var out []*listenerv3.Listener
	hosts := append(slices.Clone(srv.IPs), "0.0.0.0", "::")
	for _, port := range ports {
		var chain *listenerv3.FilterChain
		if serverMTLS(peer.ModeFor(port), srv.Labels) {
			if mtls == nil {
				mtls = serverChain("mtls", filters, serverTLS())
			}
			chain = mtls
		} else {
			if plaintext == nil {
				plaintext = serverChain("plaintext", filters, nil)
			}
			chain = plaintext
		}
		for _, host := range hosts {
			addr := net.JoinHostPort(host, strconv.FormatUint(uint64(port), 10))
			for _, prefix := range []string{IstioServerListenerPrefix, GRPCServerListenerPrefix} {
				out = append(out, &listenerv3.Listener{
					Name:         prefix + addr,
					Address:      translate.SocketAddress(host, port),
					FilterChains: []*listenerv3.FilterChain{chain},
				})
			}
		}
	}
	slices.SortFunc(out, func(a, b *listenerv3.Listener) int { return strings.Compare(a.GetName(), b.GetName()) })
	return out
}

// serverMTLS is istiod's choice for a gRPC server port in mode: mutual TLS when STRICT, and
// when PERMISSIVE on a workload whose label tells clients to use mTLS.
func serverMTLS(mode authn.Mode, labels map[string]string) bool {
	return mode == authn.Strict || mode == authn.Permissive && labels[model.TLSModeLabel] == "istio"
}

// serverTLS is the server side of mesh mTLS: the workload's certificate and roots from its
// "default" certificate provider, a client certificate required. gRPC refuses SAN matchers
// on servers; AuthorizationPolicy principals check the caller instead.
func serverTLS() *corev3.TransportSocket {
	return tlsTransportSocket(&tlsv3.DownstreamTlsContext{
		CommonTlsContext:         meshTLSContext(nil),
		RequireClientCertificate: wrapperspb.Bool(true),
	})
}

func serverChain(kind string, filters []*hcmv3.HttpFilter, tls *corev3.TransportSocket) *listenerv3.FilterChain {
	router, _ := marshalAny(&routerv3.Router{})
	hcm := &hcmv3.HttpConnectionManager{
		StatPrefix: "inbound",
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
			Name: "inbound",
			VirtualHosts: []*routev3.VirtualHost{{
				Name:    "inbound",
				Domains: []string{"*"},
				Routes: []*routev3.Route{{
					Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
					Action: &routev3.Route_NonForwardingAction{NonForwardingAction: &routev3.NonForwardingAction{}},
				}},
			}},
		}},
		HttpFilters: append(slices.Clone(filters),
			&hcmv3.HttpFilter{Name: RouterFilterName, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: router}}),
	}
	a, _ := marshalAny(hcm)
	return &listenerv3.FilterChain{
		Name:            "inbound-" + kind,
		Filters:         []*listenerv3.Filter{{Name: "inbound-hcm" + kind, ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: a}}},
		TransportSocket: tls,
	}
}
