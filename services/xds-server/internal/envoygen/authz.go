package envoygen

import (
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"

	"sailplane.dev/services/xds-server/internal/authz"
)

// inboundFilters are the security filters of the workload's inbound chains (a gateway's
// chains, for gateways).
type inboundFilters struct {
	*authz.Builder
	gateway bool
}

func (b *builder) inboundAuthz() inboundFilters {
	return inboundFilters{authz.NewBuilder(b.snap, b.proxy.Namespace, b.proxy.Labels), b.proxy.IsRouter()}
}

// HTTP lists the HTTP filters in istiod's order: CUSTOM, then authentication (JWT), then
// AUDIT, DENY and ALLOW.
func (f inboundFilters) HTTP() []*hcmv3.HttpFilter {
	custom, local := f.Builder.HTTP()
	out := append(custom, f.Builder.JWT(f.gateway)...)
	return append(out, local...)
}
