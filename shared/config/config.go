// Package config is Sailplane's model of one Istio config resource (VirtualService,
// DestinationRule, ...): reading it from Kubernetes-style YAML, validating it the way Istio
// does, and converting it to and from a bus.Resource.
package config

import (
	"maps"
	"time"

	"google.golang.org/protobuf/proto"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
)

// Config is one Istio config resource.
type Config struct {
	Kind        schema.Kind
	Namespace   string
	Name        string
	Labels      map[string]string
	Annotations map[string]string
	// CreateTime is the object's creation in Kubernetes; zero for a file's. The Gateway API
	// orders conflicting objects by it, oldest first.
	CreateTime time.Time
	// Spec is the kind's message (schema.Kind.New()), never nil for a parsed Config.
	Spec   proto.Message
	Source Source
}

// Source is where a Config was read from.
type Source struct {
	File string
	// Doc is the 1-based index of the document in File, counting only non-empty documents (what
	// a human counts between "---" lines); 0 when the Config did not come from a file.
	Doc int
}

// BusName is the resource's name on the bus: "namespace/name".
func (c Config) BusName() string {
	if c.Kind.ClusterScoped {
		return c.Name
	}
	return schema.Name(c.Namespace, c.Name)
}

// Resource converts c for publishing. The Store derives the version; Body is c.Spec itself, so
// c.Spec must not be modified afterwards (bus resources are immutable).
func (c Config) Resource() *bus.Resource {
	return &bus.Resource{
		Name:        c.BusName(),
		Body:        c.Spec,
		Labels:      maps.Clone(c.Labels),
		Annotations: maps.Clone(c.Annotations),
		CreateTime:  c.CreateTime,
	}
}

// FromResource converts a bus resource of kind k back to a Config (without Source).
func FromResource(k schema.Kind, r *bus.Resource) Config {
	ns, name := schema.SplitName(r.Name)
	if k.ClusterScoped {
		ns, name = "", r.Name
	}
	return Config{
		Kind:        k,
		Namespace:   ns,
		Name:        name,
		Labels:      maps.Clone(r.Labels),
		Annotations: maps.Clone(r.Annotations),
		CreateTime:  r.CreateTime,
		Spec:        r.Body,
	}
}

// Equal reports whether a and b have the same identity and content (Source is ignored).
func Equal(a, b Config) bool {
	return a.Kind.TypeURL == b.Kind.TypeURL && a.Namespace == b.Namespace && a.Name == b.Name &&
		maps.Equal(a.Labels, b.Labels) && maps.Equal(a.Annotations, b.Annotations) &&
		a.CreateTime.Equal(b.CreateTime) && proto.Equal(a.Spec, b.Spec)
}
