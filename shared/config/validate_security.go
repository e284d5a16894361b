package config

import (
	"net/url"
	"strconv"

	security "istio.io/api/security/v1beta1"
	typev1beta1 "istio.io/api/type/v1beta1"
)

func (v *validator) workloadSelector(p string, s *typev1beta1.WorkloadSelector) {
	if s == nil {
		return
	}
	v.labels(p+".matchLabels", s.MatchLabels)
}

func (v *validator) targets(sel *typev1beta1.WorkloadSelector, ref *typev1beta1.PolicyTargetReference, refs []*typev1beta1.PolicyTargetReference) {
	if sel != nil && (ref != nil || len(refs) > 0) {
		v.add("spec.selector", "selector and targetRef(s) are mutually exclusive")
	}
	if ref != nil && len(refs) > 0 {
		v.add("spec.targetRef", "targetRef and targetRefs are mutually exclusive")
	}
	check := func(p string, r *typev1beta1.PolicyTargetReference) {
		if r.Kind == "" {
			v.add(p+".kind", "required")
		}
		if r.Name == "" {
			v.add(p+".name", "required")
		}
	}
	if ref != nil {
		check("spec.targetRef", ref)
	}
	for i, r := range refs {
		check(idx("spec.targetRefs", i), r)
	}
}

func (v *validator) peerAuthentication(s *security.PeerAuthentication) {
	v.workloadSelector("spec.selector", s.Selector)
	if len(s.PortLevelMtls) > 0 && len(s.GetSelector().GetMatchLabels()) == 0 {
		v.add("spec.portLevelMtls", "requires a selector with matchLabels")
	}
	for port, m := range s.PortLevelMtls {
		p := key("spec.portLevelMtls", strconv.FormatUint(uint64(port), 10))
		v.addMsg(p, portNumber(port))
		if m == nil {
			v.add(p, "mtls mode required")
		}
	}
}

func (v *validator) authorizationPolicy(s *security.AuthorizationPolicy) {
	v.workloadSelector("spec.selector", s.Selector)
	v.targets(s.Selector, s.TargetRef, s.TargetRefs)
	switch d := s.ActionDetail.(type) {
	case *security.AuthorizationPolicy_Provider:
		if s.Action != security.AuthorizationPolicy_CUSTOM {
			v.add("spec.provider", "only allowed with action CUSTOM")
		} else if d.Provider == nil || d.Provider.Name == "" {
			v.add("spec.provider.name", "required")
		}
	case nil:
		if s.Action == security.AuthorizationPolicy_CUSTOM {
			v.add("spec.provider", "required with action CUSTOM")
		}
	}
	for i, r := range s.Rules {
		p := idx("spec.rules", i)
		if r == nil {
			v.add(p, "must not be empty")
			continue
		}
		for j, f := range r.From {
			fp := idx(p+".from", j) + ".source"
			src := f.GetSource()
			if src == nil {
				v.add(fp, "required")
				continue
			}
			lists := [][]string{src.Principals, src.NotPrincipals, src.RequestPrincipals, src.NotRequestPrincipals,
				src.Namespaces, src.NotNamespaces, src.ServiceAccounts, src.NotServiceAccounts,
				src.IpBlocks, src.NotIpBlocks, src.RemoteIpBlocks, src.NotRemoteIpBlocks}
			if allEmpty(lists...) {
				v.add(fp, "must set at least one field")
			}
			for _, b := range []struct {
				name string
				l    []string
			}{{"ipBlocks", src.IpBlocks}, {"notIpBlocks", src.NotIpBlocks}, {"remoteIpBlocks", src.RemoteIpBlocks}, {"notRemoteIpBlocks", src.NotRemoteIpBlocks}} {
				for k, ip := range b.l {
					v.addMsg(idx(fp+"."+b.name, k), ipOrCIDR(ip))
				}
			}
		}
		for j, t := range r.To {
			tp := idx(p+".to", j) + ".operation"
			op := t.GetOperation()
			if op == nil {
				v.add(tp, "required")
				continue
			}
			if allEmpty(op.Hosts, op.NotHosts, op.Ports, op.NotPorts, op.Methods, op.NotMethods, op.Paths, op.NotPaths) {
				v.add(tp, "must set at least one field")
			}
			for _, b := range []struct {
				name string
				l    []string
			}{{"ports", op.Ports}, {"notPorts", op.NotPorts}} {
				for k, ps := range b.l {
					n, err := strconv.ParseUint(ps, 10, 32)
					if err != nil {
						v.add(idx(tp+"."+b.name, k), "%q is not a port number", ps)
						continue
					}
					v.addMsg(idx(tp+"."+b.name, k), portNumber(uint32(n)))
				}
			}
		}
		for j, c := range r.When {
			cp := idx(p+".when", j)
			if c.Key == "" {
				v.add(cp+".key", "required")
			}
			if len(c.Values) == 0 && len(c.NotValues) == 0 {
				v.add(cp, "one of values or notValues is required")
			}
		}
	}
}

func allEmpty(lists ...[]string) bool {
	for _, l := range lists {
		if len(l) > 0 {
			return false
		}
	}
	return true
}

func (v *validator) requestAuthentication(s *security.RequestAuthentication) {
	v.workloadSelector("spec.selector", s.Selector)
	v.targets(s.Selector, s.TargetRef, s.TargetRefs)
	for i, r := range s.JwtRules {
		p := idx("spec.jwtRules", i)
		if r.Issuer == "" {
			v.add(p+".issuer", "required")
		}
		if r.JwksUri != "" {
			u, err := url.Parse(r.JwksUri)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				v.add(p+".jwksUri", "%q is not an http(s) URL", r.JwksUri)
			}
		}
		if r.JwksUri != "" && r.Jwks != "" {
			v.add(p+".jwks", "jwks and jwksUri are mutually exclusive")
		}
		for j, h := range r.FromHeaders {
			if h.Name == "" {
				v.add(idx(p+".fromHeaders", j)+".name", "required")
			}
		}
		for j, q := range r.FromParams {
			if q == "" {
				v.add(idx(p+".fromParams", j), "must not be empty")
			}
		}
		v.duration(p+".timeout", r.Timeout, false)
	}
}
