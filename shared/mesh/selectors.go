package mesh

import (
	"fmt"

	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"sailplane.dev/shared/config"
)

// DiscoverySelectors compiles the mesh config's discoverySelectors (the namespaces the mesh
// watches: those matching any of them); nil when there are none, which means every namespace.
// A selector that does not compile is a *config.Error naming it.
func DiscoverySelectors(m *meshv1alpha1.MeshConfig) ([]labels.Selector, error) {
	var out []labels.Selector
	for i, ls := range m.GetDiscoverySelectors() {
		k := &metav1.LabelSelector{MatchLabels: ls.GetMatchLabels()}
		for _, e := range ls.GetMatchExpressions() {
			k.MatchExpressions = append(k.MatchExpressions, metav1.LabelSelectorRequirement{
				Key: e.GetKey(), Operator: metav1.LabelSelectorOperator(e.GetOperator()), Values: e.GetValues(),
			})
		}
		sel, err := metav1.LabelSelectorAsSelector(k)
		if err != nil {
			return nil, &config.Error{Field: fmt.Sprintf("discoverySelectors[%d]", i), Err: err}
		}
		out = append(out, sel)
	}
	return out, nil
}

// Selected says whether a namespace with these labels is watched under selectors (nil: all).
func Selected(selectors []labels.Selector, nsLabels map[string]string) bool {
	if selectors == nil {
		return true
	}
	set := labels.Set(nsLabels)
	for _, sel := range selectors {
		if sel.Matches(set) {
			return true
		}
	}
	return false
}
