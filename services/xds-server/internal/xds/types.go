// Package xds is the xds-server's ADS server: connections and their subscriptions (state of the
// world and delta), ACK/NACK, make-before-break ordering, a debounced push pipeline with a
// per-proxy queue, and a cache that shares encoded resources between proxies.
package xds

import (
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	networking "istio.io/api/networking/v1alpha3"

	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/shared/xdstype"
)

// Generator builds the resources of one type a proxy needs; names empty means everything of
// that type, else only those names (unknown names are left out). Errors wrapping
// ErrUnsupported mean "this proxy gets none of that type".
type Generator interface {
	Generate(snap *model.Snapshot, proxy *model.Proxy, typeURL string, names []string) ([]types.Resource, error)
}

// Scoper is implemented by generators whose output many proxies share. CacheScope must return
// equal keys for two proxies only when Generate gives them the same resources of typeURL for
// snap and for every later snapshot with the same ConfigVersion (endpoints may change); the
// cache then generates and encodes once per key. The snapshot lets the key hold derived inputs
// (the Sidecar that applies, the inbound ports) instead of raw ones (labels, IPs), which would
// defeat sharing. Generators without it are cached per proxy.
type Scoper interface {
	CacheScope(snap *model.Snapshot, proxy *model.Proxy, typeURL string) string
}

// ErrUnsupported is what generators wrap for types or proxies they do not serve.
var ErrUnsupported = errors.New("unsupported")

// The types a push sends, in make-before-break order: clusters and their endpoints exist before
// the listeners and routes that use them.
// The name table (NDS) comes last: the agent's DNS answers only what Envoy has listeners for.
var pushOrder = []string{resourcev3.ClusterType, resourcev3.EndpointType, resourcev3.ListenerType, resourcev3.RouteType,
	xdstype.NameTable}

// fullState types must list every subscribed resource in each state-of-the-world response.
func fullState(typeURL string) bool {
	return typeURL == resourcev3.ClusterType || typeURL == resourcev3.ListenerType
}

// PushRequest is what a push must bring up to date; requests merge.
type PushRequest struct {
	// Full is set when config changed, not only endpoints.
	Full bool
	// Configs are the changed configs with where they are visible (see model.Change).
	Configs map[model.ConfigKey]model.Visibility
	// Endpoints are hostnames whose endpoints changed.
	Endpoints map[string]struct{}
	// Hosts are what changed Services, VirtualServices and DestinationRules concern (see
	// model.Change); sidecars whose Sidecar imports none of them are skipped.
	Hosts map[model.ConfigKey]model.HostSet
	// Forced pushes every watched type to the proxy (new snapshot after connect, tests).
	Forced bool
	// Resend sends again everything the proxy holds, even unchanged (istiod's debug push).
	Resend bool
	// Secrets: Kubernetes Secrets changed; SDS is brought up to date (see Options.Secrets).
	Secrets bool
	// Start is when the oldest merged change happened, for latency metrics.
	Start time.Time
	// Traces are the sampled pushes this request belongs to (see PushTracer), merged
	// requests keeping each; nil when none is traced, which is what keeps untraced pushes
	// free of per-proxy tracing work.
	Traces []*PushTrace
}

// Merge returns a request covering both.
func (r *PushRequest) Merge(o *PushRequest) *PushRequest {
	if r == nil {
		return o
	}
	if o == nil {
		return r
	}
	ch := model.Change{Full: r.Full, Configs: r.Configs, Endpoints: r.Endpoints, Hosts: r.Hosts}
	// Change.Merge writes into its maps; copy so neither input is modified.
	out := model.Change{}
	out.Merge(ch)
	out.Merge(model.Change{Full: o.Full, Configs: o.Configs, Endpoints: o.Endpoints, Hosts: o.Hosts})
	start := r.Start
	if start.IsZero() || (!o.Start.IsZero() && o.Start.Before(start)) {
		start = o.Start
	}
	return &PushRequest{Full: out.Full, Configs: out.Configs, Endpoints: out.Endpoints, Hosts: out.Hosts, Forced: r.Forced || o.Forced, Resend: r.Resend || o.Resend, Secrets: r.Secrets || o.Secrets, Start: start,
		Traces: mergeTraces(r.Traces, o.Traces)}
}

