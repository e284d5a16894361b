package gatewaystatus

import "k8s.io/apimachinery/pkg/api/meta"

// selected keeps the objects whose namespace Config.Selected admits (cluster-scoped ones
// always), so that the status is computed over what the bus carries: istiod builds its Gateway
// API collections from informers filtered by the discovery namespaces, and a route outside
// them is neither served, nor Accepted, nor counted in a listener's attachedRoutes.
func (w *Writer) selected(objs []any) []any {
	if w.cfg.Selected == nil {
		return objs
	}
	out := objs[:0:0]
	for _, o := range objs {
		if w.inSelection(o) {
			out = append(out, o)
		}
	}
	return out
}

// inSelection reports whether obj's namespace is admitted (Config.Selected).
func (w *Writer) inSelection(obj any) bool {
	m, err := meta.Accessor(obj)
	if err != nil {
		return false
	}
	return w.cfg.Selected == nil || m.GetNamespace() == "" || w.cfg.Selected(m.GetNamespace())
}
