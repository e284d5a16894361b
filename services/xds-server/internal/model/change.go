package model

import (
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"
	networking "istio.io/api/networking/v1alpha3"

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
	// Since is when the oldest of the merged changes was recorded: where debouncing and
	// convergence times start.
	Since time.Time
	// Configs are the changed config and registry resources, each with the namespaces that
	// could see its old or new version.
	Configs map[ConfigKey]Visibility
	// Endpoints are the hostnames whose endpoints changed.
	Endpoints map[string]struct{}
	// Hosts are, for changed Service, VirtualService and DestinationRule keys, the hostnames
	// their old and new versions concern, read from the resources and from the previous and
	// new snapshots (see Store.Next). A key of those kinds without an entry concerns unknown
	// hosts.
	Hosts map[ConfigKey]HostSet
	// Traces are the traced bus deliveries merged into this change, oldest first, at most
	// MaxTraces: the push continues their traces (see xds.PushTracer).
	Traces []TracedChange
	// Untraced counts the traced deliveries left out of Traces.
	Untraced int
}

// TracedChange is one traced bus delivery: the context of its "bus.deliver" span and when it
// was applied (the start of its wait for the debouncer).
type TracedChange struct {
	Span trace.SpanContext
	At   time.Time
}

// MaxTraces bounds Change.Traces: a burst of thousands of traced changes merged into one push
// links the first ones only, and counts the others in Change.Untraced.
const MaxTraces = 64

func (c *Change) addTrace(t TracedChange) {
	if len(c.Traces) < MaxTraces {
		c.Traces = append(c.Traces, t)
	} else {
		c.Untraced++
	}
}

// HostRef is a hostname with a namespace to match Sidecar egress hosts ("ns/host") against.
type HostRef struct {
	Namespace string
	Hostname  string
}

// HostSet is what a change concerns, so pushes can skip sidecars whose Sidecar imports none of
// it. The zero value concerns nothing.
type HostSet struct {
	// Unknown is set when the hosts cannot be listed (wildcard or missing hosts): every proxy
	// that can see the change must be pushed.
	Unknown bool
	Hosts   []HostRef
	// Addresses are the endpoint addresses of a changed Service, or of the services a changed
	// DestinationRule names, in either snapshot: workloads at them take inbound ports (and
	// inbound connection pools) from it whatever their Sidecar imports.
	Addresses []string
}

// Union merges two host sets.
func (h HostSet) Union(o HostSet) HostSet {
	out := HostSet{Unknown: h.Unknown || o.Unknown, Hosts: slices.Clone(h.Hosts), Addresses: slices.Clone(h.Addresses)}
	for _, r := range o.Hosts {
		if !slices.Contains(out.Hosts, r) {
			out.Hosts = append(out.Hosts, r)
		}
	}
	for _, a := range o.Addresses {
		if !slices.Contains(out.Addresses, a) {
			out.Addresses = append(out.Addresses, a)
		}
	}
	return out
}

// Empty reports whether nothing changed.
func (c Change) Empty() bool { return !c.Full && len(c.Configs) == 0 && len(c.Endpoints) == 0 }

// Merge adds o to c.
func (c *Change) Merge(o Change) {
	c.Full = c.Full || o.Full
	if c.Since.IsZero() || (!o.Since.IsZero() && o.Since.Before(c.Since)) {
		c.Since = o.Since
	}
	for k, v := range o.Configs {
		c.addConfig(k, v)
	}
	for h := range o.Endpoints {
		c.addEndpoints(h)
	}
	for k, h := range o.Hosts {
		c.addHosts(k, h)
	}
	for _, t := range o.Traces {
		c.addTrace(t)
	}
	c.Untraced += o.Untraced
}

// seen starts Since, if it is not yet.
func (c *Change) seen() {
	if c.Since.IsZero() {
		c.Since = time.Now()
	}
}

func (c *Change) addHosts(k ConfigKey, h HostSet) {
	if c.Hosts == nil {
		c.Hosts = map[ConfigKey]HostSet{}
	}
	if old, ok := c.Hosts[k]; ok {
		h = old.Union(h)
	}
	c.Hosts[k] = h
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
	c.seen()
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
		if hs, ok := resourceHosts(ns, r); ok {
			c.addHosts(key, hs)
		}
	}
}

// resourceHosts lists the hostnames a Service, VirtualService or DestinationRule names; ok is
// false for other kinds.
func resourceHosts(ns string, r *bus.Resource) (HostSet, bool) {
	var hs HostSet
	add := func(host string) {
		rh := ResolveHost(host, ns)
		if rh == "" || strings.Contains(rh, "*") {
			hs.Unknown = true
			return
		}
		hs.Hosts = append(hs.Hosts, HostRef{Namespace: ns, Hostname: rh})
	}
	switch body := r.Body.(type) {
	case *discoveryv1.Service:
		hs.Hosts = append(hs.Hosts, HostRef{Namespace: body.GetNamespace(), Hostname: body.GetHostname()})
		// An east-west gateway stands in for other services' endpoints: whoever sees those.
		hs.Unknown = len(body.GetNetworkGateways()) > 0
	case *networking.VirtualService:
		if len(body.GetHosts()) == 0 {
			// A delegate: it takes the hosts of the VirtualServices that delegate to it.
			hs.Unknown = true
		}
		for _, h := range body.GetHosts() {
			add(h)
		}
	case *networking.DestinationRule:
		add(body.GetHost())
	default:
		return HostSet{}, false
	}
	return hs, true
}

