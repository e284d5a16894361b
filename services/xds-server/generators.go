package xdsserver

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"sailplane.dev/services/xds-server/internal/envoygen"
	"sailplane.dev/services/xds-server/internal/grpcgen"
	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/services/xds-server/internal/xds"
)

// generatorFor serves proxyless gRPC clients from grpcgen and Envoy from envoygen.
func generatorFor(log *slog.Logger) func(*model.Proxy) xds.Generator {
	proxyless := newProxylessGenerator(log.With("component", "grpcgen"))
	envoy := envoyGenerator{envoygen.New(log.With("component", "envoygen"))}
	return func(p *model.Proxy) xds.Generator {
		if p.IsProxyless() {
			return proxyless
		}
		return envoy
	}
}

// envoyGenerator maps envoygen's "unsupported" onto the xds server's.
type envoyGenerator struct{ g *envoygen.Generator }

var (
	_ xds.Generator = envoyGenerator{}
	_ xds.Scoper    = envoyGenerator{}
)

// CacheScope lets proxies with the same inputs share generation (see envoygen.CacheScope).
func (e envoyGenerator) CacheScope(snap *model.Snapshot, p *model.Proxy, typeURL string) string {
	return "envoy/" + e.g.CacheScope(snap, p, typeURL)
}

func (e envoyGenerator) Generate(snap *model.Snapshot, p *model.Proxy, typeURL string, names []string) ([]types.Resource, error) {
	res, err := e.g.Generate(snap, p, typeURL, names)
	if errors.Is(err, envoygen.ErrUnsupported) {
		return nil, fmt.Errorf("%w: %w", xds.ErrUnsupported, err)
	}
	return res, err
}

// proxylessGenerator adapts grpcgen, which translates a whole snapshot at once, to the per-type
// Generator: the services a proxy's namespace cannot see (exportTo) are left out, and one
// translation per snapshot and namespace serves every type.
type proxylessGenerator struct {
	log  *slog.Logger
	mu   sync.Mutex
	memo map[string]proxylessMemo // namespace -> last translation
}

type proxylessMemo struct {
	snap *model.Snapshot
	res  *grpcgen.Resources
}

var (
	_ xds.Generator = (*proxylessGenerator)(nil)
	_ xds.Scoper    = (*proxylessGenerator)(nil)
)

func newProxylessGenerator(log *slog.Logger) *proxylessGenerator {
	return &proxylessGenerator{log: log, memo: map[string]proxylessMemo{}}
}

// CacheScope: grpcgen reads nothing of the proxy but what its namespace can see.
func (g *proxylessGenerator) CacheScope(_ *model.Snapshot, p *model.Proxy, _ string) string {
	return "grpc/" + p.Namespace
}

func (g *proxylessGenerator) Generate(snap *model.Snapshot, p *model.Proxy, typeURL string, names []string) ([]types.Resource, error) {
	var res *grpcgen.Resources
	if typeURL == resourcev3.EndpointType && len(names) > 0 {
		// Endpoint updates name few clusters: translate only their services.
		hosts := map[string]bool{}
		for _, n := range names {
			hosts[hostOf(n)] = true
		}
		res = grpcgen.Generate(visible(snap, p.Namespace, hosts), g.log)
	} else {
		res = g.translate(snap, p.Namespace)
	}
	var out []types.Resource
	switch typeURL {
	case resourcev3.ListenerType:
		out = asResources(res.Listeners)
	case resourcev3.RouteType:
		out = asResources(res.Routes)
	case resourcev3.ClusterType:
		out = asResources(res.Clusters)
	case resourcev3.EndpointType:
		out = asResources(res.Endpoints)
	default:
		return nil, fmt.Errorf("%w: %s for proxyless clients", xds.ErrUnsupported, typeURL)
	}
	if len(names) == 0 {
		return out, nil
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	kept := out[:0:0]
	for _, r := range out {
		if want[cachev3.GetResourceName(r)] {
			kept = append(kept, r)
		}
	}
	return kept, nil
}

func (g *proxylessGenerator) translate(snap *model.Snapshot, ns string) *grpcgen.Resources {
	g.mu.Lock()
	defer g.mu.Unlock()
	if m, ok := g.memo[ns]; ok && m.snap == snap {
		return m.res
	}
	res := grpcgen.Generate(visible(snap, ns, nil), g.log)
	g.memo[ns] = proxylessMemo{snap: snap, res: res}
	return res
}

// visible is snap restricted to the services namespace ns can see (and to hosts, if given);
// snap itself when nothing is left out.
func visible(snap *model.Snapshot, ns string, hosts map[string]bool) *model.Snapshot {
	keep := func(h string, svc *model.Service) bool {
		return (hosts == nil || hosts[h]) &&
			model.ExportVisibility(svc.Spec.GetNamespace(), svc.Spec.GetExportTo()).Sees(ns)
	}
	all := true
	for h, svc := range snap.Services {
		if !keep(h, svc) {
			all = false
			break
		}
	}
	if all {
		return snap
	}
	out := *snap
	out.Services = map[string]*model.Service{}
	for h, svc := range snap.Services {
		if keep(h, svc) {
			out.Services[h] = svc
		}
	}
	return &out
}

// hostOf reads the hostname out of "outbound|port|subset|host".
func hostOf(cluster string) string {
	for i := len(cluster) - 1; i >= 0; i-- {
		if cluster[i] == '|' {
			return cluster[i+1:]
		}
	}
	return cluster
}

func asResources[T types.Resource](in []T) []types.Resource {
	out := make([]types.Resource, len(in))
	for i, r := range in {
		out[i] = r
	}
	return out
}
