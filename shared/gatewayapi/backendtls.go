package gatewayapi

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	networking "istio.io/api/networking/v1alpha3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"sailplane.dev/shared/schema"
)

// MeshControllerName is the controller istiod reports mesh-wide policy ancestors under.
const MeshControllerName = gwv1.GatewayController("istio.io/mesh-controller")

// invalidCredential is what istiod names a CA it cannot use: TLS to the backend then fails,
// never falls back to an unverified or plaintext connection.
const invalidCredential = "invalid://"

// backendPolicy is one BackendTLSPolicy's TLS for one target host (and port name).
type backendPolicy struct {
	source  object
	target  string // the Service or ServiceEntry name
	ns      string
	entry   bool // the target is a ServiceEntry
	host    string
	section string
	tls     *networking.ClientTLSSettings
}

// backendTLSPolicies turns BackendTLSPolicies into DestinationRules, as istiod: the policy's
// SNI, SANs and CA (a ConfigMap as "configmap://<ns>/<name>", or the system roots) for the
// targeted Service or ServiceEntry, or one of its ports (sectionName); of several policies on
// one target the oldest wins and the others are Conflicted.
func (t *translator) backendTLSPolicies() {
	pols := sortObjects(t.in.BackendTLSPolicies)
	var out []backendPolicy
	for _, p := range pols {
		gen := p.Generation
		accepted := cond(string(gwv1.PolicyConditionAccepted), true, string(gwv1.PolicyReasonAccepted), "Configuration is valid", gen)
		resolved := cond(string(gwv1.BackendTLSPolicyConditionResolvedRefs), true, string(gwv1.BackendTLSPolicyReasonResolvedRefs),
			"Configuration is valid", gen)
		tls := &networking.ClientTLSSettings{Mode: networking.ClientTLSSettings_SIMPLE, Sni: string(p.Spec.Validation.Hostname)}
		for _, san := range p.Spec.Validation.SubjectAltNames {
			switch san.Type {
			case gwv1.HostnameSubjectAltNameType:
				tls.SubjectAltNames = append(tls.SubjectAltNames, string(san.Hostname))
			case gwv1.URISubjectAltNameType:
				tls.SubjectAltNames = append(tls.SubjectAltNames, string(san.URI))
			}
		}
		v := p.Spec.Validation
		switch {
		case v.WellKnownCACertificates != nil:
			if *v.WellKnownCACertificates != gwv1.WellKnownCACertificatesSystem {
				accepted = cond(accepted.Type, false, string(gwv1.PolicyReasonInvalid),
					fmt.Sprintf("Unknown wellKnownCACertificates: %v", *v.WellKnownCACertificates), gen)
			}
		case len(v.CACertificateRefs) > 0:
			ref := v.CACertificateRefs[0]
			if len(v.CACertificateRefs) > 1 {
				accepted.Message += "; warning: only the first caCertificateRefs will be used"
			}
			sec, canCheck := t.in.Services.(Secrets)
			switch {
			case ref.Group != "" || ref.Kind != "ConfigMap":
				msg := fmt.Sprintf("unsupported kind %v", ref.Kind)
				resolved = cond(resolved.Type, false, string(gwv1.BackendTLSPolicyReasonInvalidKind), "Certificate reference not supported: "+msg, gen)
				accepted = cond(accepted.Type, false, string(gwv1.BackendTLSPolicyReasonNoValidCACertificate), "Certificate reference invalid: "+msg, gen)
				tls.CredentialName = invalidCredential
			case canCheck && sec.Certificate("ConfigMap", p.Namespace, string(ref.Name), true) != nil:
				err := sec.Certificate("ConfigMap", p.Namespace, string(ref.Name), true)
				resolved = cond(resolved.Type, false, string(gwv1.BackendTLSPolicyReasonInvalidCACertificateRef), "Certificate invalid: "+err.Error(), gen)
				accepted = cond(accepted.Type, false, string(gwv1.BackendTLSPolicyReasonNoValidCACertificate), "Certificate reference invalid: "+err.Error(), gen)
				tls.CredentialName = invalidCredential
			default:
				tls.CredentialName = "configmap://" + p.Namespace + "/" + string(ref.Name)
			}
		}
		st := &gwv1.PolicyStatus{}
		gateways := map[string]bool{}
		for _, tr := range p.Spec.TargetRefs {
			acc := accepted
			host, entryHosts, ports, err := t.policyTarget(p.Namespace, tr)
			if err == nil && tr.SectionName != nil && *tr.SectionName != "" &&
				!slices.ContainsFunc(ports, func(sp ServicePort) bool { return sp.Name == string(*tr.SectionName) }) {
				err = fmt.Errorf("sectionName %q does not exist in %s %s/%s", *tr.SectionName, tr.Kind, p.Namespace, tr.Name)
			}
			switch {
			case err != nil:
				acc = cond(acc.Type, false, string(gwv1.PolicyReasonTargetNotFound), "targetRefs invalid: "+err.Error(), gen)
			default:
				if winner := conflictingPolicy(p, tr, pols); winner != "" {
					acc = cond(acc.Type, false, string(gwv1.PolicyReasonConflicted),
						fmt.Sprintf("Conflicts with BackendTLSPolicy %q targeting the same backend", winner), gen)
					break
				}
				hosts := entryHosts
				if host != "" {
					hosts = []string{host}
				}
				for _, h := range hosts {
					out = append(out, backendPolicy{source: p, target: string(tr.Name), ns: p.Namespace, entry: host == "",
						host: h, section: string(deref(tr.SectionName, "")), tls: tls})
				}
				for g := range t.backendGateways[string(tr.Kind)+"/"+key(p.Namespace, string(tr.Name))] {
					gateways[g] = true
				}
			}
			st.Ancestors = append(st.Ancestors, gwv1.PolicyAncestorStatus{
				AncestorRef:    gwv1.ParentReference{Group: ptr(tr.Group), Kind: ptr(tr.Kind), Name: tr.Name, SectionName: tr.SectionName},
				ControllerName: MeshControllerName, Conditions: []metav1.Condition{acc, resolved}})
			// istiod carries a target's failure on to the next targets and to the gateways.
			if acc.Status == metav1.ConditionFalse {
				accepted = acc
			}
		}
		for _, g := range slices.Sorted(mapsKeys(gateways)) {
			_, name, _ := strings.Cut(g, "/")
			st.Ancestors = append(st.Ancestors, gwv1.PolicyAncestorStatus{
				AncestorRef:    gwv1.ParentReference{Group: ptr(gwv1.Group(gwv1.GroupName)), Kind: ptr(gwv1.Kind("Gateway")), Name: gwv1.ObjectName(name)},
				ControllerName: ControllerName, Conditions: []metav1.Condition{accepted, resolved}})
		}
		if len(st.Ancestors) > 16 {
			st.Ancestors = st.Ancestors[:16] // the API's limit
		}
		t.out.Status = append(t.out.Status, Status{Kind: schema.BackendTLSPolicy, Namespace: p.Namespace, Name: p.Name,
			Generation: gen, Value: st})
	}
	t.backendDestinationRules(out)
}

