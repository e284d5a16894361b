package config

import (
	"encoding/json"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	security "istio.io/api/security/v1beta1"
	typev1beta1 "istio.io/api/type/v1beta1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// workloadSelector checks a policy's selector as Istio does: no empty keys, no wildcards, and a
// warning when it selects nothing in particular.
func (v *validator) workloadSelector(p *field.Path, s *typev1beta1.WorkloadSelector) {
	if s == nil {
		return
	}
	for k, val := range s.MatchLabels {
		lp := p.Child("matchLabels").Key(k)
		if k == "" {
			v.add(lp, "empty label key")
		}
		if strings.Contains(k, "*") || strings.Contains(val, "*") {
			v.add(lp, "wildcards are not supported in selectors: %q", k+"="+val)
		}
	}
	if len(s.MatchLabels) == 0 {
		v.warn(p, "workload selector without labels: applies to every workload in the namespace")
	}
}

// policyTargets are the kinds a policy's targetRef may name, as group/kind ("" is the core group).
var policyTargets = map[string]bool{
	"/Service": true, "networking.istio.io/ServiceEntry": true,
	"gateway.networking.k8s.io/Gateway": true, "gateway.networking.k8s.io/GatewayClass": true,
}

func (v *validator) targets(sel *typev1beta1.WorkloadSelector, ref *typev1beta1.PolicyTargetReference, refs []*typev1beta1.PolicyTargetReference) {
	set := 0
	for _, b := range []bool{sel != nil, ref != nil, len(refs) > 0} {
		if b {
			set++
		}
	}
	if set > 1 {
		v.add(specPath, "only one of selector, targetRef and targetRefs may be set")
	}
	check := func(p *field.Path, r *typev1beta1.PolicyTargetReference) {
		if r == nil {
			return
		}
		if r.Name == "" {
			v.add(p.Child("name"), "required")
		}
		if r.Namespace != "" {
			v.add(p.Child("namespace"), "must not be set: cross-namespace references are not supported")
		}
		group := r.Group
		if group == "core" {
			group = ""
		}
		if !policyTargets[group+"/"+r.Kind] {
			v.add(p.Child("kind"), "must be a Service, ServiceEntry, Gateway or GatewayClass (group %q, kind %q)", r.Group, r.Kind)
		}
	}
	check(specPath.Child("targetRef"), ref)
	for i, r := range refs {
		check(specPath.Child("targetRefs").Index(i), r)
	}
}

func (v *validator) peerAuthentication(s *security.PeerAuthentication) {
	v.workloadSelector(specPath.Child("selector"), s.Selector)
	if len(s.PortLevelMtls) > 0 && len(s.GetSelector().GetMatchLabels()) == 0 {
		v.add(specPath.Child("portLevelMtls"), "requires a selector with matchLabels (a mesh or namespace policy cannot set port-level mTLS)")
	}
	if s.PortLevelMtls != nil && len(s.PortLevelMtls) == 0 {
		v.add(specPath.Child("portLevelMtls"), "must have at least one entry when set")
	}
	for port := range s.PortLevelMtls {
		v.addMsg(specPath.Child("portLevelMtls").Key(strconv.FormatUint(uint64(port), 10)), portNumber(port))
	}
}

func (v *validator) authorizationPolicy(s *security.AuthorizationPolicy) {
	v.targets(s.Selector, s.TargetRef, s.TargetRefs)
	v.workloadSelector(specPath.Child("selector"), s.Selector)
	custom := s.Action == security.AuthorizationPolicy_CUSTOM
	switch {
	case custom && s.Rules == nil:
		v.add(specPath.Child("rules"), "required with action CUSTOM (add an empty rule {} to apply it to every request)")
	case custom && s.GetProvider().GetName() == "":
		v.add(specPath.Child("provider", "name"), "required with action CUSTOM")
	case !custom && s.GetProvider() != nil:
		v.add(specPath.Child("provider"), "only allowed with action CUSTOM, not %s", s.Action)
	}
	if s.Action == security.AuthorizationPolicy_DENY && s.Rules == nil {
		v.add(specPath.Child("rules"), "required with action DENY (add an empty rule {} to deny every request)")
	}
	for i, r := range s.Rules {
		p := specPath.Child("rules").Index(i)
		if r == nil {
			v.add(p, "must not be null")
			continue
		}
		// Whether the rule uses only HTTP attributes: a DENY rule that does then denies all TCP
		// traffic, which Istio warns about.
		var hasFrom, hasTo, tcpFrom, tcpTo bool
		for j, f := range r.From {
			fp := p.Child("from").Index(j).Child("source")
			src := f.GetSource()
			if src == nil {
				v.add(fp, "required")
				continue
			}
			hasFrom = true
			v.source(fp, src, custom)
			tcpFrom = tcpFrom || src.Principals != nil || src.NotPrincipals != nil || src.Namespaces != nil ||
				src.NotNamespaces != nil || src.IpBlocks != nil || src.NotIpBlocks != nil || src.RemoteIpBlocks != nil ||
				src.NotRemoteIpBlocks != nil || src.ServiceAccounts != nil || src.NotServiceAccounts != nil
		}
		for j, t := range r.To {
			tp := p.Child("to").Index(j).Child("operation")
			op := t.GetOperation()
			if op == nil {
				v.add(tp, "required")
				continue
			}
			hasTo = true
			v.operation(tp, op)
			tcpTo = tcpTo || op.Ports != nil || op.NotPorts != nil
		}
		for j, c := range r.When {
			v.condition(p.Child("when").Index(j), c, custom)
		}
		if s.Action == security.AuthorizationPolicy_DENY && ((hasFrom && !hasTo && !tcpFrom) || (hasTo && !tcpTo)) {
			v.warn(p, "this DENY rule uses only HTTP attributes, so it denies all traffic to TCP ports in its scope; name the ports explicitly")
		}
	}
}

func (v *validator) source(p *field.Path, src *security.Source, custom bool) {
	type list struct {
		name   string
		values []string
	}
	lists := []list{
		{"principals", src.Principals}, {"notPrincipals", src.NotPrincipals},
		{"requestPrincipals", src.RequestPrincipals}, {"notRequestPrincipals", src.NotRequestPrincipals},
		{"namespaces", src.Namespaces}, {"notNamespaces", src.NotNamespaces},
		{"serviceAccounts", src.ServiceAccounts}, {"notServiceAccounts", src.NotServiceAccounts},
		{"trustDomains", src.TrustDomains}, {"notTrustDomains", src.NotTrustDomains},
		{"ipBlocks", src.IpBlocks}, {"notIpBlocks", src.NotIpBlocks},
		{"remoteIpBlocks", src.RemoteIpBlocks}, {"notRemoteIpBlocks", src.NotRemoteIpBlocks},
	}
	empty := true
	for _, l := range lists {
		if len(l.values) == 0 {
			continue
		}
		empty = false
		lp := p.Child(l.name)
		// CUSTOM policies are checked by an external authorizer that sees only the request.
		if custom && !strings.Contains(strings.ToLower(l.name), "ipblocks") {
			v.add(lp, "not supported with action CUSTOM")
		}
		for k, val := range l.values {
			ep := lp.Index(k)
			switch {
			case val == "":
				v.add(ep, "must not be empty")
			case strings.HasSuffix(l.name, "pBlocks"):
				v.addMsg(ep, ipOrCIDR(val))
			case strings.HasSuffix(l.name, "erviceAccounts"):
				v.addMsg(ep, serviceAccountRef(val))
			case strings.HasSuffix(l.name, "rustDomains"):
				v.addMsg(ep, wildcardValue(val))
				if strings.Contains(val, "/") {
					v.add(ep, "a trust domain must not contain '/'")
				}
			}
		}
		if strings.HasSuffix(l.name, "erviceAccounts") && len(l.values) > 16 {
			v.add(lp, "at most 16 service accounts, got %d", len(l.values))
		}
	}
	if empty {
		v.add(p, "must set at least one field")
	}
	if len(src.Principals)+len(src.NotPrincipals)+len(src.Namespaces)+len(src.NotNamespaces) > 0 &&
		len(src.ServiceAccounts)+len(src.NotServiceAccounts) > 0 {
		v.add(p.Child("serviceAccounts"), "cannot be combined with namespaces or principals")
	}
}

// serviceAccountRef returns why s is not "name" or "namespace/name", or "".
func serviceAccountRef(s string) string {
	ns, sa, ok := strings.Cut(s, "/")
	switch {
	case strings.Contains(s, "*"):
		return "wildcards are not allowed in service accounts"
	case len(s) > 320:
		return "must be at most 320 characters"
	case strings.Count(s, "/") > 1 || (ok && (ns == "" || sa == "")):
		return "must be \"serviceAccount\" or \"namespace/serviceAccount\", got " + strconv.Quote(s)
	}
	return ""
}

// wildcardValue returns why s, a value that may start or end with "*", is not one, or "".
func wildcardValue(s string) string {
	switch n := strings.Count(s, "*"); {
	case n > 1:
		return "at most one wildcard is allowed, got " + strconv.Quote(s)
	case n == 1 && s != "*" && !strings.HasPrefix(s, "*") && !strings.HasSuffix(s, "*"):
		return "a wildcard is only allowed at the start or end, got " + strconv.Quote(s)
	}
	return ""
}

func (v *validator) operation(p *field.Path, op *security.Operation) {
	type list struct {
		name   string
		values []string
	}
	lists := []list{
		{"hosts", op.Hosts}, {"notHosts", op.NotHosts}, {"ports", op.Ports}, {"notPorts", op.NotPorts},
		{"methods", op.Methods}, {"notMethods", op.NotMethods}, {"paths", op.Paths}, {"notPaths", op.NotPaths},
	}
	empty := true
	for _, l := range lists {
		empty = empty && len(l.values) == 0
		for k, val := range l.values {
			ep := p.Child(l.name).Index(k)
			switch {
			case val == "":
				v.add(ep, "must not be empty")
			case strings.HasSuffix(l.name, "orts"):
				if n, err := strconv.ParseUint(val, 10, 32); err != nil || n > 65535 {
					v.add(ep, "%q is not a port number", val)
				}
			case strings.HasSuffix(l.name, "aths"):
				v.addMsg(ep, pathTemplate(val))
			}
		}
	}
	if empty {
		v.add(p, "must set at least one field")
	}
}

var pathLiteralRE = regexp.MustCompile(`^[a-zA-Z0-9-._~%!$&'()+,;:@=]+$`)

// pathTemplate returns why path, which may use the {*} and {**} templates, is not a path Envoy
// can match, or "".
func pathTemplate(path string) string {
	templated := strings.Contains(path, "{*}") || strings.Contains(path, "{**}")
	matchAny := false
	for _, seg := range strings.Split(strings.Trim(path, "/"), "/") {
		switch {
		case (seg == "{*}" || seg == "{**}") && matchAny:
			return "{**} must be the last operator in " + strconv.Quote(path)
		case seg == "{*}":
			continue
		case seg == "{**}":
			matchAny = true
			continue
		case strings.ContainsAny(seg, "{}"):
			return "'{' and '}' are only allowed in the {*} and {**} templates, in " + strconv.Quote(path)
		case templated && !pathLiteralRE.MatchString(seg):
			return "invalid segment " + strconv.Quote(seg) + " in templated path " + strconv.Quote(path)
		}
	}
	return ""
}

// condition checks a when clause; see Istio's list of authorization attributes.
func (v *validator) condition(p *field.Path, c *security.Condition, custom bool) {
	if c == nil {
		v.add(p, "must not be null")
		return
	}
	if c.Key == "" {
		v.add(p.Child("key"), "required")
		return
	}
	if custom && (c.Key == "source.namespace" || c.Key == "source.serviceAccount" || c.Key == "source.trustDomain" ||
		c.Key == "source.principal" || strings.HasPrefix(c.Key, "request.auth.")) {
		v.add(p.Child("key"), "%s is not supported with action CUSTOM", c.Key)
	}
	if len(c.Values) == 0 && len(c.NotValues) == 0 {
		v.add(p, "one of values or notValues is required")
		return
	}
	if msg := attributeKey(c.Key); msg != "" {
		v.add(p.Child("key"), "%s", msg)
		return
	}
	for _, l := range []struct {
		name   string
		values []string
	}{{"values", c.Values}, {"notValues", c.NotValues}} {
		for i, val := range l.values {
			v.addMsg(p.Child(l.name).Index(i), attributeValue(c.Key, val))
		}
		if c.Key == "source.serviceAccount" && len(l.values) > 16 {
			v.add(p.Child(l.name), "at most 16 service accounts, got %d", len(l.values))
		}
	}
}

// attributeKey returns why key is not an authorization attribute Istio knows, or "".
func attributeKey(key string) string {
	switch {
	case strings.HasPrefix(key, "request.headers"), strings.HasPrefix(key, "request.auth.claims"),
		strings.HasPrefix(key, "experimental.envoy.filters."):
		if open := strings.Index(key, "["); strings.HasSuffix(key, "]") && open > 0 && open < len(key)-2 {
			return ""
		}
		return strconv.Quote(key) + " must have the form name[key]"
	case key == "destination.namespace":
		return "destination.namespace is replaced by the policy's metadata.namespace"
	case strings.HasPrefix(key, "destination.labels"):
		return "destination.labels is replaced by the workload selector"
	case key == "destination.name", key == "destination.user":
		return key + " is only supported in v1alpha1"
	}
	switch key {
	case "source.ip", "remote.ip", "destination.ip", "source.serviceAccount", "source.trustDomain", "destination.port",
		"source.namespace", "source.principal", "request.auth.principal", "request.auth.audiences",
		"request.auth.presenter", "connection.sni":
		return ""
	}
	return "unknown attribute " + strconv.Quote(key)
}

// attributeValue returns why val does not suit the (known) attribute key, or "".
func attributeValue(key, val string) string {
	switch {
	case val == "":
		return "must not be empty"
	case key == "source.ip", key == "remote.ip", key == "destination.ip":
		return ipOrCIDR(val)
	case key == "source.serviceAccount":
		return serviceAccountRef(val)
	case key == "source.trustDomain":
		return wildcardValue(val)
	case key == "destination.port":
		if n, err := strconv.ParseUint(val, 10, 32); err != nil || n > 65535 {
			return strconv.Quote(val) + " is not a port number"
		}
	}
	return ""
}

// strictHeaderNameRE is the narrow set of header names Istio lets a JWT claim be copied to (no
// pseudo-headers such as ":authority").
var strictHeaderNameRE = regexp.MustCompile(`^[-_A-Za-z0-9]+$`)

func (v *validator) requestAuthentication(s *security.RequestAuthentication) {
	v.targets(s.Selector, s.TargetRef, s.TargetRefs)
	v.workloadSelector(specPath.Child("selector"), s.Selector)
	for i, r := range s.JwtRules {
		p := specPath.Child("jwtRules").Index(i)
		if r == nil {
			continue
		}
		for j, a := range r.Audiences {
			if a == "" {
				v.add(p.Child("audiences").Index(j), "must not be empty")
			}
		}
		if r.Issuer == "" && r.JwksUri == "" {
			v.add(p.Child("issuer"), "issuer or jwksUri is required")
		}
		if r.JwksUri != "" {
			if u, err := url.Parse(r.JwksUri); err != nil || (u.Scheme != "http" && u.Scheme != "https") {
				v.add(p.Child("jwksUri"), "%q is not an http(s) URL", r.JwksUri)
			} else if port := u.Port(); port != "" {
				if _, err := strconv.Atoi(port); err != nil {
					v.add(p.Child("jwksUri"), "invalid port in %q", r.JwksUri)
				}
			}
		}
		if r.Jwks != "" {
			v.jwks(p.Child("jwks"), r.Jwks)
		}
		for j, h := range r.FromHeaders {
			if h.GetName() == "" {
				v.add(p.Child("fromHeaders").Index(j).Child("name"), "required")
			}
		}
		for j, q := range r.FromParams {
			if q == "" {
				v.add(p.Child("fromParams").Index(j), "must not be empty")
			}
		}
		for j, c := range r.FromCookies {
			if c == "" {
				v.add(p.Child("fromCookies").Index(j), "must not be empty")
			}
		}
		for j, ch := range r.OutputClaimToHeaders {
			cp := p.Child("outputClaimToHeaders").Index(j)
			switch {
			case ch == nil:
				v.add(cp, "must not be null")
			case ch.Claim == "" || ch.Header == "":
				v.add(cp, "claim and header are required")
			case !strictHeaderNameRE.MatchString(ch.Header):
				v.add(cp.Child("header"), "%q is not a valid header name (letters, digits, '-' and '_')", ch.Header)
			}
		}
		if r.Timeout != nil {
			v.duration(p.Child("timeout"), r.Timeout, false)
		}
	}
}

// jwks checks an inline JSON Web Key Set (or single key) and warns about private key material,
// which verification never needs.
func (v *validator) jwks(p *field.Path, jwks string) {
	var set struct {
		Keys []map[string]any `json:"keys"`
	}
	var single map[string]any
	if err := json.Unmarshal([]byte(jwks), &set); err != nil {
		v.add(p, "not a JSON Web Key Set: %v", err)
		return
	}
	keys := set.Keys
	if keys == nil {
		if err := json.Unmarshal([]byte(jwks), &single); err != nil || single["kty"] == nil {
			v.add(p, "not a JSON Web Key Set: no keys")
			return
		}
		keys = []map[string]any{single}
	}
	for i, k := range keys {
		if _, ok := k["kty"].(string); !ok {
			v.add(p.Child("keys").Index(i).Child("kty"), "required")
			continue
		}
		if _, private := k["d"]; private || k["kty"] == "oct" {
			v.warn(p, "key %d holds private key material; only public keys are used to verify tokens", i)
		}
	}
}
