package envoygen

import (
	"strings"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
)

// protocol is how a port's traffic is handled.
type protocol int

const (
	protoTCP protocol = iota
	protoHTTP
	protoHTTP2 // HTTP/2 and gRPC: upstream connections use h2
	protoTLS   // TLS and HTTPS: opaque to the proxy, routed by SNI at most
)

// portProtocol reads the Istio protocol of a port, falling back to the port name's prefix
// ("http-web", "grpc") like Istio does for services that declare none.
func portProtocol(p *discoveryv1.Port) protocol {
	return parseProtocol(p.GetProtocol(), p.GetName())
}

func parseProtocol(proto, name string) protocol {
	s := strings.ToUpper(proto)
	if s == "" {
		s, _, _ = strings.Cut(strings.ToUpper(name), "-")
	}
	switch s {
	case "HTTP", "HTTP_PROXY":
		return protoHTTP
	case "HTTP2", "GRPC", "GRPC-WEB":
		return protoHTTP2
	case "TLS", "HTTPS":
		return protoTLS
	}
	return protoTCP
}

func (p protocol) isHTTP() bool { return p == protoHTTP || p == protoHTTP2 }
