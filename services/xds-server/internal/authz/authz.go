// Package authz translates Istio's AuthorizationPolicy and RequestAuthentication into the
// Envoy filters istiod puts on a workload's inbound chains: RBAC (HTTP and network), ext_authz
// for CUSTOM policies, and jwt_authn. Proxyless gRPC servers take the same HTTP filters.
package authz

import (
	"fmt"
	"iter"
	"maps"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbacpb "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	extauthzhttp "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	rbachttp "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	extauthztcp "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/ext_authz/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	rbactcp "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	security "istio.io/api/security/v1beta1"

	"sailplane.dev/services/xds-server/internal/model"
)

// Envoy filter names.
const (
	HTTPRBACFilter    = "envoy.filters.http.rbac"
	NetworkRBACFilter = "envoy.filters.network.rbac"
	httpExtAuthz      = "envoy.filters.http.ext_authz"
	networkExtAuthz   = "envoy.filters.network.ext_authz"
)

// Stat prefixes and metadata keys istiod uses, which dashboards and ext_authz read.
const (
	tcpStatPrefix          = "tcp."
	dryRunAllowPrefix      = "istio_dry_run_allow_"
	dryRunDenyPrefix       = "istio_dry_run_deny_"
	extAuthzShadowPrefix   = "istio_ext_authz_"
	shadowEffectivePolicy  = "shadow_effective_policy_id"
	extAuthzMatchPrefix    = "istio-ext-authz"
	badCustomActionSuffix  = "-deny-due-to-bad-CUSTOM-action"
	defaultExtAuthzTimeout = 600 // seconds
)

// Policies are the AuthorizationPolicies that apply to one workload, by action.
type Policies struct {
	Allow, Deny, Audit, Custom []model.Config[*security.AuthorizationPolicy]
}

// Empty reports whether no policy applies.
func (p Policies) Empty() bool {
	return len(p.Allow)+len(p.Deny)+len(p.Audit)+len(p.Custom) == 0
}

// Select lists the policies of snap that apply to a workload of namespace ns with labels:
// those of the root namespace and of ns whose selector (if any) matches. A policy with
// targetRef(s) is for Gateway API gateways and waypoints, not sidecars: istiod ignores it here.
func Select(snap *model.Snapshot, ns string, labels map[string]string) Policies {
	var out Policies
	root := snap.RootNamespace()
	for _, c := range snap.AuthorizationPolicies {
		if c.Namespace != root && c.Namespace != ns {
			continue
		}
		s := c.Spec
		if len(s.GetTargetRefs()) > 0 || s.GetTargetRef() != nil || !selects(s.GetSelector().GetMatchLabels(), labels) {
			continue
		}
		switch s.GetAction() {
		case security.AuthorizationPolicy_ALLOW:
			out.Allow = append(out.Allow, c)
		case security.AuthorizationPolicy_DENY:
			out.Deny = append(out.Deny, c)
		case security.AuthorizationPolicy_AUDIT:
			out.Audit = append(out.Audit, c)
		case security.AuthorizationPolicy_CUSTOM:
			out.Custom = append(out.Custom, c)
		}
	}
	return out
}

// SelectorLabelKeys lists the label keys the selectors of AuthorizationPolicies,
// RequestAuthentications and PeerAuthentications name, sorted: a workload's inbound security
// settings depend on its labels only through them.
func SelectorLabelKeys(snap *model.Snapshot) []string {
	keys := map[string]bool{}
	for _, c := range snap.AuthorizationPolicies {
		for k := range c.Spec.GetSelector().GetMatchLabels() {
			keys[k] = true
		}
	}
	for _, c := range snap.RequestAuthentications {
		for k := range c.Spec.GetSelector().GetMatchLabels() {
			keys[k] = true
		}
	}
	for _, c := range snap.PeerAuthentications {
		for k := range c.Spec.GetSelector().GetMatchLabels() {
			keys[k] = true
		}
	}
	return slices.Sorted(maps.Keys(keys))
}

