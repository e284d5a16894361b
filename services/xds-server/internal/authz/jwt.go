package authz

import (
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	jwtv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/emptypb"
	security "istio.io/api/security/v1beta1"

	"sailplane.dev/services/xds-server/internal/model"
)

// jwksCacheDuration is how long Envoy keeps keys fetched from a jwksUri, as istiod sets it.
var jwksCacheDuration = durationpb.New(300e9)

// JWT returns the jwt_authn filter of the RequestAuthentications selecting the workload (root
// namespace and its own, by selector), or nothing. As in istiod, each JWT rule is a provider
// "origins-<i>"; a request without a token passes (AuthorizationPolicy decides), one with an
// invalid token is rejected. Keys: inline `jwks`, else those the xds-server fetched from
// `jwksUri` (snapshot JWKS), inlined as istiod does by default; until they are fetched, Envoy
// fetches them itself through the outbound cluster of the URI's host.
//
// clearRouteCache is set for gateways, as istiod does: routes may match on the claims the
// filter copies into headers.
func (b *Builder) JWT(clearRouteCache bool) []*hcmv3.HttpFilter {
	var rules []*security.JWTRule
	root := b.snap.RootNamespace()
	for _, c := range b.snap.RequestAuthentications {
		s := c.Spec
		if (c.Namespace != root && c.Namespace != b.ns) || len(s.GetTargetRefs()) > 0 || s.GetTargetRef() != nil ||
			!selects(s.GetSelector().GetMatchLabels(), b.labels) {
			continue
		}
		rules = append(rules, s.GetJwtRules()...)
	}
	if len(rules) == 0 {
		return nil
	}
	// By issuer, as istiod orders them, so provider names are stable.
	slices.SortStableFunc(rules, func(a, b *security.JWTRule) int { return strings.Compare(a.GetIssuer(), b.GetIssuer()) })
	cfg := &jwtv3.JwtAuthentication{Providers: map[string]*jwtv3.JwtProvider{}, BypassCorsPreflight: true}
	var inner, outer []*jwtv3.JwtRequirement
	for i, r := range rules {
		name := fmt.Sprintf("origins-%d", i)
		cfg.Providers[name] = jwtProvider(r, b.snap.JWKS)
		cfg.Providers[name].ClearRouteCache = clearRouteCache
		byName := &jwtv3.JwtRequirement{RequiresType: &jwtv3.JwtRequirement_ProviderName{ProviderName: name}}
		inner = append(inner, &jwtv3.JwtRequirement{RequiresType: &jwtv3.JwtRequirement_RequiresAny{RequiresAny: &jwtv3.JwtRequirementOrList{
			Requirements: []*jwtv3.JwtRequirement{byName,
				{RequiresType: &jwtv3.JwtRequirement_AllowMissing{AllowMissing: &emptypb.Empty{}}}}}}})
		outer = append(outer, &jwtv3.JwtRequirement{RequiresType: &jwtv3.JwtRequirement_ProviderName{ProviderName: name}})
	}
	req := inner[0]
	if len(inner) > 1 {
		// A token, if present, must be valid for one provider; several providers may read the
		// same header, so any single match also passes.
		outer = append(outer, &jwtv3.JwtRequirement{RequiresType: &jwtv3.JwtRequirement_RequiresAll{
			RequiresAll: &jwtv3.JwtRequirementAndList{Requirements: inner}}})
		req = &jwtv3.JwtRequirement{RequiresType: &jwtv3.JwtRequirement_RequiresAny{RequiresAny: &jwtv3.JwtRequirementOrList{Requirements: outer}}}
	}
	cfg.Rules = []*jwtv3.RequirementRule{{
		Match:           &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
		RequirementType: &jwtv3.RequirementRule_Requires{Requires: req},
	}}
	return []*hcmv3.HttpFilter{{Name: jwtFilter, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(cfg)}}}
}

// JWKSURIs lists, sorted, the jwksUris of RequestAuthentications without inline keys: the
// keys the xds-server fetches (see package jwks).
func JWKSURIs(snap *model.Snapshot) []string {
	var out []string
	for _, c := range snap.RequestAuthentications {
		for _, r := range c.Spec.GetJwtRules() {
			if r.GetJwks() == "" && r.GetJwksUri() != "" && !slices.Contains(out, r.GetJwksUri()) {
				out = append(out, r.GetJwksUri())
			}
		}
	}
	slices.Sort(out)
	return out
}

func jwtProvider(r *security.JWTRule, fetched map[string]string) *jwtv3.JwtProvider {
	claims := []string{"permission", "scope"}
	p := &jwtv3.JwtProvider{
		Issuer:                     r.GetIssuer(),
		Audiences:                  r.GetAudiences(),
		Forward:                    r.GetForwardOriginalToken(),
		ForwardPayloadHeader:       r.GetOutputPayloadToHeader(),
		PayloadInMetadata:          "payload",
		NormalizePayloadInMetadata: &jwtv3.JwtProvider_NormalizePayload{SpaceDelimitedClaims: claims},
		FromParams:                 r.GetFromParams(),
		FromCookies:                r.GetFromCookies(),
	}
	for _, ch := range r.GetOutputClaimToHeaders() {
		p.ClaimToHeaders = append(p.ClaimToHeaders, &jwtv3.JwtClaimToHeader{HeaderName: ch.GetHeader(), ClaimName: ch.GetClaim()})
	}
	for _, h := range r.GetFromHeaders() {
		p.FromHeaders = append(p.FromHeaders, &jwtv3.JwtHeader{Name: h.GetName(), ValuePrefix: h.GetPrefix()})
	}
	timeout := r.GetTimeout()
	if timeout == nil {
		timeout = durationpb.New(5e9)
	}
	keys, ok := r.GetJwks(), true
	if keys == "" && r.GetJwksUri() != "" {
		keys, ok = fetched[r.GetJwksUri()]
	}
	if ok {
		p.JwksSourceSpecifier = &jwtv3.JwtProvider_LocalJwks{LocalJwks: &corev3.DataSource{
			Specifier: &corev3.DataSource_InlineString{InlineString: keys}}}
		return p
	}
	// Not fetched yet: Envoy fetches the keys itself meanwhile.
	p.JwksSourceSpecifier = &jwtv3.JwtProvider_RemoteJwks{RemoteJwks: &jwtv3.RemoteJwks{
		HttpUri: &corev3.HttpUri{Uri: r.GetJwksUri(), Timeout: timeout,
			HttpUpstreamType: &corev3.HttpUri_Cluster{Cluster: jwksCluster(r.GetJwksUri())}},
		CacheDuration: jwksCacheDuration,
	}}
	return p
}

// jwksCluster is "outbound|<port>||<host>" for a JWKS URI (port from the scheme by default).
func jwksCluster(uri string) string {
	u, err := url.Parse(uri)
	if err != nil {
		return ""
	}
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	if _, err := strconv.Atoi(port); err != nil {
		return ""
	}
	return "outbound|" + port + "||" + u.Hostname()
}
