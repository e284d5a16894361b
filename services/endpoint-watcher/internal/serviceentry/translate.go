// Package serviceentry turns Istio ServiceEntry and WorkloadEntry resources into Sailplane's
// registry resources: one discoveryv1.Service and one discoveryv1.Endpoints per
// (namespace, hostname). Translation follows istiod's ServiceEntry registry.
package serviceentry

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	networking "istio.io/api/networking/v1alpha3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
)

// Registry is the value of Service.registry for everything this package produces.
const Registry = "serviceentry"

// unixPrefix marks a Unix domain socket endpoint address; such endpoints have no port.
const unixPrefix = "unix://"

// ErrUntranslatable is wrapped by every TranslationError.
var ErrUntranslatable = errors.New("cannot translate")

// TranslationError says which field of which resource could not be translated.
type TranslationError struct {
	Kind      string
	Namespace string
	Name      string
	Field     string
	Reason    string
}

func (e *TranslationError) Error() string {
	return fmt.Sprintf("%s %s/%s: %s: %s", e.Kind, e.Namespace, e.Name, e.Field, e.Reason)
}

// Unwrap lets callers test with errors.Is(err, ErrUntranslatable).
func (e *TranslationError) Unwrap() error { return ErrUntranslatable }

// serviceEntry is a validated ServiceEntry as the index keeps it.
type serviceEntry struct {
	namespace, name string
	created         time.Time
	labels          map[string]string
	spec            *networking.ServiceEntry
	hosts           []string // deduplicated, declaration order
	endpoints       []*endpointSource
}

func (se *serviceEntry) key() string { return schema.Name(se.namespace, se.name) }

// hasSelector reports whether endpoints come from WorkloadEntries; as in Istio, inline
// endpoints are then ignored (validation forbids setting both).
func (se *serviceEntry) hasSelector() bool { return se.spec.GetWorkloadSelector() != nil }