func selects(selector, labels map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// Builder builds the authorization filters of one workload.
type Builder struct {
	policies Policies
	snap     *model.Snapshot
	ns       string
	labels   map[string]string
}

// NewBuilder returns the builder for a workload of namespace ns with labels.
func NewBuilder(snap *model.Snapshot, ns string, labels map[string]string) *Builder {
	return &Builder{policies: Select(snap, ns, labels), snap: snap, ns: ns, labels: labels}
}

// HTTP returns the HTTP filters, in istiod's order: CUSTOM (RBAC in shadow mode feeding
// ext_authz), then AUDIT, DENY and ALLOW RBAC. JWT authentication goes between CUSTOM and
// the rest (see JWTFilter).
func (b *Builder) HTTP() (custom, local []*hcmv3.HttpFilter) {
	for _, f := range b.custom(false) {
		custom = append(custom, &hcmv3.HttpFilter{Name: f.name, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(f.http)}})
	}
	for _, set := range b.local(false) {
		// istiod writes the prefix even without shadow rules (that of ALLOW then).
		cfg := &rbachttp.RBAC{Rules: set.rules, ShadowRules: set.shadow, ShadowRulesStatPrefix: shadowStatPrefix(set.shadow.GetAction())}
		local = append(local, &hcmv3.HttpFilter{Name: HTTPRBACFilter, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(cfg)}})
	}
	return custom, local
}

// TCP returns the network filters for a TCP chain, before its tcp_proxy: CUSTOM with a gRPC
// provider, then AUDIT, DENY and ALLOW. HTTP-only conditions cannot be checked here: an ALLOW
// rule using them is dropped, a DENY rule loses them and so denies more.
func (b *Builder) TCP() []*listenerv3.Filter {
	var out []*listenerv3.Filter
	for _, f := range b.custom(true) {
		if f.tcp == nil {
			continue
		}
		out = append(out, &listenerv3.Filter{Name: f.name, ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(f.tcp)}})
	}
	for _, set := range b.local(true) {
		cfg := &rbactcp.RBAC{Rules: set.rules, StatPrefix: tcpStatPrefix, ShadowRules: set.shadow,
			ShadowRulesStatPrefix: shadowStatPrefix(set.shadow.GetAction())}
		out = append(out, &listenerv3.Filter{Name: NetworkRBACFilter, ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(cfg)}})
	}
	return out
}

func shadowStatPrefix(a rbacpb.RBAC_Action) string {
	switch a {
	case rbacpb.RBAC_ALLOW:
		return dryRunAllowPrefix
	case rbacpb.RBAC_DENY:
		return dryRunDenyPrefix
	}
	return ""
}

// ruleSet is one RBAC filter's enforced and dry-run rules; either may be nil.
type ruleSet struct{ rules, shadow *rbacpb.RBAC }

func (b *Builder) local(tcp bool) []ruleSet {
	var out []ruleSet
	for _, g := range []struct {
		policies []model.Config[*security.AuthorizationPolicy]
		action   rbacpb.RBAC_Action
	}{
		{b.policies.Audit, rbacpb.RBAC_LOG},
		{b.policies.Deny, rbacpb.RBAC_DENY},
		{b.policies.Allow, rbacpb.RBAC_ALLOW},
	} {
		if len(g.policies) == 0 {
			continue
		}
		var set ruleSet
		for _, p := range g.policies {
			// The istio.io/dry-run annotation (shadow rules) is not carried on the bus yet.
			if set.rules == nil {
				set.rules = &rbacpb.RBAC{Action: g.action, Policies: map[string]*rbacpb.Policy{}}
			}
			addPolicies(set.rules.Policies, p, "", g.action == rbacpb.RBAC_ALLOW, tcp)
		}
		out = append(out, set)
	}
	return out
}

// addPolicies adds one RBAC policy per rule of p, named as istiod names them; a policy
// without rules gets one that never matches (so an ALLOW policy without rules denies all).
func addPolicies(into map[string]*rbacpb.Policy, p model.Config[*security.AuthorizationPolicy], prefix string, allow, tcp bool) {
	for i, pol := range translatedRules(p, allow, tcp) {
		into[policyName(prefix, p.Namespace, p.Name, i)] = pol
	}
	if len(p.Spec.GetRules()) == 0 {
		into[policyName(prefix, p.Namespace, p.Name, 0)] = matchNever()
	}
}

