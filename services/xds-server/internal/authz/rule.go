package authz

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rbacpb "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	uritemplatev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/path/match/uri_template/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
	security "istio.io/api/security/v1beta1"
)

// jwtFilter is the HTTP filter whose dynamic metadata carries a validated JWT's payload.
const jwtFilter = "envoy.filters.http.jwt_authn"

// errHTTPOnly marks a condition that cannot be checked on a TCP chain.
var errHTTPOnly = errors.New("is HTTP only")

// condition is one attribute of a rule (a source or operation field, or a `when` key) with
// its values and notValues. Exactly one generator is set: per value (the values are ORed) or
// for the whole list at once (JWT claims, Envoy metadata).
type condition struct {
	key               string
	values, notValues []string

	perm     func(key, v string, tcp bool) (*rbacpb.Permission, error)
	princ    func(key, v string, tcp bool) (*rbacpb.Principal, error)
	permAll  func(key string, vs []string, tcp bool) (*rbacpb.Permission, error)
	princAll func(key string, vs []string, tcp bool) (*rbacpb.Principal, error)
}

// ruleModel is a rule split into alternatives: one permission list per `to` (or the `when`
// part alone) and one principal list per `from`; a request matches when it matches one of
// each. Conditions of one list are ANDed.
type ruleModel struct {
	permissions [][]condition
	principals  [][]condition
}

// newRuleModel reads an AuthorizationPolicy rule as istiod does: `when` conditions are
// appended to every `from` (principal side) or `to` (permission side), the source and
// operation fields go first.
func newRuleModel(policyNamespace string, r *security.Rule) (*ruleModel, error) {
	var basePerm, basePrinc []condition
	for _, w := range r.GetWhen() {
		c := condition{key: w.GetKey(), values: w.GetValues(), notValues: w.GetNotValues()}
		if len(c.values) == 0 && len(c.notValues) == 0 {
			continue
		}
		k := c.key
		switch {
		case k == "destination.ip":
			c.perm = destIP
		case k == "destination.port":
			c.perm = destPort
		case k == "connection.sni":
			c.perm = func(_, v string, _ bool) (*rbacpb.Permission, error) {
				return &rbacpb.Permission{Rule: &rbacpb.Permission_RequestedServerName{RequestedServerName: stringMatcher(v, "")}}, nil
			}
		case strings.HasPrefix(k, "experimental.envoy.filters."):
			c.permAll = envoyFilterMetadata
		case k == "source.ip":
			c.princ = directRemoteIP
		case k == "remote.ip":
			c.princ = remoteIP
		case k == "source.namespace":
			c.princ = namespacePrincipal
		case k == "source.trustDomain":
			c.princ = trustDomainPrincipal
		case k == "source.serviceAccount":
			c.princ = serviceAccountPrincipal(policyNamespace)
		case k == "source.principal":
			c.princ = principalName
		case k == "request.auth.principal":
			c.princAll = requestPrincipals
		case k == "request.auth.audiences":
			c.princAll = claimPrincipal([]string{"aud"})
		case k == "request.auth.presenter":
			c.princAll = claimPrincipal([]string{"azp"})
		case strings.HasPrefix(k, "request.headers"):
			c.princ = requestHeader
		case strings.HasPrefix(k, "request.auth.claims"):
			c.princAll = requestClaim
		default:
			return nil, fmt.Errorf("unknown attribute %s", k)
		}
		if c.perm != nil || c.permAll != nil {
			basePerm = append(basePerm, c)
		} else {
			basePrinc = append(basePrinc, c)
		}
	}

	m := &ruleModel{}
	for _, from := range r.GetFrom() {
		s := from.GetSource()
		fields := []condition{
			{key: "source.principal", values: s.GetPrincipals(), notValues: s.GetNotPrincipals(), princ: principalName},
			{key: "request.auth.principal", values: s.GetRequestPrincipals(), notValues: s.GetNotRequestPrincipals(), princAll: requestPrincipals},
			{key: "source.serviceAccount", values: s.GetServiceAccounts(), notValues: s.GetNotServiceAccounts(), princ: serviceAccountPrincipal(policyNamespace)},
			{key: "source.trustDomain", values: s.GetTrustDomains(), notValues: s.GetNotTrustDomains(), princ: trustDomainPrincipal},
			{key: "source.namespace", values: s.GetNamespaces(), notValues: s.GetNotNamespaces(), princ: namespacePrincipal},
			{key: "remote.ip", values: s.GetRemoteIpBlocks(), notValues: s.GetNotRemoteIpBlocks(), princ: remoteIP},
			{key: "source.ip", values: s.GetIpBlocks(), notValues: s.GetNotIpBlocks(), princ: directRemoteIP},
		}
		m.principals = append(m.principals, append(nonEmpty(fields), basePrinc...))
	}
	if len(r.GetFrom()) == 0 {
		m.principals = append(m.principals, basePrinc)
	}
	for _, to := range r.GetTo() {
		o := to.GetOperation()
		fields := []condition{
			{key: ":authority", values: o.GetHosts(), notValues: o.GetNotHosts(), perm: hostPermission},
			{key: ":method", values: o.GetMethods(), notValues: o.GetNotMethods(), perm: methodPermission},
			{key: "path", values: o.GetPaths(), notValues: o.GetNotPaths(), perm: pathPermission},
			{key: "destination.port", values: o.GetPorts(), notValues: o.GetNotPorts(), perm: destPort},
		}
		m.permissions = append(m.permissions, append(nonEmpty(fields), basePerm...))
	}
	if len(r.GetTo()) == 0 {
		m.permissions = append(m.permissions, basePerm)
	}
	return m, nil
}