// affectedTypes is which of pushOrder a request can change for proxy; nil means no push.
// Rules follow which generated types read which kind (see envoygen and grpcgen).
func affectedTypes(p *model.Proxy, req *PushRequest, snap *model.Snapshot) map[string]bool {
	all := map[string]bool{}
	for _, t := range pushOrder {
		all[t] = true
	}
	if req.Forced {
		return all
	}
	out := map[string]bool{}
	add := func(ts ...string) {
		for _, t := range ts {
			out[t] = true
		}
	}
	if len(req.Endpoints) > 0 {
		add(resourcev3.EndpointType)
		// A workload's own endpoints give the ports it serves: its inbound listeners (and a
		// sidecar's inbound clusters) change when one appears or changes, e.g. when its pod
		// becomes ready after a proxyless server asked for its listener.
		if !p.IsRouter() && ownEndpointChanged(p, req.Endpoints, snap) {
			add(resourcev3.ListenerType)
			if p.IsSidecar() {
				add(resourcev3.ClusterType)
			}
		}
		// Headless services are named by their endpoints' addresses.
		if namedEndpointsChanged(req.Endpoints, snap) {
			add(xdstype.NameTable)
		}
	}
	if !req.Full {
		return out
	}
	root := model.DefaultRootNamespace
	if snap != nil {
		root = snap.RootNamespace()
	}
	imports := sidecarFilter(p, req, snap)
	for key, vis := range req.Configs {
		switch key.Kind {
		case "VirtualService":
			if !vis.Sees(p.Namespace) || !imports(key) {
				continue
			}
			if p.IsProxyless() {
				add(resourcev3.RouteType)
			} else {
				// Envoy also has TCP/TLS routes inside listeners.
				add(resourcev3.ListenerType, resourcev3.RouteType)
			}
		case "DestinationRule":
			// Routes too: their hash policies come from the rule's consistentHash (istiod
			// pushes RDS on DestinationRule changes).
			if vis.Sees(p.Namespace) && imports(key) {
				add(resourcev3.ClusterType, resourcev3.EndpointType, resourcev3.RouteType)
			}
		case "Service":
			if vis.Sees(p.Namespace) && imports(key) {
				add(pushOrder...)
			}
		case "Gateway":
			if p.IsRouter() {
				add(resourcev3.ListenerType, resourcev3.RouteType)
			}
		case "Sidecar":
			if !p.IsRouter() && (vis.Sees(p.Namespace) || key.Namespace == root) {
				add(pushOrder...)
			}
		case model.JWKSKind:
			// Keys inlined into the jwt_authn filters of sidecars' and gateways' listeners.
			if !p.IsProxyless() {
				add(resourcev3.ListenerType)
			}
		case "AuthorizationPolicy", "RequestAuthentication":
			// Filters of the inbound chains of sidecars and proxyless servers, and of
			// gateways' chains: listeners only.
			if vis.Sees(p.Namespace) || key.Namespace == root {
				add(resourcev3.ListenerType)
			}
		case model.EndpointTLSKind:
			// mTLS SANs, and proxyless auto mTLS, read the service's endpoints.
			if vis.Sees(p.Namespace) && imports(key) {
				add(resourcev3.ClusterType)
			}
		case "PeerAuthentication":
			// The mTLS chains of inbound listeners of the namespace's workloads (every
			// workload's for the root namespace), and clusters and endpoints everywhere: auto
			// mTLS infers a destination's mode from its namespace's policy, and Envoy's EDS
			// marks the endpoints whose own policy does not DISABLE mTLS.
			if vis.Sees(p.Namespace) || key.Namespace == root {
				add(resourcev3.ListenerType)
			}
			add(resourcev3.ClusterType, resourcev3.EndpointType)
		default: // MeshConfig and kinds without a finer rule.
			return all
		}
	}
	return out
}

// ownEndpointChanged reports whether a host whose endpoints changed has one at p's IPs in snap.
func ownEndpointChanged(p *model.Proxy, hosts map[string]struct{}, snap *model.Snapshot) bool {
	if snap == nil || len(p.IPs) == 0 {
		return false
	}
	for h := range hosts {
		if svc := snap.Services[h]; svc != nil {
			for _, ep := range svc.Endpoints {
				if p.HasIP(ep.GetAddress()) {
					return true
				}
			}
		}
	}
	return false
}

// namedEndpointsChanged reports whether a host whose endpoints changed is one the name table
// answers with its endpoints (model.NamesEndpoints); unknown hosts are assumed to be.
func namedEndpointsChanged(hosts map[string]struct{}, snap *model.Snapshot) bool {
	if snap == nil {
		return true
	}
	for h := range hosts {
		if svc := snap.Services[h]; svc == nil || model.NamesEndpoints(svc.Spec) {
			return true
		}
	}
	return false
}

// sidecarFilter returns whether a Service, VirtualService or DestinationRule change can reach
// proxy p through the Sidecar that applies to it: only sidecars are scoped by Sidecars, and
// changes with unknown hosts are assumed to reach every proxy.
func sidecarFilter(p *model.Proxy, req *PushRequest, snap *model.Snapshot) func(model.ConfigKey) bool {
	if !p.IsSidecar() || snap == nil {
		return func(model.ConfigKey) bool { return true }
	}
	var sc *model.Config[*networking.Sidecar]
	selected := false
	return func(key model.ConfigKey) bool {
		hs, ok := req.Hosts[key]
		if !ok || hs.Unknown {
			return true
		}
		for _, a := range hs.Addresses {
			if p.HasIP(a) {
				return true
			}
		}
		if !selected {
			sc, selected = model.SelectSidecar(snap, p), true
		}
		if sc == nil {
			return true
		}
		for _, h := range hs.Hosts {
			if model.SidecarImports(sc.Spec, sc.Namespace, h.Namespace, h.Hostname) {
				return true
			}
		}
		return false
	}
}

// hostOfCluster reads the hostname out of istiod's cluster names, "outbound|port|subset|host";
// "" when the name has no hostname (inbound clusters, or foreign names).
func hostOfCluster(name string) string {
	if rest, ok := strings.CutPrefix(name, "outbound_."); ok {
		// An SNI-DNAT cluster: "outbound_.<port>_.<subset>_.<host>".
		if parts := strings.SplitN(rest, "_.", 3); len(parts) == 3 {
			return parts[2]
		}
		return ""
	}
	if !strings.HasPrefix(name, "outbound|") {
		return ""
	}
	i := strings.LastIndexByte(name, '|')
	return name[i+1:]
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
