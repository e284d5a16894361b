// Package xdstype names the xDS resource types the way Istio's tools do (CDS, LDS, ...), for the
// debug endpoints, sailplanectl's tables and the metrics' type labels.
package xdstype

import "strings"

// Core are the types istioctl proxy-status shows, in its column order.
var Core = []struct{ URL, Short string }{
	{"type.googleapis.com/envoy.config.cluster.v3.Cluster", "CDS"},
	{"type.googleapis.com/envoy.config.listener.v3.Listener", "LDS"},
	{"type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment", "EDS"},
	{"type.googleapis.com/envoy.config.route.v3.RouteConfiguration", "RDS"},
	{"type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig", "ECDS"},
	{"type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret", "SDS"},
}

// Short is the short name of a core type URL ("CDS"), else the URL's last part.
func Short(url string) string {
	if s, ok := short(url); ok {
		return s
	}
	return url[strings.LastIndexAny(url, "/.")+1:]
}

// MetricLabel is istiod's type label: the short name in lower case ("cds") for a core type, else
// the whole URL.
func MetricLabel(url string) string {
	if s, ok := short(url); ok {
		return strings.ToLower(s)
	}
	return url
}

func short(url string) (string, bool) {
	if url == NameTable {
		return "NDS", true
	}
	for _, t := range Core {
		if t.URL == url {
			return t.Short, true
		}
	}
	return "", false
}

// NameTable is Istio's name table (NDS) type, which the agent's DNS proxy asks for when
// ISTIO_META_DNS_CAPTURE is on; its short name is NDS.
const NameTable = "type.googleapis.com/istio.networking.nds.v1.NameTable"