func nonEmpty(cs []condition) []condition {
	var out []condition
	for _, c := range cs {
		if len(c.values) > 0 || len(c.notValues) > 0 {
			out = append(out, c)
		}
	}
	return out
}

// policy builds the Envoy RBAC policy of the rule. A condition Envoy cannot check (an HTTP
// field on a TCP chain, a malformed value) makes an ALLOW rule fail, so it is dropped and
// grants nothing; for DENY and AUDIT that value is left out instead, so the rule matches more
// and the proxy errs on the side of denying, as istiod does.
func (m *ruleModel) policy(tcp, allow bool) (*rbacpb.Policy, error) {
	p := &rbacpb.Policy{}
	for _, conds := range m.permissions {
		var and []*rbacpb.Permission
		for _, c := range conds {
			ps, err := c.permissions(tcp, allow)
			if err != nil {
				return nil, err
			}
			and = append(and, ps...)
		}
		if len(and) == 0 {
			and = []*rbacpb.Permission{permAny()}
		}
		p.Permissions = append(p.Permissions, &rbacpb.Permission{Rule: &rbacpb.Permission_AndRules{AndRules: &rbacpb.Permission_Set{Rules: and}}})
	}
	for _, conds := range m.principals {
		var and []*rbacpb.Principal
		for _, c := range conds {
			ps, err := c.principalIDs(tcp, allow)
			if err != nil {
				return nil, err
			}
			and = append(and, ps...)
		}
		if len(and) == 0 {
			and = []*rbacpb.Principal{princAny()}
		}
		p.Principals = append(p.Principals, &rbacpb.Principal{Identifier: &rbacpb.Principal_AndIds{AndIds: &rbacpb.Principal_Set{Ids: and}}})
	}
	return p, nil
}

// tolerate keeps an error only where it must drop the rule (ALLOW).
func tolerate(err error, allow bool) error {
	if allow {
		return err
	}
	return nil
}

// rbacNode is a Permission or a Principal: they combine the same way.
type rbacNode interface {
	*rbacpb.Permission | *rbacpb.Principal
}

// shape builds the OR and NOT nodes of one kind.
type shape[T rbacNode] struct {
	or  func([]T) T
	not func(T) T
}

var (
	permShape = shape[*rbacpb.Permission]{
		or: func(ps []*rbacpb.Permission) *rbacpb.Permission {
			return &rbacpb.Permission{Rule: &rbacpb.Permission_OrRules{OrRules: &rbacpb.Permission_Set{Rules: ps}}}
		},
		not: func(p *rbacpb.Permission) *rbacpb.Permission {
			return &rbacpb.Permission{Rule: &rbacpb.Permission_NotRule{NotRule: p}}
		},
	}
	princShape = shape[*rbacpb.Principal]{
		or: func(ps []*rbacpb.Principal) *rbacpb.Principal {
			return &rbacpb.Principal{Identifier: &rbacpb.Principal_OrIds{OrIds: &rbacpb.Principal_Set{Ids: ps}}}
		},
		not: func(p *rbacpb.Principal) *rbacpb.Principal {
			return &rbacpb.Principal{Identifier: &rbacpb.Principal_NotId{NotId: p}}
		},
	}
)

