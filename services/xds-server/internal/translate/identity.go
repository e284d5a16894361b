package translate

import (
	"cmp"
	"slices"
	"strings"

	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	"sailplane.dev/services/xds-server/internal/model"
)

// defaultTrustDomain is Istio's when the mesh config names none.
const defaultTrustDomain = "cluster.local"

// ServiceIdentities are the identities a client should accept from svc's endpoints, as
// istiod's PushContext.ServiceAccounts gives them: the service's own subjectAltNames (a
// ServiceEntry's) as written, and every endpoint's service account as
// "spiffe://<trust domain>/ns/<namespace>/sa/<account>" for the mesh's trust domain and each
// of its aliases; sorted. An account already written as a SPIFFE ID is taken as is.
func ServiceIdentities(svc *model.Service, mesh *meshv1alpha1.MeshConfig) []string {
	domains := append([]string{cmp.Or(mesh.GetTrustDomain(), defaultTrustDomain)}, mesh.GetTrustDomainAliases()...)
	out := slices.Clone(svc.Spec.GetSubjectAltNames())
	for _, ep := range svc.Endpoints {
		sa := ep.GetServiceAccount()
		switch {
		case sa == "":
		case strings.HasPrefix(sa, "spiffe://"):
			out = append(out, sa)
		default:
			for _, td := range domains {
				out = append(out, "spiffe://"+td+"/ns/"+svc.Spec.GetNamespace()+"/sa/"+sa)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
