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
	"google.golang.org/protobuf/proto"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
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
// reports the conflicts it resolves to problems; credentials says whether credentialName
// secrets are served (Deps.Credentials). Envoy proxies' agents get their name table (NDS) from
// ndsgen, whose auto-allocated addresses envoygen's listeners use.
func generatorFor(log *slog.Logger, problems model.Problems, credentials bool) func(*model.Proxy) xds.Generator {
	proxyless := newProxylessGenerator(log.With("component", "grpcgen"))
	alloc := model.NewAllocator()
	envoy := withNameTable{envoyGenerator{envoygen.New(log.With("component", "envoygen"), envoygen.WithProblems(problems),
		envoygen.WithCredentials(credentials), envoygen.WithAutoAddresses(alloc))}, ndsgen.New(alloc)}
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
	// viewerKeys are the labels through which the client's labels matter (model.ViewerLabelKeys).
	viewerKeys []string
}

var (
	_ xds.Generator = (*proxylessGenerator)(nil)
	_ xds.Scoper    = (*proxylessGenerator)(nil)
)

func newProxylessGenerator(log *slog.Logger) *proxylessGenerator {
	return &proxylessGenerator{log: log, memo: map[string]proxylessMemo{}}
}

// CacheScope: grpcgen reads nothing of the proxy but what its namespace can see, its DNS
// domain (the short names of routes), its values of the labels routes' sourceLabels and
// DestinationRule workloadSelectors name, for clusters whether it is in the mesh (auto mTLS)
// and for endpoints its locality when locality load balancing may apply.
func (g *proxylessGenerator) CacheScope(snap *model.Snapshot, p *model.Proxy, typeURL string) string {
	scope := "grpc/" + p.Namespace + "/d=" + p.DNSDomain + g.viewerKey(snap, p)
	switch typeURL {
	case resourcev3.ListenerType:
		return scope + serverScope(snap, p)
	case resourcev3.ClusterType:
		return scope + "/m=" + strconv.FormatBool(p.InMesh())
	}
	if typeURL != resourcev3.EndpointType {
		return scope
	}
	return scope + g.localityKey(snap, p) + translate.SplitHorizonFor(snap, p).Key()
}

// inputs returns what of the proxy snap's output may depend on, computed once per snapshot.
func (g *proxylessGenerator) inputs(snap *model.Snapshot) localityInputs {
	g.mu.Lock()
	defer g.mu.Unlock()
	in := g.locality
	if in.snap != snap {
		in.snap = snap
		in.matters, in.failoverKeys = translate.LocalityInputs(snap)
		in.viewerKeys = snap.ViewerLabelKeys()
		g.locality = in
	}
	return in
}

// viewerKey names the Sidecar that applies to p and p's values of the labels its routes and
// DestinationRules may select on.
func (g *proxylessGenerator) viewerKey(snap *model.Snapshot, p *model.Proxy) string {
	var b strings.Builder
	if sc := model.SelectSidecar(snap, p); sc != nil {
		b.WriteString("/sc=" + sc.Namespace + "/" + sc.Name)
	}
	keys := g.inputs(snap).viewerKeys
	if len(keys) == 0 {
		return b.String()
	}
	b.WriteString("/l=")
	for _, k := range keys {
		if v, ok := p.Labels[k]; ok {
			b.WriteString(k + "=" + v + ";")
		}
	}
	return b.String()
}

// viewerOf is whom grpcgen resolves config for: like istiod, which gives proxyless clients
// ("sidecar~" nodes) a SidecarScope, the Sidecar resource that selects p applies.
func viewerOf(snap *model.Snapshot, p *model.Proxy) *model.Viewer {
	return &model.Viewer{Namespace: p.Namespace, Labels: p.Labels, Sidecar: model.SelectSidecar(snap, p)}
}

// localityKey is translate.LocalityKey when locality load balancing may apply in snap, else "".
func (g *proxylessGenerator) localityKey(snap *model.Snapshot, p *model.Proxy) string {
	in := g.inputs(snap)
	if !in.matters {
		return ""
	}
	return translate.LocalityKey(snap, p, in.failoverKeys)
}

// client is what grpcgen reads of p: nothing when locality load balancing cannot apply.
func (g *proxylessGenerator) client(snap *model.Snapshot, p *model.Proxy) (*grpcgen.Client, string) {
	key := g.localityKey(snap, p)
	sh := translate.SplitHorizonFor(snap, p)
	if key == "" && sh == nil {
		return nil, ""
	}
	c := &grpcgen.Client{SplitHorizon: sh}
	if key != "" {
		c.Locality = p.Locality(snap.ProxyEndpoint(p))
		c.Labels = translate.TopologyLabels(p.Labels, c.Locality, p.ClusterID, p.Network)
	}
	return c, key + sh.Key()
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
		v := viewerOf(snap, p)
		res = grpcgen.Generate(visible(snap, v, hosts), p.DNSDomain, v, client, p.InMesh(), g.log)
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
	key = p.Namespace + "/d=" + p.DNSDomain + g.viewerKey(snap, p) + "/m=" + strconv.FormatBool(p.InMesh()) + key
	g.mu.Lock()
	defer g.mu.Unlock()
	if m, ok := g.memo[key]; ok && m.snap == snap {
		return m.res
	}
	v := viewerOf(snap, p)
	res := grpcgen.Generate(visible(snap, v, nil), p.DNSDomain, v, client, p.InMesh(), g.log)
	g.memo[key] = proxylessMemo{snap: snap, res: res}
	return res
}

// visible is snap restricted to the services v can see (exportTo, and its Sidecar's egress
// hosts, which may also leave out ports) and to hosts, if given, with the one v's namespace
// sees of a hostname several namespaces publish; snap itself when nothing changes.
func visible(snap *model.Snapshot, v *model.Viewer, hosts map[string]bool) *model.Snapshot {
	// A hostname several namespaces publish resolves to the one v's namespace sees.
	snap = snap.ForNamespace(v.Namespace, false)
	// scoped is svc as v sees it: nil when not at all, a copy when some ports are left out.
	scoped := func(h string, svc *model.Service) *model.Service {
		if (hosts != nil && !hosts[h]) || !snap.ServiceVisible(svc, v.Namespace) {
			return nil
		}
		if v.Sidecar == nil || len(v.Sidecar.Spec.GetEgress()) == 0 {
			return svc
		}
		var ports []*discoveryv1.Port
		for _, port := range svc.Spec.GetPorts() {
			if model.SidecarImportsPort(v.Sidecar.Spec, v.Sidecar.Namespace, svc.Spec.GetNamespace(), h, port.GetNumber()) {
				ports = append(ports, port)
			}
		}
		switch len(ports) {
		case 0:
			return nil
		case len(svc.Spec.GetPorts()):
			return svc
		}
		spec := proto.Clone(svc.Spec).(*discoveryv1.Service)
		spec.Ports = ports
		cp := *svc
		cp.Spec = spec
		return &cp
	}
	all := true
	for h, svc := range snap.Services {
		if scoped(h, svc) != svc {
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
		if s := scoped(h, svc); s != nil {
			out.Services[h] = s
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