// nodes builds a condition's matchers: its values ORed, its notValues ORed and negated. one
// generates per value, all (when set) for the whole list.
func nodes[T rbacNode](c condition, sh shape[T], one func(key, v string, tcp bool) (T, error),
	all func(key string, vs []string, tcp bool) (T, error), tcp, allow bool) ([]T, error) {
	build := func(vs []string) (T, error) {
		var none T
		if len(vs) == 0 {
			return none, nil
		}
		if all != nil {
			p, err := all(c.key, vs, tcp)
			return p, tolerate(err, allow)
		}
		var or []T
		for _, v := range vs {
			p, err := one(c.key, v, tcp)
			if err := tolerate(err, allow); err != nil {
				return none, err
			}
			if p != nil {
				or = append(or, p)
			}
		}
		if len(or) == 0 {
			return none, nil
		}
		return sh.or(or), nil
	}
	var out []T
	p, err := build(c.values)
	if err != nil {
		return nil, err
	}
	if p != nil {
		out = append(out, p)
	}
	n, err := build(c.notValues)
	if err != nil {
		return nil, err
	}
	if n != nil {
		out = append(out, sh.not(n))
	}
	return out, nil
}

func (c condition) permissions(tcp, allow bool) ([]*rbacpb.Permission, error) {
	return nodes(c, permShape, c.perm, c.permAll, tcp, allow)
}

func (c condition) principalIDs(tcp, allow bool) ([]*rbacpb.Principal, error) {
	return nodes(c, princShape, c.princ, c.princAll, tcp, allow)
}

func permAny() *rbacpb.Permission { return &rbacpb.Permission{Rule: &rbacpb.Permission_Any{Any: true}} }
func princAny() *rbacpb.Principal {
	return &rbacpb.Principal{Identifier: &rbacpb.Principal_Any{Any: true}}
}

func httpOnly(key string, tcp bool) error {
	if tcp {
		return fmt.Errorf("%q %w", key, errHTTPOnly)
	}
	return nil
}

// cidr reads "10.0.0.1" (a /32 or /128) or "10.0.0.0/8".
func cidr(v string) (*corev3.CidrRange, error) {
	var p netip.Prefix
	var err error
	if strings.Contains(v, "/") {
		p, err = netip.ParsePrefix(v)
	} else {
		var a netip.Addr
		a, err = netip.ParseAddr(v)
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if err != nil {
		return nil, fmt.Errorf("invalid IP or CIDR %q: %w", v, err)
	}
	return &corev3.CidrRange{AddressPrefix: p.Addr().String(), PrefixLen: wrapperspb.UInt32(uint32(p.Bits()))}, nil
}

func destIP(_, v string, _ bool) (*rbacpb.Permission, error) {
	c, err := cidr(v)
	if err != nil {
		return nil, err
	}
	return &rbacpb.Permission{Rule: &rbacpb.Permission_DestinationIp{DestinationIp: c}}, nil
}

func destPort(_, v string, _ bool) (*rbacpb.Permission, error) {
	n, err := strconv.ParseUint(v, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("invalid port %q", v)
	}
	return &rbacpb.Permission{Rule: &rbacpb.Permission_DestinationPort{DestinationPort: uint32(n)}}, nil
}

func hostPermission(key, v string, tcp bool) (*rbacpb.Permission, error) {
	if err := httpOnly(key, tcp); err != nil {
		return nil, err
	}
	return &rbacpb.Permission{Rule: &rbacpb.Permission_Header{Header: headerMatcher(":authority", v, true)}}, nil
}

func methodPermission(key, v string, tcp bool) (*rbacpb.Permission, error) {
	if err := httpOnly(key, tcp); err != nil {
		return nil, err
	}
	return &rbacpb.Permission{Rule: &rbacpb.Permission_Header{Header: headerMatcher(":method", v, false)}}, nil
}

// pathTemplates turns Istio's "{*}" and "{**}" into Envoy's URI template operators.
var pathTemplates = strings.NewReplacer("{*}", "*", "{**}", "**")

func pathPermission(key, v string, tcp bool) (*rbacpb.Permission, error) {
	if err := httpOnly(key, tcp); err != nil {
		return nil, err
	}
	if strings.Contains(v, "{*}") || strings.Contains(v, "{**}") {
		return &rbacpb.Permission{Rule: &rbacpb.Permission_UriTemplate{UriTemplate: &corev3.TypedExtensionConfig{
			Name:        "uri-template",
			TypedConfig: mustAny(&uritemplatev3.UriTemplateMatchConfig{PathTemplate: pathTemplates.Replace(v)}),
		}}}, nil
	}
	return &rbacpb.Permission{Rule: &rbacpb.Permission_UrlPath{UrlPath: &matcherv3.PathMatcher{
		Rule: &matcherv3.PathMatcher_Path{Path: stringMatcher(v, "")}}}}, nil
}

// envoyFilterMetadata reads "experimental.envoy.filters.<filter>[<key>]": a match on the
// filter's dynamic metadata; a value in brackets matches one element of a list.
func envoyFilterMetadata(key string, vs []string, _ bool) (*rbacpb.Permission, error) {
	filter, field, ok := strings.Cut(strings.TrimSuffix(strings.TrimPrefix(key, "experimental."), "]"), "[")
	if !ok {
		return nil, fmt.Errorf("invalid key: %v", key)
	}
	var ms []*matcherv3.ValueMatcher
	for _, v := range vs {
		m := &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_StringMatch{StringMatch: stringMatcher(strings.Trim(v, "[]"), "")}}
		if strings.HasPrefix(v, "[") && strings.HasSuffix(v, "]") {
			m = &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_ListMatch{ListMatch: &matcherv3.ListMatcher{
				MatchPattern: &matcherv3.ListMatcher_OneOf{OneOf: m}}}}
		}
		ms = append(ms, m)
	}
	return &rbacpb.Permission{Rule: &rbacpb.Permission_Metadata{Metadata: &matcherv3.MetadataMatcher{
		Filter: filter, Path: metadataPath(field), Value: orValues(ms)}}}, nil
}