// translatedRules yields each rule of p Envoy can check, by index; a rule that cannot be
// translated is skipped.
func translatedRules(p model.Config[*security.AuthorizationPolicy], allow, tcp bool) iter.Seq2[int, *rbacpb.Policy] {
	return func(yield func(int, *rbacpb.Policy) bool) {
		for i, r := range p.Spec.GetRules() {
			if r == nil {
				continue
			}
			m, err := newRuleModel(p.Namespace, r)
			if err != nil {
				continue
			}
			pol, err := m.policy(tcp, allow)
			if err != nil {
				continue
			}
			if !yield(i, pol) {
				return
			}
		}
	}
}

func policyName(prefix, ns, name string, rule int) string {
	return fmt.Sprintf("%sns[%s]-policy[%s]-rule[%d]", prefix, ns, name, rule)
}

func matchNever() *rbacpb.Policy {
	return &rbacpb.Policy{
		Permissions: []*rbacpb.Permission{{Rule: &rbacpb.Permission_NotRule{NotRule: permAny()}}},
		Principals:  []*rbacpb.Principal{{Identifier: &rbacpb.Principal_NotId{NotId: princAny()}}},
	}
}

// customFilter is one CUSTOM provider's pair of filters (RBAC shadow + ext_authz), or the
// RBAC deny that replaces them when the provider is unusable.
type customFilter struct {
	name string
	http proto.Message
	tcp  proto.Message
}

// custom builds, per provider named by a CUSTOM policy (sorted), the RBAC filter whose shadow
// rules record which policy matched and the ext_authz filter that runs only then. A provider
// that is missing or invalid turns its policies into DENY rules, so nothing is let through by
// a broken configuration.
func (b *Builder) custom(tcp bool) []customFilter {
	if len(b.policies.Custom) == 0 {
		return nil
	}
	byProvider := map[string]*rbacpb.RBAC{}
	for _, p := range b.policies.Custom {
		name := p.Spec.GetProvider().GetName()
		set := byProvider[name]
		if set == nil {
			set = &rbacpb.RBAC{Action: rbacpb.RBAC_DENY, Policies: map[string]*rbacpb.Policy{}}
			byProvider[name] = set
		}
		addPolicies(set.Policies, p, extAuthzMatchPrefix+"-"+name+"-", false, tcp)
	}
	providers := slices.Sorted(maps.Keys(byProvider))
	var out []customFilter
	deny := func(rules *rbacpb.RBAC) {
		d := &rbacpb.RBAC{Action: rbacpb.RBAC_DENY, Policies: map[string]*rbacpb.Policy{}}
		for k, v := range rules.Policies {
			d.Policies[k+badCustomActionSuffix] = v
		}
		if tcp {
			out = append(out, customFilter{name: NetworkRBACFilter, tcp: &rbactcp.RBAC{Rules: d, StatPrefix: tcpStatPrefix}})
		} else {
			out = append(out, customFilter{name: HTTPRBACFilter, http: &rbachttp.RBAC{Rules: d}})
		}
	}
	if len(providers) > 1 {
		// istiod allows one provider per workload unless a feature flag is set.
		for _, name := range providers {
			deny(byProvider[name])
		}
		return out
	}
	for _, name := range providers {
		rules := byProvider[name]
		ext, err := b.extAuthz(name)
		if err != nil {
			deny(rules)
			continue
		}
		enabled := &matcherv3.MetadataMatcher{
			Filter: HTTPRBACFilter,
			Path:   metadataPath(extAuthzShadowPrefix + shadowEffectivePolicy),
			Value: &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_StringMatch{
				StringMatch: prefixMatcher(extAuthzMatchPrefix+"-"+name, false)}},
		}
		if tcp {
			if ext.tcp == nil {
				continue
			}
			enabled.Filter = NetworkRBACFilter
			ext.tcp.FilterEnabledMetadata = enabled
			out = append(out,
				customFilter{name: NetworkRBACFilter, tcp: &rbactcp.RBAC{ShadowRules: rules, StatPrefix: tcpStatPrefix, ShadowRulesStatPrefix: extAuthzShadowPrefix}},
				customFilter{name: networkExtAuthz, tcp: ext.tcp})
			continue
		}
		ext.http.FilterEnabledMetadata = enabled
		out = append(out,
			customFilter{name: HTTPRBACFilter, http: &rbachttp.RBAC{ShadowRules: rules, ShadowRulesStatPrefix: extAuthzShadowPrefix}},
			customFilter{name: httpExtAuthz, http: ext.http})
	}
	return out
}

