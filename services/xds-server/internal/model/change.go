package model

import (
	"slices"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
)

// ConfigKey names one changed resource: its kind (schema.Kind.Kind, e.g. "VirtualService",
// "Service" for registry services, named by hostname) and bus namespace/name.
type ConfigKey struct {
	Kind      string
	Namespace string
	Name      string
}

// Visibility is the set of namespaces a change can be seen from: everything, or the listed
// namespaces. The zero value sees nothing.
type Visibility struct {
	All        bool
	Namespaces []string
}

// Sees reports whether a proxy in namespace ns can be affected.
func (v Visibility) Sees(ns string) bool { return v.All || slices.Contains(v.Namespaces, ns) }

// Union merges two visibilities.
func (v Visibility) Union(o Visibility) Visibility {
	if v.All || o.All {
		return Visibility{All: true}
	}
	out := slices.Clone(v.Namespaces)
	for _, ns := range o.Namespaces {
		if !slices.Contains(out, ns) {
			out = append(out, ns)
		}
	}
	return Visibility{Namespaces: out}
}

// ExportVisibility reads Istio's exportTo of a resource of namespace ns: empty or "*" is every
// namespace, "." its own, "~" none.
func ExportVisibility(ns string, exportTo []string) Visibility {
	if len(exportTo) == 0 {
		return Visibility{All: true}
	}
	var v Visibility
	for _, e := range exportTo {
		switch e {
		case "*":
			return Visibility{All: true}
		case ".":
			v = v.Union(Visibility{Namespaces: []string{ns}})
		case "~":
		default:
			v = v.Union(Visibility{Namespaces: []string{e}})
		}
	}
	return v
}

// Change says what changed between two snapshots.
type Change struct {
	// Full is set when anything but endpoints changed.
	Full bool
	// Configs are the changed config and registry resources, each with the namespaces that
	// could see its old or new version.
	Configs map[ConfigKey]Visibility
	// Endpoints are the hostnames whose endpoints changed.
	Endpoints map[string]struct{}
}

// Empty reports whether nothing changed.
func (c Change) Empty() bool { return !c.Full && len(c.Configs) == 0 && len(c.Endpoints) == 0 }

// Merge adds o to c.
func (c *Change) Merge(o Change) {
	c.Full = c.Full || o.Full
	for k, v := range o.Configs {
		c.addConfig(k, v)
	}
	for h := range o.Endpoints {
		c.addEndpoints(h)
	}
}

func (c *Change) addConfig(k ConfigKey, v Visibility) {
	if c.Configs == nil {
		c.Configs = map[ConfigKey]Visibility{}
	}
	if old, ok := c.Configs[k]; ok {
		v = old.Union(v)
	}
	c.Configs[k] = v
}

func (c *Change) addEndpoints(host string) {
	if c.Endpoints == nil {
		c.Endpoints = map[string]struct{}{}
	}
	c.Endpoints[host] = struct{}{}
}

// record notes that a resource of kind went from old to updated (either may be nil).
func (c *Change) record(kind schema.Kind, old, updated *bus.Resource) {
	if kind.TypeURL == schema.Endpoints.TypeURL {
		for _, r := range []*bus.Resource{old, updated} {
			if r != nil {
				c.addEndpoints(r.Body.(*discoveryv1.Endpoints).GetHostname())
			}
		}
		return
	}
	c.Full = true
	for _, r := range []*bus.Resource{old, updated} {
		if r == nil {
			continue
		}
		ns, name := schema.SplitName(r.Name)
		key := ConfigKey{Kind: kind.Kind, Namespace: ns, Name: name}
		c.addConfig(key, visibility(kind, ns, r))
	}
}

// visibility is where a resource can have effect, as far as the push filter cares.
func visibility(kind schema.Kind, ns string, r *bus.Resource) Visibility {
	type exporter interface{ GetExportTo() []string }
	switch body := r.Body.(type) {
	case *discoveryv1.Service:
		// Registry services are keyed by hostname so endpoint and config changes line up.
		return ExportVisibility(body.GetNamespace(), body.GetExportTo())
	case exporter:
		return ExportVisibility(ns, body.GetExportTo())
	}
	if kind.TypeURL == schema.Sidecar.TypeURL {
		// A Sidecar in the root namespace is the mesh default; the filter widens it then.
		return Visibility{Namespaces: []string{ns}}
	}
	return Visibility{All: true}
}