func (se *serviceEntry) selects(we *workloadEntry) bool {
	if !se.hasSelector() || we.namespace != se.namespace {
		return false
	}
	for k, v := range se.spec.GetWorkloadSelector().GetLabels() {
		if got, ok := we.labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// endpointSource is an inline SE endpoint or a WorkloadEntry, validated, before it is bound to
// the ports of one ServiceEntry.
type endpointSource struct {
	address        string
	ports          map[string]uint32
	labels         map[string]string
	network        string
	locality       *discoveryv1.Locality
	weight         uint32
	serviceAccount string
	workload       string
	// clusterID overrides the index's cluster ID for workloads of other registries (Pods).
	clusterID string
	health    discoveryv1.Health
}

// workloadEntry is a validated WorkloadEntry as the index keeps it.
type workloadEntry struct {
	namespace, name string
	labels          map[string]string // spec labels overlaid with metadata labels
	ep              *endpointSource
}

// body extracts the spec message of kind k from a bus resource, accepting an Any for
// transports that do not decode bodies.
func body[T proto.Message](k schema.Kind, r *bus.Resource) (T, error) {
	var zero T
	switch b := r.Body.(type) {
	case T:
		return b, nil
	case *anypb.Any:
		m := k.New()
		if err := b.UnmarshalTo(m); err != nil {
			return zero, err
		}
		if t, ok := m.(T); ok {
			return t, nil
		}
	}
	return zero, fmt.Errorf("body is %T", r.Body)
}

func splitNamespaced(kind string, r *bus.Resource) (ns, name string, err error) {
	ns, name = schema.SplitName(r.Name)
	if ns == "" || name == "" {
		return "", "", &TranslationError{Kind: kind, Name: r.Name, Field: "metadata.namespace",
			Reason: "resource name must be namespace/name"}
	}
	return ns, name, nil
}

func convertServiceEntry(r *bus.Resource) (*serviceEntry, error) {
	const kind = "ServiceEntry"
	ns, name, err := splitNamespaced(kind, r)
	if err != nil {
		return nil, err
	}
	fail := func(field, format string, args ...any) error {
		return &TranslationError{Kind: kind, Namespace: ns, Name: name, Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	spec, err := body[*networking.ServiceEntry](schema.ServiceEntry, r)
	if err != nil {
		return nil, fail("body", "%v", err)
	}
	if _, err := resolution(spec.GetResolution()); err != nil {
		return nil, fail("spec.resolution", "%v", err)
	}
	se := &serviceEntry{namespace: ns, name: name, created: r.CreateTime, labels: r.Labels, spec: spec}
	for i, h := range spec.GetHosts() {
		if h == "" || strings.Contains(h, "/") {
			return nil, fail(fmt.Sprintf("spec.hosts[%d]", i), "invalid host %q", h)
		}
		if !slices.Contains(se.hosts, h) {
			se.hosts = append(se.hosts, h)
		}
	}
	if len(se.hosts) == 0 {
		return nil, fail("spec.hosts", "no hosts")
	}
	for i, a := range spec.GetAddresses() {
		if _, err := listenAddress(a); err != nil {
			return nil, fail(fmt.Sprintf("spec.addresses[%d]", i), "%v", err)
		}
	}
	names := map[string]bool{}
	for i, p := range spec.GetPorts() {
		field := fmt.Sprintf("spec.ports[%d]", i)
		switch {
		case p == nil:
			return nil, fail(field, "empty port")
		case p.GetName() == "":
			// Endpoint ports are keyed by port name, so a port without one has no endpoints.
			return nil, fail(field+".name", "port name is required")
		case names[p.GetName()]:
			return nil, fail(field+".name", "duplicate port name %q", p.GetName())
		case p.GetNumber() == 0 || p.GetNumber() > 65535:
			return nil, fail(field+".number", "invalid port %d", p.GetNumber())
		case p.GetTargetPort() > 65535:
			return nil, fail(field+".targetPort", "invalid port %d", p.GetTargetPort())
		}
		names[p.GetName()] = true
	}
	if !se.hasSelector() {
		for i, wle := range spec.GetEndpoints() {
			ep, err := convertEndpointSource(wle)
			if err != nil {
				var te *TranslationError
				if errors.As(err, &te) {
					return nil, fail(fmt.Sprintf("spec.endpoints[%d].%s", i, te.Field), "%s", te.Reason)
				}
				return nil, err
			}
			se.endpoints = append(se.endpoints, ep)
		}
	}
	return se, nil
}

func convertWorkloadEntry(r *bus.Resource) (*workloadEntry, error) {
	const kind = "WorkloadEntry"
	ns, name, err := splitNamespaced(kind, r)
	if err != nil {
		return nil, err
	}
	spec, err := body[*networking.WorkloadEntry](schema.WorkloadEntry, r)
	if err != nil {
		return nil, &TranslationError{Kind: kind, Namespace: ns, Name: name, Field: "body", Reason: err.Error()}
	}
	ep, err := convertEndpointSource(spec)
	if err != nil {
		var te *TranslationError
		if errors.As(err, &te) {
			te.Kind, te.Namespace, te.Name, te.Field = kind, ns, name, "spec."+te.Field
		}
		return nil, err
	}
	// As istiod does, metadata labels take precedence over spec labels, for both selection and
	// the endpoint's labels.
	var labels map[string]string
	if len(spec.GetLabels())+len(r.Labels) > 0 {
		labels = maps.Clone(spec.GetLabels())
		if labels == nil {
			labels = map[string]string{}
		}
		maps.Copy(labels, r.Labels)
	}
	ep.labels = meshLabels(labels, spec.GetServiceAccount())
	ep.workload = name
	return &workloadEntry{namespace: ns, name: name, labels: labels, ep: ep}, nil
}

// convertEndpointSource validates the fields shared by inline endpoints and WorkloadEntries. Its
// TranslationErrors carry only Field (relative) and Reason; callers fill in the rest.
func convertEndpointSource(wle *networking.WorkloadEntry) (*endpointSource, error) {
	if wle == nil {
		return nil, &TranslationError{Field: "address", Reason: "empty endpoint"}
	}
	if wle.GetAddress() == "" {
		return nil, &TranslationError{Field: "address", Reason: "address is required"}
	}
	for name, p := range wle.GetPorts() {
		if p > 65535 {
			return nil, &TranslationError{Field: "ports." + name, Reason: fmt.Sprintf("invalid port %d", p)}
		}
	}
	loc, err := parseLocality(wle.GetLocality())
	if err != nil {
		return nil, &TranslationError{Field: "locality", Reason: err.Error()}
	}
	return &endpointSource{
		address:        wle.GetAddress(),
		ports:          wle.GetPorts(),
		labels:         meshLabels(wle.GetLabels(), wle.GetServiceAccount()),
		network:        wle.GetNetwork(),
		locality:       loc,
		weight:         wle.GetWeight(),
		serviceAccount: wle.GetServiceAccount(),
	}, nil
}

// parseLocality parses "region/zone/subzone"; trailing parts may be omitted.
func parseLocality(s string) (*discoveryv1.Locality, error) {
	if s == "" {
		return nil, nil
	}
	parts := strings.Split(s, "/")
	if len(parts) > 3 {
		return nil, fmt.Errorf("locality %q has more than region/zone/subzone", s)
	}
	parts = append(parts, "", "")
	return &discoveryv1.Locality{Region: parts[0], Zone: parts[1], SubZone: parts[2]}, nil
}

// listenAddress reads a ServiceEntry address: an IP, or a CIDR range, which sidecars match
// as a destination range. As istiod does, a range of a single address (/32, /128) is written
// as the plain address, which gets a listener of its own.
func listenAddress(a string) (string, error) {
	if _, err := netip.ParseAddr(a); err == nil {
		return a, nil
	}
	p, err := netip.ParsePrefix(a)
	if err != nil {
		return "", fmt.Errorf("address %q is neither an IP address nor a CIDR range", a)
	}
	if p.IsSingleIP() {
		return p.Addr().String(), nil
	}
	return a, nil
}

func resolution(r networking.ServiceEntry_Resolution) (discoveryv1.Resolution, error) {
	switch r {
	case networking.ServiceEntry_NONE:
		return discoveryv1.Resolution_NONE, nil
	case networking.ServiceEntry_STATIC:
		return discoveryv1.Resolution_STATIC, nil
	case networking.ServiceEntry_DNS:
		return discoveryv1.Resolution_DNS, nil
	case networking.ServiceEntry_DNS_ROUND_ROBIN:
		return discoveryv1.Resolution_DNS_ROUND_ROBIN, nil
	case networking.ServiceEntry_DYNAMIC_DNS:
		// The registry has no dynamic-forward-proxy mode; DNS is the closest behaviour.
		return discoveryv1.Resolution_DNS, nil
	}
	return 0, fmt.Errorf("unknown resolution %d", r)
}

func isDNS(r networking.ServiceEntry_Resolution) bool {
	return r == networking.ServiceEntry_DNS || r == networking.ServiceEntry_DNS_ROUND_ROBIN ||
		r == networking.ServiceEntry_DYNAMIC_DNS
}

// exportTo resolves "." to the SE's namespace and collapses a list holding "*" to just "*"
// (kept, unlike an empty exportTo, which leaves the mesh's defaultServiceExportTo in force).
func exportTo(ns string, in []string) []string {
	var out []string
	for _, e := range in {
		switch e {
		case "*":
			return []string{"*"}
		case ".":
			e = ns
		}
		if !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	slices.Sort(out)
	return out
}

// endpointPort picks the port an endpoint listens on for one service port, with istiod's
// priority: unix socket (no port) > endpoint ports[name] > targetPort > port number.
func endpointPort(ep *endpointSource, sp *networking.ServicePort) uint32 {
	switch {
	case strings.HasPrefix(ep.address, unixPrefix):
		return 0
	case ep.ports[sp.GetName()] > 0:
		return ep.ports[sp.GetName()]
	case sp.GetTargetPort() > 0:
		return sp.GetTargetPort()
	}
	return sp.GetNumber()
}

// tlsModeLabel marks a workload that holds mesh certificates (Istio's injector puts it on Pods).
const tlsModeLabel = "security.istio.io/tlsMode"

// meshLabels are the labels (a copy) of a WorkloadEntry or a ServiceEntry endpoint with, as
// istiod decides for them (not for Pods, whose injector sets the label), tlsMode "istio" when it
// names a service account and does not set the label itself: such a workload runs a proxy with
// a mesh identity, so clients use Istio mTLS to it.
func meshLabels(labels map[string]string, serviceAccount string) map[string]string {
	out := maps.Clone(labels)
	if serviceAccount == "" {
		return out
	}
	if _, ok := out[tlsModeLabel]; !ok {
		if out == nil {
			out = map[string]string{}
		}
		out[tlsModeLabel] = "istio"
	}
	return out
}

// bind makes the registry endpoint of ep for the ports of se.
func bind(ep *endpointSource, se *serviceEntry, clusterID string) *discoveryv1.Endpoint {
	out := &discoveryv1.Endpoint{
		Address:        ep.address,
		Labels:         maps.Clone(ep.labels),
		ServiceAccount: ep.serviceAccount,
		Weight:         ep.weight,
		Health:         ep.health,
		ClusterId:      cmp.Or(ep.clusterID, clusterID),
		Network:        ep.network,
		Workload:       ep.workload,
	}
	if ep.locality != nil {
		out.Locality = proto.CloneOf(ep.locality)
	}
	if len(se.spec.GetPorts()) > 0 {
		out.Ports = make(map[string]uint32, len(se.spec.GetPorts()))
		for _, sp := range se.spec.GetPorts() {
			out.Ports[sp.GetName()] = endpointPort(ep, sp)
		}
	}
	return out
}
