package envoygen

import (
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/xds-server/internal/model"
)

// protocol is how a port's traffic is handled.
type protocol int

const (
	protoTCP protocol = iota
	protoHTTP
	protoHTTP2 // HTTP/2 and gRPC: upstream connections use h2
	protoTLS   // TLS and HTTPS: opaque to the proxy, routed by SNI at most
	// protoSniffed is a port whose protocol is not declared (istiod's "auto"): sidecars detect
	// plaintext HTTP per connection with http_inspector, route it like an HTTP port and pass
	// everything else on as TCP, upstream in the protocol the client spoke.
	protoSniffed
)

// portProtocol reads the Istio protocol of a registry port. The registry has already read
// what the platform declares (a Kubernetes port's appProtocol or name prefix); empty means
// undeclared.
func portProtocol(p *discoveryv1.Port) protocol {
	return parseProtocol(p.GetProtocol())
}

// parseProtocol reads an Istio protocol name; none, or one Istio does not know, is sniffed,
// as in istiod.
func parseProtocol(proto string) protocol {
	s := strings.ToUpper(proto)
	switch s {
	case "HTTP", "HTTP_PROXY":
		return protoHTTP
	case "HTTP2", "GRPC", "GRPC-WEB":
		return protoHTTP2
	case "TLS", "HTTPS":
		return protoTLS
	}
	if model.CarriesHTTP(s) {
		return protoSniffed
	}
	return protoTCP
}

func (p protocol) isHTTP() bool { return p == protoHTTP || p == protoHTTP2 }

// listenerProtocol names the kind of listener the port needs as istiod's conflict messages do:
// HTTP, TCP, or UNKNOWN for a sniffed port.
func (p protocol) listenerProtocol() string {
	switch {
	case p.isHTTP():
		return "HTTP"
	case p == protoSniffed:
		return "UNKNOWN"
	}
	return "TCP"
}

// carriesHTTP reports whether HTTP routes apply to the port: declared HTTP, or sniffed.
func (p protocol) carriesHTTP() bool { return p.isHTTP() || p == protoSniffed }

// downstreamProtocolOptions makes a cluster speak upstream the HTTP version the client spoke,
// as istiod does for sniffed ports and passthrough: h2 stays h2, HTTP/1.1 stays HTTP/1.1.
func downstreamProtocolOptions(common *corev3.HttpProtocolOptions) map[string]*anyMsg {
	return map[string]*anyMsg{httpProtocolOptionsKey: mustAny(downstreamHTTPOptions(common))}
}

// downstreamHTTPOptions are downstreamProtocolOptions before packing.
func downstreamHTTPOptions(common *corev3.HttpProtocolOptions) *httpv3.HttpProtocolOptions {
	return &httpv3.HttpProtocolOptions{
		CommonHttpProtocolOptions: common,
		UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_UseDownstreamProtocolConfig{
			UseDownstreamProtocolConfig: &httpv3.HttpProtocolOptions_UseDownstreamHttpConfig{
				HttpProtocolOptions:  &corev3.Http1ProtocolOptions{},
				Http2ProtocolOptions: &corev3.Http2ProtocolOptions{},
			}},
	}
}