// policyTarget resolves a policy's targetRef: a Service (its host and ports) or a ServiceEntry
// (its hosts).
func (t *translator) policyTarget(ns string, tr gwv1.LocalPolicyTargetReferenceWithSectionName) (string, []string, []ServicePort, error) {
	switch {
	case (tr.Group == "" || tr.Group == "core") && tr.Kind == "Service":
		h := fmt.Sprintf("%s.%s.svc.%s", tr.Name, ns, t.domain)
		if t.in.Services != nil {
			if svc, ok := t.in.Services.Service(h, ns); ok {
				return h, nil, svc.Ports, nil
			}
		}
		return "", nil, nil, fmt.Errorf("reference %s/%s (of kind Service) not found", ns, tr.Name)
	case tr.Group == "networking.istio.io" && tr.Kind == "ServiceEntry":
		if se, ok := t.in.Services.(ServiceEntries); ok {
			if hosts, ok := se.ServiceEntryHosts(ns, string(tr.Name)); ok {
				var ports []ServicePort
				if len(hosts) > 0 {
					if svc, ok := t.in.Services.Service(hosts[0], ns); ok {
						ports = svc.Ports
					}
				}
				return "", hosts, ports, nil
			}
		}
		return "", nil, nil, fmt.Errorf("reference %s/%s (of kind ServiceEntry) not found", ns, tr.Name)
	}
	return "", nil, nil, fmt.Errorf("unsupported reference kind: %v", tr.Kind)
}

