package xdsserver

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"sailplane.dev/services/xds-server/internal/authz"
	"sailplane.dev/services/xds-server/internal/envoygen"
	"sailplane.dev/services/xds-server/internal/grpcgen"
	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/services/xds-server/internal/ndsgen"
	"sailplane.dev/services/xds-server/internal/translate"
	"sailplane.dev/services/xds-server/internal/xds"
	"sailplane.dev/shared/xdstype"
)

// generatorFor serves proxyless gRPC clients from grpcgen and Envoy from envoygen, which
// reports the conflicts it resolves to problems; Envoy proxies' agents get their name table
// (NDS) from ndsgen.
func generatorFor(log *slog.Logger, problems model.Problems) func(*model.Proxy) xds.Generator {
	proxyless := newProxylessGenerator(log.With("component", "grpcgen"))
	envoy := withNameTable{envoyGenerator{envoygen.New(log.With("component", "envoygen"), envoygen.WithProblems(problems))}, ndsgen.New()}
	return func(p *model.Proxy) xds.Generator {
		if p.IsProxyless() {
			return proxyless
		}
		return envoy
	}
}

// withNameTable answers the name table type from ndsgen, everything else from next.
type withNameTable struct {
	next interface {
		xds.Generator
		xds.Scoper
	}
	nds *ndsgen.Generator
}

var (
	_ xds.Generator = withNameTable{}
	_ xds.Scoper    = withNameTable{}
)

func (w withNameTable) CacheScope(snap *model.Snapshot, p *model.Proxy, typeURL string) string {
	if typeURL == xdstype.NameTable {
		return w.nds.CacheScope(snap, p)
	}
	return w.next.CacheScope(snap, p, typeURL)
}

// Generate: the name table is one resource without a name, as istiod sends it.
func (w withNameTable) Generate(snap *model.Snapshot, p *model.Proxy, typeURL string, names []string) ([]types.Resource, error) {
	if typeURL == xdstype.NameTable {
		return []types.Resource{w.nds.Table(snap, p)}, nil
	}
	return w.next.Generate(snap, p, typeURL, names)
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
	memo map[string]proxylessMemo // namespace and locality key -> last translation
	// locality is what locality load balancing reads in the latest snapshot.
	locality localityInputs
}

type proxylessMemo struct {
	snap *model.Snapshot
	res  *grpcgen.Resources
}

type localityInputs struct {
	snap         *model.Snapshot
	matters      bool
	failoverKeys []string
}

var (
	_ xds.Generator = (*proxylessGenerator)(nil)
	_ xds.Scoper    = (*proxylessGenerator)(nil)
)

func newProxylessGenerator(log *slog.Logger) *proxylessGenerator {
	return &proxylessGenerator{log: log, memo: map[string]proxylessMemo{}}
}

// CacheScope: grpcgen reads nothing of the proxy but what its namespace can see, its DNS
// domain (the short names of routes), for clusters whether it is in the mesh (auto mTLS) and
// for endpoints its locality when locality load balancing may apply.
func (g *proxylessGenerator) CacheScope(snap *model.Snapshot, p *model.Proxy, typeURL string) string {
	scope := "grpc/" + p.Namespace + "/d=" + p.DNSDomain
	switch typeURL {
	case resourcev3.ListenerType:
		return scope + serverScope(snap, p)
	case resourcev3.ClusterType:
		return scope + "/m=" + strconv.FormatBool(p.InMesh())
	}
	if typeURL != resourcev3.EndpointType {
		return scope
	}
	return scope + g.localityKey(snap, p)
}

// localityKey is translate.LocalityKey when locality load balancing may apply in snap, else "".
func (g *proxylessGenerator) localityKey(snap *model.Snapshot, p *model.Proxy) string {
	g.mu.Lock()
	in := g.locality
	if in.snap != snap {
		in.snap = snap
		in.matters, in.failoverKeys = translate.LocalityInputs(snap)
		g.locality = in
	}
	g.mu.Unlock()
	if !in.matters {
		return ""
	}
	return translate.LocalityKey(snap, p, in.failoverKeys)
}

// client is what grpcgen reads of p: nothing when locality load balancing cannot apply.
func (g *proxylessGenerator) client(snap *model.Snapshot, p *model.Proxy) (*grpcgen.Client, string) {
	key := g.localityKey(snap, p)
	if key == "" {
		return nil, ""
	}
	loc := p.Locality(snap.ProxyEndpoint(p))
	return &grpcgen.Client{Locality: loc, Labels: translate.TopologyLabels(p.Labels, loc, p.ClusterID, p.Network)}, key
}

func (g *proxylessGenerator) Generate(snap *model.Snapshot, p *model.Proxy, typeURL string, names []string) ([]types.Resource, error) {
	var res *grpcgen.Resources
	if typeURL == resourcev3.EndpointType && len(names) > 0 {
		// Endpoint updates name few clusters: translate only their services.
		hosts := map[string]bool{}
		for _, n := range names {
			hosts[hostOf(n)] = true
		}
		client, _ := g.client(snap, p)
		res = grpcgen.Generate(visible(snap, p.Namespace, hosts), p.DNSDomain, client, p.InMesh(), g.log)
	} else {
		res = g.translate(snap, p)
	}
	var out []types.Resource
	switch typeURL {
	case resourcev3.ListenerType:
		// Client listeners are shared by the namespace; server listeners are the proxy's own.
		lis := append(slices.Clone(res.Listeners), grpcgen.ServerListeners(snap, serverOf(p))...)
		slices.SortFunc(lis, func(a, b *listenerv3.Listener) int { return strings.Compare(a.GetName(), b.GetName()) })
		out = asResources(lis)
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

func (g *proxylessGenerator) translate(snap *model.Snapshot, p *model.Proxy) *grpcgen.Resources {
	client, key := g.client(snap, p)
	key = p.Namespace + "/d=" + p.DNSDomain + "/m=" + strconv.FormatBool(p.InMesh()) + key
	g.mu.Lock()
	defer g.mu.Unlock()
	if m, ok := g.memo[key]; ok && m.snap == snap {
		return m.res
	}
	res := grpcgen.Generate(visible(snap, p.Namespace, nil), p.DNSDomain, client, p.InMesh(), g.log)
	g.memo[key] = proxylessMemo{snap: snap, res: res}
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

// serverOf is what server listeners read of p.
func serverOf(p *model.Proxy) grpcgen.Server {
	return grpcgen.Server{Namespace: p.Namespace, Labels: p.Labels, IPs: p.IPs}
}

// serverScope names what p's server listeners depend on: the ports it serves, at its IPs,
// its values of the labels security policies select on, and whether it is labelled in the
// mesh (PERMISSIVE ports then take mTLS). Empty when it serves nothing.
func serverScope(snap *model.Snapshot, p *model.Proxy) string {
	ports := grpcgen.ServerPorts(snap, serverOf(p))
	if len(ports) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("/srv=" + strings.Join(p.IPs, ",") + "/")
	for _, port := range ports {
		b.WriteString(strconv.FormatUint(uint64(port), 10) + ",")
	}
	b.WriteString("/m=" + strconv.FormatBool(p.InMesh()) + "/a=")
	for _, k := range authz.SelectorLabelKeys(snap) {
		if v, ok := p.Labels[k]; ok {
			b.WriteString(k + "=" + v + ";")
		}
	}
	return b.String()
}
