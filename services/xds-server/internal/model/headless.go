package model

import (
	"strings"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
)

// ListensPerEndpoint reports whether sidecars reach the service through one outbound
// listener per endpoint address ("<ip>_<port>"), as istiod builds them: a service without
// VIP nor resolution (a Kubernetes headless service, a ServiceEntry with resolution NONE)
// that has a port not declared HTTP. Its listeners then depend on its endpoints.
func ListensPerEndpoint(svc *discoveryv1.Service) bool {
	if svc.GetResolution() != discoveryv1.Resolution_NONE || hasVIP(svc) {
		return false
	}
	for _, p := range svc.GetPorts() {
		if !IsHTTPProtocol(p.GetProtocol()) {
			return true
		}
	}
	return false
}

func hasVIP(svc *discoveryv1.Service) bool {
	a := svc.GetAddresses()
	return len(a) > 0 && a[0] != "" && a[0] != "0.0.0.0"
}

// IsHTTPProtocol reports whether an Istio protocol name declares HTTP (HTTP/1.1, HTTP/2, gRPC).
func IsHTTPProtocol(p string) bool {
	switch strings.ToUpper(p) {
	case "HTTP", "HTTP_PROXY", "HTTP2", "GRPC", "GRPC-WEB":
		return true
	}
	return false
}

// CarriesHTTP reports whether HTTP routes apply to a port of Istio protocol p, as istiod's
// IsHTTPOrSniffed: declared HTTP, or not declared at all (a name Istio does not know counts
// as undeclared, and is sniffed).
func CarriesHTTP(p string) bool {
	switch strings.ToUpper(p) {
	case "TCP", "TLS", "HTTPS", "MONGO", "REDIS", "MYSQL", "UDP":
		return false
	}
	return true
}

// NamesEndpoints reports whether the name table answers a service's name with its endpoints'
// addresses (and, for Kubernetes, names each pod): a service without VIP nor resolution. Its
// name table entries then depend on its endpoints.
func NamesEndpoints(svc *discoveryv1.Service) bool {
	return svc.GetResolution() == discoveryv1.Resolution_NONE && !hasVIP(svc)
}