// conflictingPolicy names the older policy (then the lower name) of the namespace with the
// same targetRef, "" if p wins.
func conflictingPolicy(p *gwv1.BackendTLSPolicy, tr gwv1.LocalPolicyTargetReferenceWithSectionName, all []*gwv1.BackendTLSPolicy) string {
	for _, o := range all {
		if o == p || o.Namespace != p.Namespace {
			continue
		}
		if !slices.ContainsFunc(o.Spec.TargetRefs, func(x gwv1.LocalPolicyTargetReferenceWithSectionName) bool {
			return x.Group == tr.Group && x.Kind == tr.Kind && x.Name == tr.Name && deref(x.SectionName, "") == deref(tr.SectionName, "")
		}) {
			continue
		}
		c := o.CreationTimestamp.Compare(p.CreationTimestamp.Time)
		if c < 0 || (c == 0 && o.Name < p.Name) {
			return o.Name
		}
	}
	return ""
}

// backendDestinationRules merges policies per target host into one DestinationRule, oldest
// policy first: its TLS for the whole service, sectionName policies per port.
func (t *translator) backendDestinationRules(pols []backendPolicy) {
	type k struct{ ns, target, host string }
	by := map[k][]backendPolicy{}
	var order []k
	for _, p := range pols {
		kk := k{p.ns, p.target, p.host}
		if _, ok := by[kk]; !ok {
			order = append(order, kk)
		}
		by[kk] = append(by[kk], p)
	}
	for _, kk := range order {
		ps := by[kk]
		slices.SortStableFunc(ps, func(a, b backendPolicy) int {
			if c := a.source.GetCreationTimestamp().Compare(b.source.GetCreationTimestamp().Time); c != 0 {
				return c
			}
			return cmp.Compare(a.source.GetName(), b.source.GetName())
		})
		dr := &networking.DestinationRule{Host: kk.host, TrafficPolicy: &networking.TrafficPolicy{}}
		var ports []ServicePort
		if t.in.Services != nil {
			if svc, ok := t.in.Services.Service(kk.host, kk.ns); ok {
				ports = svc.Ports
			}
		}
		seen := map[string]bool{}
		for _, p := range ps {
			if p.section == "" {
				if dr.TrafficPolicy.Tls == nil {
					dr.TrafficPolicy.Tls = p.tls
				}
				continue
			}
			if seen[p.section] {
				continue
			}
			seen[p.section] = true
			pl := &networking.TrafficPolicy_PortTrafficPolicy{Port: &networking.PortSelector{}, Tls: p.tls}
			for _, sp := range ports {
				if sp.Name == p.section {
					pl.Port.Number = sp.Number
				}
			}
			dr.TrafficPolicy.PortLevelSettings = append(dr.TrafficPolicy.PortLevelSettings, pl)
		}
		slices.SortStableFunc(dr.TrafficPolicy.PortLevelSettings, func(a, b *networking.TrafficPolicy_PortTrafficPolicy) int {
			return cmp.Compare(a.Port.Number, b.Port.Number)
		})
		name := kk.target + "~" + internalGatewaySuffix
		if ps[0].entry {
			name = kk.target + "~" + strings.ReplaceAll(kk.host, ".", "-") + "~" + internalGatewaySuffix
		}
		t.out.DestinationRules = append(t.out.DestinationRules, Config[*networking.DestinationRule]{
			Namespace: kk.ns, Name: name, CreateTime: ps[0].source.GetCreationTimestamp().Time, Spec: dr})
	}
}