type extAuthz struct {
	http *extauthzhttp.ExtAuthz
	tcp  *extauthztcp.ExtAuthz
}

// extAuthz builds the ext_authz configs of meshConfig.extensionProviders[name].
func (b *Builder) extAuthz(name string) (*extAuthz, error) {
	var found *meshv1alpha1.MeshConfig_ExtensionProvider
	for _, p := range b.snap.Mesh.GetExtensionProviders() {
		if p.GetName() == name {
			if found != nil {
				return nil, fmt.Errorf("extension provider name must be unique, found duplicate: %s", name)
			}
			found = p
		}
	}
	if found == nil {
		return nil, fmt.Errorf("extension provider %q is not defined in meshConfig.extensionProviders", name)
	}
	switch p := found.GetProvider().(type) {
	case *meshv1alpha1.MeshConfig_ExtensionProvider_EnvoyExtAuthzHttp:
		c := p.EnvoyExtAuthzHttp
		host, cluster, err := b.lookupCluster(c.GetService(), c.GetPort())
		if err != nil {
			return nil, err
		}
		status, err := statusOnError(c.GetStatusOnError())
		if err != nil {
			return nil, err
		}
		for _, hs := range [][]string{c.GetIncludeRequestHeadersInCheck(), c.GetIncludeHeadersInCheck(), c.GetHeadersToDownstreamOnDeny(),
			c.GetHeadersToDownstreamOnAllow(), c.GetHeadersToUpstreamOnAllow()} {
			if slices.Contains(hs, "*") {
				return nil, fmt.Errorf("extension provider %q: a single wildcard header is not supported", name)
			}
		}
		if pp := c.GetPathPrefix(); pp != "" && !strings.HasPrefix(pp, "/") {
			return nil, fmt.Errorf("extension provider %q: pathPrefix must begin with `/`, found: %q", name, pp)
		}
		svc := &extauthzhttp.HttpService{
			PathPrefix: c.GetPathPrefix(),
			ServerUri: &corev3.HttpUri{Uri: "http://" + host, Timeout: timeoutOr(c.GetTimeout()),
				HttpUpstreamType: &corev3.HttpUri_Cluster{Cluster: cluster}},
		}
		var add []*corev3.HeaderValue
		for _, k := range slices.Sorted(maps.Keys(c.GetIncludeAdditionalHeadersInCheck())) {
			add = append(add, &corev3.HeaderValue{Key: k, Value: c.GetIncludeAdditionalHeadersInCheck()[k]})
		}
		if len(add) > 0 {
			svc.AuthorizationRequest = &extauthzhttp.AuthorizationRequest{HeadersToAdd: add}
		}
		if len(c.GetHeadersToUpstreamOnAllow()) > 0 || len(c.GetHeadersToDownstreamOnDeny()) > 0 || len(c.GetHeadersToDownstreamOnAllow()) > 0 {
			svc.AuthorizationResponse = &extauthzhttp.AuthorizationResponse{
				AllowedUpstreamHeaders:        headerList(c.GetHeadersToUpstreamOnAllow()),
				AllowedClientHeaders:          headerList(c.GetHeadersToDownstreamOnDeny()),
				AllowedClientHeadersOnSuccess: headerList(c.GetHeadersToDownstreamOnAllow()),
			}
		}
		allowed := c.GetIncludeRequestHeadersInCheck()
		if len(allowed) == 0 {
			allowed = c.GetIncludeHeadersInCheck()
		}
		h := &extauthzhttp.ExtAuthz{
			StatusOnError: status, FailureModeAllow: c.GetFailOpen(), TransportApiVersion: corev3.ApiVersion_V3,
			Services:        &extauthzhttp.ExtAuthz_HttpService{HttpService: svc},
			WithRequestBody: bodySettings(c.GetIncludeRequestBodyInCheck()),
			AllowedHeaders:  headerList(allowed),
		}
		return &extAuthz{http: h}, nil
	case *meshv1alpha1.MeshConfig_ExtensionProvider_EnvoyExtAuthzGrpc:
		c := p.EnvoyExtAuthzGrpc
		host, cluster, err := b.lookupCluster(c.GetService(), c.GetPort())
		if err != nil {
			return nil, err
		}
		status, err := statusOnError(c.GetStatusOnError())
		if err != nil {
			return nil, err
		}
		grpc := &corev3.GrpcService{
			TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: cluster, Authority: host}},
			Timeout:         timeoutOr(c.GetTimeout()),
		}
		return &extAuthz{
			http: &extauthzhttp.ExtAuthz{StatusOnError: status, FailureModeAllow: c.GetFailOpen(),
				Services:            &extauthzhttp.ExtAuthz_GrpcService{GrpcService: grpc},
				TransportApiVersion: corev3.ApiVersion_V3, WithRequestBody: bodySettings(c.GetIncludeRequestBodyInCheck())},
			tcp: &extauthztcp.ExtAuthz{StatPrefix: tcpStatPrefix, FailureModeAllow: c.GetFailOpen(),
				TransportApiVersion: corev3.ApiVersion_V3, GrpcService: proto.Clone(grpc).(*corev3.GrpcService)},
		}, nil
	}
	return nil, fmt.Errorf("extension provider %q is not an ext_authz provider", name)
}