func directRemoteIP(_, v string, _ bool) (*rbacpb.Principal, error) {
	c, err := cidr(v)
	if err != nil {
		return nil, err
	}
	return &rbacpb.Principal{Identifier: &rbacpb.Principal_DirectRemoteIp{DirectRemoteIp: c}}, nil
}

func remoteIP(_, v string, _ bool) (*rbacpb.Principal, error) {
	c, err := cidr(v)
	if err != nil {
		return nil, err
	}
	return &rbacpb.Principal{Identifier: &rbacpb.Principal_RemoteIp{RemoteIp: c}}, nil
}

// authenticated matches the peer's certificate identity (URI SAN).
func authenticated(m *matcherv3.StringMatcher) *rbacpb.Principal {
	return &rbacpb.Principal{Identifier: &rbacpb.Principal_Authenticated_{Authenticated: &rbacpb.Principal_Authenticated{PrincipalName: m}}}
}

func namespacePrincipal(_, v string, _ bool) (*rbacpb.Principal, error) {
	parts := strings.Split(v, "*")
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	return authenticated(regexMatcher(".*/ns/" + strings.Join(parts, ".*") + "/.*")), nil
}

func serviceAccountPrincipal(policyNamespace string) func(_, v string, _ bool) (*rbacpb.Principal, error) {
	return func(_, v string, _ bool) (*rbacpb.Principal, error) {
		ns, sa, ok := strings.Cut(v, "/")
		if !ok {
			ns, sa = policyNamespace, v
		}
		return authenticated(regexMatcher("spiffe://.+/ns/" + regexp.QuoteMeta(ns) + "/(.+/|)sa/" + regexp.QuoteMeta(sa) + "(/.+)?")), nil
	}
}

func trustDomainPrincipal(_, v string, _ bool) (*rbacpb.Principal, error) {
	switch {
	case v == "*":
		return authenticated(prefixMatcher("spiffe://", false)), nil
	case !strings.Contains(v, "*"):
		return authenticated(prefixMatcher("spiffe://"+v+"/", false)), nil
	}
	before, after, _ := strings.Cut(v, "*")
	return authenticated(regexMatcher("spiffe://" + regexp.QuoteMeta(before) + "[^/]*" + regexp.QuoteMeta(after) + "/.*")), nil
}

func principalName(_, v string, _ bool) (*rbacpb.Principal, error) {
	return authenticated(stringMatcher(v, "spiffe://")), nil
}

