package gatewaystatus

import (
	"k8s.io/apimachinery/pkg/api/meta"

	"sailplane.dev/shared/revision"
)

// selected keeps the objects whose namespace Config.Selected admits (cluster-scoped ones
// always), so that the status is computed over what the bus carries: istiod builds its Gateway
// API collections from informers filtered by the discovery namespaces, and a route outside
// them is neither served, nor Accepted, nor counted in a listener's attachedRoutes.
func (w *Writer) selected(objs []any) []any { return w.filter(objs, false) }

// configs is selected for config objects, which also leaves out those labelled for another
// revision: the bus does not carry them either (istiod's config client ignores them).
func (w *Writer) configs(objs []any) []any { return w.filter(objs, true) }

func (w *Writer) filter(objs []any, config bool) []any {
	out := objs[:0:0]
	for _, o := range objs {
		if w.inSelection(o) && (!config || w.configInRevision(o)) {
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

// configInRevision reports whether a config object is read by this revision (unlabelled, or
// labelled for it or one of its tags).
func (w *Writer) configInRevision(obj any) bool {
	m, err := meta.Accessor(obj)
	if err != nil {
		return false
	}
	return revision.ConfigIn(w.owner(), m.GetLabels())
}

func (w *Writer) owner() revision.Owner {
	if w.cfg.Owner != nil {
		return w.cfg.Owner
	}
	return revision.Static(w.cfg.Revision)
}