// lookupCluster finds the outbound cluster of an extension provider's service ("host" or
// "ns/host", a short name in any namespace).
func (b *Builder) lookupCluster(service string, port uint32) (host, cluster string, err error) {
	if port < 1 || port > 65535 {
		return "", "", fmt.Errorf("port must be in the range [1, 65535], found: %d", port)
	}
	ns, h, ok := strings.Cut(service, "/")
	if !ok {
		ns, h = "", service
	}
	if b.snap.Services[h] != nil {
		host = h
	} else {
		for _, name := range b.snap.Hostnames() {
			svc := b.snap.Services[name].Spec
			if (ns == "" || ns == svc.GetNamespace()) && strings.HasPrefix(name, h+".") {
				host = name
				break
			}
		}
	}
	if host == "" {
		return "", "", fmt.Errorf("could not find service %s in Istio service registry", service)
	}
	return host, fmt.Sprintf("outbound|%d||%s", port, host), nil
}

func statusOnError(s string) (*typev3.HttpStatus, error) {
	if s == "" {
		return nil, nil
	}
	var code int32
	if _, err := fmt.Sscanf(s, "%d", &code); err != nil {
		return nil, fmt.Errorf("invalid statusOnError %q: %w", s, err)
	}
	if _, ok := typev3.StatusCode_name[code]; !ok {
		return nil, fmt.Errorf("unsupported statusOnError %s", s)
	}
	return &typev3.HttpStatus{Code: typev3.StatusCode(code)}, nil
}

func timeoutOr(d *durationpb.Duration) *durationpb.Duration {
	if d == nil {
		return durationpb.New(defaultExtAuthzTimeout * 1e9)
	}
	return d
}

func bodySettings(c *meshv1alpha1.MeshConfig_ExtensionProvider_EnvoyExternalAuthorizationRequestBody) *extauthzhttp.BufferSettings {
	if c == nil {
		return nil
	}
	return &extauthzhttp.BufferSettings{MaxRequestBytes: c.GetMaxRequestBytes(), AllowPartialMessage: c.GetAllowPartialMessage(), PackAsBytes: c.GetPackAsBytes()}
}

func headerList(hs []string) *matcherv3.ListStringMatcher {
	if len(hs) == 0 {
		return nil
	}
	out := &matcherv3.ListStringMatcher{}
	for _, h := range hs {
		m := &matcherv3.StringMatcher{IgnoreCase: true, MatchPattern: &matcherv3.StringMatcher_Exact{Exact: h}}
		if after, ok := strings.CutPrefix(h, "*"); ok {
			m.MatchPattern = &matcherv3.StringMatcher_Suffix{Suffix: after}
		} else if before, ok := strings.CutSuffix(h, "*"); ok {
			m.MatchPattern = &matcherv3.StringMatcher_Prefix{Prefix: before}
		}
		out.Patterns = append(out.Patterns, m)
	}
	return out
}

// mustAny packs m with a stable byte encoding (RBAC policies and JWT providers are maps), so
// equal configs encode equally and proxies can share cached output.
func mustAny(m proto.Message) *anypb.Any {
	a := &anypb.Any{}
	if err := anypb.MarshalFrom(a, m, proto.MarshalOptions{Deterministic: true}); err != nil {
		panic(err)
	}
	return a
}