func requestHeader(key, v string, tcp bool) (*rbacpb.Principal, error) {
	if err := httpOnly(key, tcp); err != nil {
		return nil, err
	}
	name, err := inBrackets(strings.TrimPrefix(key, "request.headers"))
	if err != nil {
		return nil, err
	}
	return &rbacpb.Principal{Identifier: &rbacpb.Principal_Header{Header: headerMatcher(name, v, false)}}, nil
}

var matchAnything = regexMatcher(".+")

// requestPrincipals matches "<iss>/<sub>" of the request's JWT, with a leading or trailing
// "*" as a suffix or prefix match.
func requestPrincipals(key string, vs []string, tcp bool) (*rbacpb.Principal, error) {
	if err := httpOnly(key, tcp); err != nil {
		return nil, err
	}
	var or []*rbacpb.Principal
	for _, v := range vs {
		idx := strings.LastIndex(v, "/")
		found := idx >= 0
		iss, sub := v, ""
		if found {
			iss, sub = v[:idx], v[idx+1:]
		}
		var mi, ms *matcherv3.StringMatcher
		switch {
		case v == "*":
			mi, ms = matchAnything, matchAnything
		case strings.HasPrefix(v, "*"):
			if found {
				mi = matchAnything
				if iss != "*" {
					mi = suffixMatcher(strings.TrimPrefix(iss, "*"), false)
				}
				ms = exactMatcher(sub, false)
			} else {
				mi, ms = matchAnything, suffixMatcher(strings.TrimPrefix(v, "*"), false)
			}
		case strings.HasSuffix(v, "*"):
			if found {
				mi, ms = exactMatcher(iss, false), matchAnything
				if sub != "*" {
					ms = prefixMatcher(strings.TrimSuffix(sub, "*"), false)
				}
			} else {
				mi, ms = prefixMatcher(strings.TrimSuffix(v, "*"), false), matchAnything
			}
		default:
			mi, ms = exactMatcher(iss, false), exactMatcher(sub, false)
		}
		or = append(or, &rbacpb.Principal{Identifier: &rbacpb.Principal_AndIds{AndIds: &rbacpb.Principal_Set{Ids: []*rbacpb.Principal{
			jwtClaim("iss", mi), jwtClaim("sub", ms)}}}})
	}
	if len(or) == 1 {
		return or[0], nil
	}
	return &rbacpb.Principal{Identifier: &rbacpb.Principal_OrIds{OrIds: &rbacpb.Principal_Set{Ids: or}}}, nil
}

func jwtClaim(claim string, m *matcherv3.StringMatcher) *rbacpb.Principal {
	return &rbacpb.Principal{Identifier: &rbacpb.Principal_Metadata{Metadata: &matcherv3.MetadataMatcher{
		Filter: jwtFilter,
		Path:   metadataPath("payload", claim),
		Value:  &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_StringMatch{StringMatch: m}},
	}}}
}

// claimPrincipal matches a (nested) JWT claim that is one of vs, or a list containing one.
func claimPrincipal(claims []string) func(key string, vs []string, tcp bool) (*rbacpb.Principal, error) {
	return func(key string, vs []string, tcp bool) (*rbacpb.Principal, error) {
		if err := httpOnly(key, tcp); err != nil {
			return nil, err
		}
		var ms []*matcherv3.ValueMatcher
		for _, v := range vs {
			ms = append(ms, &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_StringMatch{StringMatch: stringMatcher(v, "")}})
		}
		value := orValues(ms)
		return &rbacpb.Principal{Identifier: &rbacpb.Principal_Metadata{Metadata: &matcherv3.MetadataMatcher{
			Filter: jwtFilter,
			Path:   metadataPath(append([]string{"payload"}, claims...)...),
			Value: &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_OrMatch{OrMatch: &matcherv3.OrMatcher{
				ValueMatchers: []*matcherv3.ValueMatcher{
					{MatchPattern: &matcherv3.ValueMatcher_ListMatch{ListMatch: &matcherv3.ListMatcher{
						MatchPattern: &matcherv3.ListMatcher_OneOf{OneOf: value}}}},
					value,
				}}}},
		}}}, nil
	}
}

