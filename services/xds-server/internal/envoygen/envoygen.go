// Package envoygen translates the mesh model into the xDS resources Envoy sidecars and gateways
// consume, shaped and named the way istiod builds them so Istio's proxies, tools and dashboards
// work unchanged. Output is computed per proxy from an immutable snapshot and is deterministic:
// the same snapshot and proxy always give byte-identical resources in the same order.
package envoygen

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/services/xds-server/internal/translate"
)

// ErrUnsupported is wrapped by errors for proxies or types this generator does not serve.
var ErrUnsupported = errors.New("unsupported by the Envoy generator")

// Generator builds Envoy configuration. It holds no state between calls and is safe for
// concurrent use.
type Generator struct {
	log      *slog.Logger
	problems model.Problems
	// credentials: credentialName secrets are served over SDS (WithCredentials).
	credentials bool
	// alloc gives ServiceEntry hosts without addresses theirs (WithAutoAddresses).
	alloc *model.Allocator
	indexCache
}

// Option configures a Generator.
type Option func(*Generator)

// WithProblems reports the conflicts generation resolves on its own (a domain two virtual
// hosts want, two services on one listener, ...) to p, as istiod's push status does.
func WithProblems(p model.Problems) Option {
	return func(g *Generator) { g.problems = p }
}

// WithCredentials says that the xds-server serves credentialName secrets
// ("kubernetes://<name>") over SDS: they are then not reported as unserved, and sidecars get
// clusters whose DestinationRule names one, as istiod does.
func WithCredentials(served bool) Option {
	return func(g *Generator) { g.credentials = served }
}

// WithAutoAddresses gives proxies that capture DNS listeners and virtual host domains on the
// addresses alloc gives ServiceEntry hosts without any, as istiod does: the agent's DNS proxy
// answers those names with the same addresses (ndsgen shares alloc), so a plain TCP service
// without a VIP gets a listener of its own instead of sharing the port's wildcard.
func WithAutoAddresses(alloc *model.Allocator) Option {
	return func(g *Generator) { g.alloc = alloc }
}

// New returns a generator logging to log (nil discards).
func New(log *slog.Logger, opts ...Option) *Generator {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g := &Generator{log: log}
	for _, o := range opts {
		o(g)
	}
	return g
}

// Resources are all the resources one proxy needs, each list sorted by name.
type Resources struct {
	Listeners []*listenerv3.Listener
	Routes    []*routev3.RouteConfiguration
	Clusters  []*clusterv3.Cluster
	Endpoints []*endpointv3.ClusterLoadAssignment
}

// Generate returns the resources of typeURL that proxy needs, restricted to names when names is
// not empty (unknown names are left out, as xDS expects). Proxyless gRPC clients are served by
// grpcgen, not here.
func (g *Generator) Generate(snap *model.Snapshot, proxy *model.Proxy, typeURL string,
	names []string) ([]types.Resource, error) {
	b, err := g.builder(snap, proxy)
	if err != nil {
		return nil, err
	}
	var out []types.Resource
	switch typeURL {
	case resourcev3.ClusterType:
		out = asResources(b.clusters())
	case resourcev3.EndpointType:
		out = asResources(b.endpoints())
	case resourcev3.ListenerType:
		out = asResources(b.listeners())
	case resourcev3.RouteType:
		out = asResources(b.routes())
	default:
		return nil, fmt.Errorf("%w: type %q", ErrUnsupported, typeURL)
	}
	if len(names) == 0 {
		return out, nil
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	kept := out[:0]
	for _, r := range out {
		if want[resourceName(r)] {
			kept = append(kept, r)
		}
	}
	return kept, nil
}

// GenerateAll returns every resource proxy needs.
func (g *Generator) GenerateAll(snap *model.Snapshot, proxy *model.Proxy) (*Resources, error) {
	b, err := g.builder(snap, proxy)
	if err != nil {
		return nil, err
	}
	return &Resources{Listeners: b.listeners(), Routes: b.routes(), Clusters: b.clusters(), Endpoints: b.endpoints()}, nil
}

func (g *Generator) builder(snap *model.Snapshot, proxy *model.Proxy) (*builder, error) {
	if snap == nil || proxy == nil {
		return nil, fmt.Errorf("%w: nil snapshot or proxy", ErrUnsupported)
	}
	if proxy.Type != model.SidecarProxy && proxy.Type != model.Router {
		return nil, fmt.Errorf("%w: proxy type %q", ErrUnsupported, proxy.Type)
	}
	b := newBuilder(snap, proxy, g.index(snap), g.log.With("proxy", proxy.NodeID))
	b.problems = g.problems
	b.credentials = g.credentials
	b.auto = g.alloc.For(snap, proxy) // the whole snapshot's, as the name table has them
	return b, nil
}

func resourceName(r types.Resource) string {
	switch x := r.(type) {
	case *endpointv3.ClusterLoadAssignment:
		return x.GetClusterName()
	case interface{ GetName() string }:
		return x.GetName()
	}
	return ""
}

func asResources[T types.Resource](in []T) []types.Resource {
	out := make([]types.Resource, len(in))
	for i, r := range in {
		out[i] = r
	}
	return out
}

func sortByName[T interface{ GetName() string }](s []T) []T {
	slices.SortStableFunc(s, func(a, b T) int { return strings.Compare(a.GetName(), b.GetName()) })
	return s
}

// Names istiod uses.
const (
	BlackHoleCluster          = "BlackHoleCluster"
	PassthroughCluster        = "PassthroughCluster"
	InboundPassthroughCluster = "InboundPassthroughCluster"
	VirtualOutboundListener   = "virtualOutbound"
	VirtualInboundListener    = "virtualInbound"
	VirtualOutboundPort       = 15001
	VirtualInboundPort        = 15006
)

// ClusterName is istiod's outbound cluster name: "outbound|<port>|<subset>|<host>".
func ClusterName(port uint32, subset, host string) string {
	return translate.ClusterName(port, subset, host)
}

// InboundClusterName is istiod's cluster for traffic to the proxy's own workload on port.
func InboundClusterName(port uint32) string { return "inbound|" + itoa(port) + "||" }

func itoa(n uint32) string { return strconv.FormatUint(uint64(n), 10) }
