package authz

import (
	"fmt"

	rbacpb "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	rbachttp "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	security "istio.io/api/security/v1beta1"

	"sailplane.dev/services/xds-server/internal/model"
)

// GRPCDenyFilter is the name istiod gives the DENY RBAC filter of proxyless servers (filter
// names must be unique in gRPC's filter chain).
const GRPCDenyFilter = HTTPRBACFilter + ".DENY"

// GRPC returns the RBAC HTTP filters of a proxyless gRPC server (gRFC A41), as istiod's gRPC
// generator builds them: DENY then ALLOW, policies named "<ns>-<name>-<rule>"; AUDIT and
// CUSTOM do not exist for gRPC. Unlike istiod, an ALLOW policy whose rules all fail to
// translate (or that has none) still installs the ALLOW filter, which then denies everything,
// as Envoy sidecars do; istiod leaves such a server open.
func (b *Builder) GRPC() []*hcmv3.HttpFilter {
	var out []*hcmv3.HttpFilter
	if rules := grpcRules(rbacpb.RBAC_DENY, b.policies.Deny); len(rules.GetPolicies()) > 0 {
		out = append(out, &hcmv3.HttpFilter{Name: GRPCDenyFilter,
			ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&rbachttp.RBAC{Rules: rules})}})
	}
	if len(b.policies.Allow) > 0 {
		out = append(out, &hcmv3.HttpFilter{Name: HTTPRBACFilter,
			ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&rbachttp.RBAC{Rules: grpcRules(rbacpb.RBAC_ALLOW, b.policies.Allow)})}})
	}
	return out
}

func grpcRules(action rbacpb.RBAC_Action, policies []model.Config[*security.AuthorizationPolicy]) *rbacpb.RBAC {
	rules := &rbacpb.RBAC{Action: action, Policies: map[string]*rbacpb.Policy{}}
	for _, p := range policies {
		for i, pol := range translatedRules(p, action == rbacpb.RBAC_ALLOW, false) {
			rules.Policies[fmt.Sprintf("%s-%s-%d", p.Namespace, p.Name, i)] = pol
		}
	}
	return rules
}