func requestClaim(key string, vs []string, tcp bool) (*rbacpb.Principal, error) {
	if err := httpOnly(key, tcp); err != nil {
		return nil, err
	}
	claims, err := nestedClaims(strings.TrimPrefix(key, "request.auth.claims"))
	if err != nil {
		return nil, err
	}
	return claimPrincipal(claims)(key, vs, tcp)
}

// nestedClaims reads "[a][b]" as [a b]; anything else must be one "[name]".
func nestedClaims(s string) ([]string, error) {
	var out []string
	rest := s
	for rest != "" {
		if rest[0] != '[' {
			break
		}
		end := strings.IndexAny(rest[1:], "[]")
		if end < 0 || rest[1+end] != ']' {
			break
		}
		out = append(out, rest[1:1+end])
		rest = rest[2+end:]
	}
	if rest == "" && len(out) > 0 {
		return out, nil
	}
	name, err := inBrackets(s)
	if err != nil {
		return nil, err
	}
	return []string{name}, nil
}

func inBrackets(s string) (string, error) {
	if !strings.HasPrefix(s, "[") || !strings.HasSuffix(s, "]") {
		return "", fmt.Errorf("expecting format [<NAME>], but found %s", s)
	}
	return s[1 : len(s)-1], nil
}

func metadataPath(keys ...string) []*matcherv3.MetadataMatcher_PathSegment {
	out := make([]*matcherv3.MetadataMatcher_PathSegment, len(keys))
	for i, k := range keys {
		out[i] = &matcherv3.MetadataMatcher_PathSegment{Segment: &matcherv3.MetadataMatcher_PathSegment_Key{Key: k}}
	}
	return out
}

func orValues(ms []*matcherv3.ValueMatcher) *matcherv3.ValueMatcher {
	if len(ms) == 1 {
		return ms[0]
	}
	return &matcherv3.ValueMatcher{MatchPattern: &matcherv3.ValueMatcher_OrMatch{OrMatch: &matcherv3.OrMatcher{ValueMatchers: ms}}}
}

// headerMatcher: "*" is presence, a leading or trailing "*" a suffix or prefix match.
func headerMatcher(name, v string, ignoreCase bool) *routev3.HeaderMatcher {
	h := &routev3.HeaderMatcher{Name: name}
	switch {
	case v == "*":
		h.HeaderMatchSpecifier = &routev3.HeaderMatcher_PresentMatch{PresentMatch: true}
	case strings.HasPrefix(v, "*"):
		h.HeaderMatchSpecifier = &routev3.HeaderMatcher_StringMatch{StringMatch: suffixMatcher(v[1:], ignoreCase)}
	case strings.HasSuffix(v, "*"):
		h.HeaderMatchSpecifier = &routev3.HeaderMatcher_StringMatch{StringMatch: prefixMatcher(v[:len(v)-1], ignoreCase)}
	default:
		h.HeaderMatchSpecifier = &routev3.HeaderMatcher_StringMatch{StringMatch: exactMatcher(v, ignoreCase)}
	}
	return h
}

// stringMatcher matches prefix+v, with Istio's "*" forms: alone any non-empty value, leading a
// suffix match, trailing a prefix match.
func stringMatcher(v, prefix string) *matcherv3.StringMatcher {
	switch {
	case v == "*":
		return regexMatcher(".+")
	case strings.HasPrefix(v, "*"):
		if prefix == "" {
			return suffixMatcher(v[1:], false)
		}
		return regexMatcher(prefix + ".*" + regexp.QuoteMeta(v[1:]))
	case strings.HasSuffix(v, "*"):
		return prefixMatcher(prefix+v[:len(v)-1], false)
	}
	return exactMatcher(prefix+v, false)
}

func regexMatcher(re string) *matcherv3.StringMatcher {
	return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: re}}}
}

func prefixMatcher(p string, ignoreCase bool) *matcherv3.StringMatcher {
	return &matcherv3.StringMatcher{IgnoreCase: ignoreCase, MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: p}}
}

func suffixMatcher(s string, ignoreCase bool) *matcherv3.StringMatcher {
	return &matcherv3.StringMatcher{IgnoreCase: ignoreCase, MatchPattern: &matcherv3.StringMatcher_Suffix{Suffix: s}}
}

func exactMatcher(s string, ignoreCase bool) *matcherv3.StringMatcher {
	return &matcherv3.StringMatcher{IgnoreCase: ignoreCase, MatchPattern: &matcherv3.StringMatcher_Exact{Exact: s}}
}