// resolveHosts completes Hosts once the previous (nil at first) and new snapshots are known:
// VirtualService and DestinationRule hosts get the namespace of the service they name, since
// Sidecars import services by the service's namespace; Services get their endpoint addresses
// and the hosts of the VirtualServices routing to them (routes read a destination's ports).
func (c *Change) resolveHosts(snaps ...*Snapshot) {
	var routing map[string][]*Config[*networking.VirtualService]
	for key, hs := range c.Hosts {
		if hs.Unknown {
			continue
		}
		refs := hs.Hosts
		if key.Kind == schema.VirtualService.Kind || key.Kind == schema.DestinationRule.Kind {
			// Generation reads these only through the services they name; a host naming no
			// service keeps the config's namespace, to stay conservative.
			hs.Hosts = nil
			for _, r := range refs {
				found := false
				for _, snap := range snaps {
					if svc := snapService(snap, r.Hostname); svc != nil {
						found = true
						hs = hs.Union(HostSet{Hosts: []HostRef{{Namespace: svc.Spec.GetNamespace(), Hostname: r.Hostname}}})
					}
				}
				if !found {
					hs = hs.Union(HostSet{Hosts: []HostRef{r}})
				}
			}
		}
		for _, snap := range snaps {
			if snap == nil {
				continue
			}
			switch key.Kind {
			case schema.DestinationRule.Kind:
				// A rule's connection pool also limits its service's inbound clusters.
				for _, r := range hs.Hosts {
					if svc := snap.Services[r.Hostname]; svc != nil {
						for _, ep := range svc.Endpoints {
							hs.Addresses = append(hs.Addresses, ep.GetAddress())
						}
					}
				}
			case schema.Service.Kind:
				if routing == nil {
					routing = map[string][]*Config[*networking.VirtualService]{}
					for _, s := range snaps {
						if s != nil {
							indexRouting(s, routing)
						}
					}
				}
				for _, r := range refs {
					if svc := snap.Services[r.Hostname]; svc != nil {
						// Large services have many endpoints: append, and dedupe once below.
						for _, ep := range svc.Endpoints {
							hs.Addresses = append(hs.Addresses, ep.GetAddress())
						}
					}
					for _, vs := range routing[r.Hostname] {
						vh, _ := resourceHosts(vs.Namespace, &bus.Resource{Body: vs.Spec})
						for _, h := range vh.Hosts {
							if svc := snap.Services[h.Hostname]; svc != nil {
								vh.Hosts = append(vh.Hosts, HostRef{Namespace: svc.Spec.GetNamespace(), Hostname: h.Hostname})
							}
						}
						hs = hs.Union(vh)
					}
				}
			}
		}
		slices.Sort(hs.Addresses)
		hs.Addresses = slices.Compact(hs.Addresses)
		c.Hosts[key] = hs
	}
}

func snapService(snap *Snapshot, hostname string) *Service {
	if snap == nil {
		return nil
	}
	return snap.Services[hostname]
}

// indexRouting adds, per destination hostname, the VirtualServices of snap routing to it.
func indexRouting(snap *Snapshot, out map[string][]*Config[*networking.VirtualService]) {
	for i := range snap.VirtualServices {
		vs := &snap.VirtualServices[i]
		add := func(d *networking.Destination) {
			if d == nil {
				return
			}
			h := ResolveHost(d.GetHost(), vs.Namespace)
			if !slices.Contains(out[h], vs) {
				out[h] = append(out[h], vs)
			}
		}
		for _, r := range vs.Spec.GetHttp() {
			for _, d := range r.GetRoute() {
				add(d.GetDestination())
			}
			add(r.GetMirror())
		}
		for _, r := range vs.Spec.GetTcp() {
			for _, d := range r.GetRoute() {
				add(d.GetDestination())
			}
		}
		for _, r := range vs.Spec.GetTls() {
			for _, d := range r.GetRoute() {
				add(d.GetDestination())
			}
		}
	}
}

// visibility is where a resource can have effect, as far as the push filter cares.
func visibility(kind schema.Kind, ns string, r *bus.Resource) Visibility {
	type exporter interface{ GetExportTo() []string }
	switch body := r.Body.(type) {
	case *discoveryv1.Service:
		if len(body.GetNetworkGateways()) > 0 {
			// Network gateways apply mesh-wide, whatever the Service's exportTo.
			return Visibility{All: true}
		}
		// Registry services are keyed by hostname so endpoint and config changes line up.
		return ExportVisibility(body.GetNamespace(), body.GetExportTo())
	case exporter:
		return ExportVisibility(ns, body.GetExportTo())
	}
	switch kind.TypeURL {
	case schema.Sidecar.TypeURL, schema.AuthorizationPolicy.TypeURL, schema.RequestAuthentication.TypeURL,
		schema.PeerAuthentication.TypeURL:
		// These apply to workloads of their own namespace; in the root namespace, to every
		// workload: the push filter widens them then.
		return Visibility{Namespaces: []string{ns}}
	}
	return Visibility{All: true}
}
