package analyze

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/shared/config"
	"sailplane.dev/shared/schema"
)

// ErrDuplicate: two documents define the same resource; the first one read wins, as in
// config-ingest.
var ErrDuplicate = errors.New("duplicate resource")

// Set is the config and registry the analyzers look at.
type Set struct {
	// Configs are the valid Istio resources, in the order read (the first is the oldest).
	Configs []config.Config
	// Services are the registry's services: Kubernetes Services read from files, or the registry
	// bus's. Hosts are checked against them and the ServiceEntries.
	Services []*discoveryv1.Service
	// NoRegistry: the registry was not read, so destination hosts are not checked (every host
	// but the ServiceEntries' would be reported missing).
	NoRegistry bool

	seen map[key]config.Source
}

type key struct{ typeURL, name string }

// AddFile reads one file of YAML (or JSON) documents as config-ingest reads its folders: every
// Istio and Gateway API document is parsed and validated on its own, and what is invalid is
// reported and left out. Documents of other API groups (a manifest's Deployment beside its
// VirtualService) are not config and are skipped, except Kubernetes Services, which are kept as
// registry services. An Istio or Gateway API kind Sailplane does not read (EnvoyFilter …) is an
// error, as for config-ingest. Gateway API specs are not checked against their CRDs' schemas
// here (that would link the API server's validators into sailplanectl); config-ingest does.
func (s *Set) AddFile(file string, data []byte, defaultNamespace string) []Message {
	var msgs []Message
	for i, doc := range config.SplitDocuments(data) {
		var m manifest
		if yaml.Unmarshal(doc, &m) == nil && m.APIVersion != "" && m.Kind != "" && !istioGroup(m.APIVersion) {
			if svc, ok := m.service(defaultNamespace); ok {
				s.Services = append(s.Services, svc)
			}
			continue
		}
		cfgs, errs := config.ParseYAML(file, doc, defaultNamespace)
		for _, err := range errs {
			for _, e := range config.Errors(err) {
				e.Doc = i + 1
				msgs = append(msgs, fromError(e))
			}
		}
		for _, c := range cfgs {
			c.Source.Doc = i + 1
			msgs = append(msgs, s.Add(c)...)
		}
	}
	return msgs
}

// istioGroup reports whether apiVersion is of one of Istio's API groups (networking.istio.io …)
// or the Gateway API's, which Sailplane reads as config too.
func istioGroup(apiVersion string) bool {
	group, _, ok := strings.Cut(apiVersion, "/")
	return ok && (group == "istio.io" || strings.HasSuffix(group, ".istio.io") || group == schema.GatewayAPIGroup)
}

// Add validates c and keeps it when valid and not a duplicate.
func (s *Set) Add(c config.Config) []Message {
	if s.seen == nil {
		s.seen = map[key]config.Source{}
	}
	k := key{c.Kind.TypeURL, c.BusName()}
	if first, dup := s.seen[k]; dup {
		return []Message{about(c, Error, CodeSchemaValidationError, "",
			fmt.Sprintf("%v: already defined in %s document %d, which wins", ErrDuplicate, first.File, first.Doc))}
	}
	warnings, err := config.Validate(c)
	var msgs []Message
	for _, w := range warnings {
		m := about(c, Warning, CodeSchemaWarning, w.Field, w.Message)
		msgs = append(msgs, m)
	}
	for _, e := range config.Errors(err) {
		msgs = append(msgs, fromError(e))
	}
	if err != nil {
		return msgs
	}
	s.seen[k] = c.Source
	s.Configs = append(s.Configs, c)
	return msgs
}

func fromError(e *config.Error) Message {
	text := "invalid"
	if e.Err != nil {
		text = e.Err.Error()
	}
	return Message{
		Level: Error, Code: CodeSchemaValidationError, Kind: e.Kind, Namespace: e.Namespace, Name: e.Name,
		File: e.File, Doc: e.Doc, Field: e.Field, Message: text,
	}
}

// manifest is what AddFile reads of a document that is not Istio config.
type manifest struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Spec struct {
		Ports []struct {
			Name string `json:"name"`
			Port uint32 `json:"port"`
		} `json:"ports"`
	} `json:"spec"`
}

// service is a Kubernetes Service manifest as a registry service, named as endpoint-watcher names
// it.
func (m manifest) service(defaultNamespace string) (*discoveryv1.Service, bool) {
	if m.APIVersion != "v1" || m.Kind != "Service" || m.Metadata.Name == "" {
		return nil, false
	}
	ns := cmp.Or(m.Metadata.Namespace, defaultNamespace)
	svc := &discoveryv1.Service{Hostname: resolveHost(m.Metadata.Name, ns), Namespace: ns, Registry: "kubernetes"}
	for _, p := range m.Spec.Ports {
		svc.Ports = append(svc.Ports, &discoveryv1.Port{Name: p.Name, Number: p.Port})
	}
	return svc, true
}

// of returns the specs of kind k in s, with their configs.
func of[T any](s *Set, k schema.Kind) []typed[T] {
	var out []typed[T]
	for _, c := range s.Configs {
		if c.Kind.TypeURL != k.TypeURL {
			continue
		}
		if spec, ok := c.Spec.(T); ok {
			out = append(out, typed[T]{c, spec})
		}
	}
	return out
}

type typed[T any] struct {
	config.Config
	spec T
}

// Sort orders msgs by origin, resource, field, then text, so that output is stable whatever
// the analyzers' order.
func Sort(msgs []Message) []Message {
	slices.SortStableFunc(msgs, func(a, b Message) int {
		return cmp.Or(cmp.Compare(a.File, b.File), cmp.Compare(a.Doc, b.Doc), cmp.Compare(a.Resource(), b.Resource()),
			cmp.Compare(a.Field, b.Field), cmp.Compare(a.Message, b.Message))
	})
	return msgs
}
