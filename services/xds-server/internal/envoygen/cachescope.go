package envoygen

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	security "istio.io/api/security/v1beta1"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/xds-server/internal/authz"
	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/services/xds-server/internal/translate"
)

// CacheScope names what the output of typeURL depends on for proxy at snap, so that proxies
// with equal scopes share one generation and encoding. It holds every proxy input the builder
// reads for that type:
//
//   - the proxy type and namespace (exportTo, DestinationRule lookup path), and for sidecar
//     routes its DNS domain (short host names);
//   - its values of the label keys DestinationRule workloadSelectors name;
//   - the Sidecar resource that applies (it is chosen from the namespace and labels);
//   - for listeners and routes, the proxy's values of the label keys some selector of the
//     snapshot names (VirtualService sourceLabels, and Gateway selectors for gateways), since
//     labels are read only through those selectors; for sidecar listeners also the label
//     keys AuthorizationPolicy, RequestAuthentication and PeerAuthentication selectors name;
//   - for sidecar clusters and listeners, the inbound ports the workload serves (derived from
//     its IPs and the services whose endpoints they are, or from the Sidecar's ingress), rather
//     than the IPs themselves, so every replica of a workload shares them;
//   - for clusters and endpoints, when some DestinationRule or the mesh could turn locality
//     load balancing on, the proxy's locality and its values of the labels failoverPriority
//     names (DNS clusters carry their endpoints inline);
//   - for clusters and endpoints, in a mesh with network gateways, the proxy's network and IP
//     families (split-horizon EDS);
//   - for a gateway's clusters and endpoints, whether a Gateway selecting it has an
//     AUTO_PASSTHROUGH server (SNI-DNAT clusters);
//   - for clusters, whether the proxy has only IPv6 addresses (DNS clusters' lookup family);
//   - for listeners and routes, whether the proxy uses auto-allocated addresses, and its IP
//     families (which of a host's two it gets).
//
// Endpoints are cached by the xds server per host on top of this (EndpointsVersion).
func (g *Generator) CacheScope(snap *model.Snapshot, proxy *model.Proxy, typeURL string) string {
	if snap == nil || proxy == nil {
		return ""
	}
	ix := g.index(snap)
	var b strings.Builder
	b.WriteString(string(proxy.Type))
	b.WriteByte('/')
	b.WriteString(proxy.Namespace)
	if proxy.IsSidecar() {
		sc := model.SelectSidecar(snap, proxy)
		b.WriteString("/sc=")
		if sc != nil {
			b.WriteString(sc.Namespace + "/" + sc.Name)
		}
		if typeURL == resourcev3.ClusterType || typeURL == resourcev3.ListenerType {
			b.WriteString("/in=")
			// The rules the proxy's namespace sees, as its builder resolves them.
			binds := snap.ForNamespace(proxy.Namespace, false).Bindings(viewerOf(proxy, sc))
			for _, in := range ix.inboundPorts(specOf(sc), proxy, nil) {
				b.WriteString(in.key(binds))
				b.WriteByte(';')
			}
		}
	}
	if ix.localityLB && (typeURL == resourcev3.ClusterType || typeURL == resourcev3.EndpointType) {
		b.WriteString(translate.LocalityKey(snap, proxy, ix.failoverLabelKeys))
	}
	if typeURL == resourcev3.ClusterType || typeURL == resourcev3.EndpointType {
		// Split-horizon EDS (DNS clusters carry their endpoints inline).
		b.WriteString(translate.SplitHorizonFor(snap, proxy).Key())
		if proxy.IsRouter() && hasAutoPassthrough(snap, proxy) {
			b.WriteString("/sni-dnat")
		}
	}
	if typeURL == resourcev3.ClusterType && ipv6Only(proxy.IPs) {
		b.WriteString("/v6")
	}
	if (typeURL == resourcev3.ListenerType || typeURL == resourcev3.RouteType) && g.alloc.Uses(proxy) {
		// Auto-allocated addresses, of the proxy's families, in listeners and domains.
		v4, v6 := proxy.IPFamilies()
		b.WriteString("/auto=" + strconv.FormatBool(v4) + "," + strconv.FormatBool(v6))
	}
	if (typeURL == resourcev3.ListenerType || typeURL == resourcev3.RouteType) && proxy.IsSidecar() &&
		len(proxy.IPs) > 0 && slices.ContainsFunc(ix.byIP[proxy.IPs[0]], func(e ipEndpoint) bool {
		return model.ListensPerEndpoint(e.svc.Spec)
	}) {
		// Listeners per endpoint leave out the proxy's own address.
		b.WriteString("/self=" + proxy.IPs[0])
	}
	if typeURL == resourcev3.RouteType && proxy.IsSidecar() {
		// Short host names are relative to the proxy's DNS domain.
		b.WriteString("/d=" + proxy.DNSDomain)
	}
	if typeURL == resourcev3.ListenerType || typeURL == resourcev3.RouteType {
		keys := ix.sourceLabelKeys
		if proxy.IsRouter() {
			keys = ix.routerLabelKeys
		}
		b.WriteString("/l=")
		for _, k := range keys {
			if v, ok := proxy.Labels[k]; ok {
				b.WriteString(k + "=" + v + ";")
			}
		}
	}
	if len(ix.drSelectorKeys) > 0 {
		// DestinationRule workloadSelectors choose the rule of a proxy's namespace.
		b.WriteString("/dr=")
		for _, k := range ix.drSelectorKeys {
			if v, ok := proxy.Labels[k]; ok {
				b.WriteString(k + "=" + v + ";")
			}
		}
	}
	if (typeURL == resourcev3.ListenerType || typeURL == resourcev3.RouteType) && proxy.IsRouter() {
		// Gateway servers listen on the targetPorts of the services the gateway pod is in.
		b.WriteString("/gp=")
		ports := ix.gatewayPorts(proxy)
		for _, from := range slices.Sorted(maps.Keys(ports)) {
			if to := ports[from]; to != from {
				b.WriteString(itoa(from) + ">" + itoa(to) + ";")
			}
		}
	}
	if typeURL == resourcev3.ListenerType && proxy.IsSidecar() {
		// Security policies select workloads by labels.
		b.WriteString("/a=")
		for _, k := range ix.securityLabelKeys {
			if v, ok := proxy.Labels[k]; ok {
				b.WriteString(k + "=" + v + ";")
			}
		}
	}
	return b.String()
}

// snapIndex is what CacheScope and the builders derive from one snapshot, computed once.
type snapIndex struct {
	snap *model.Snapshot
	// byIP lists, per endpoint address, the services' endpoints at it in (hostname, endpoint)
	// order: what inbound ports read.
	byIP map[string][]ipEndpoint
	// sourceLabelKeys are the label keys VirtualService sourceLabels select on; routerLabelKeys
	// add the Gateway selectors'. Sorted.
	sourceLabelKeys, routerLabelKeys []string
	// securityLabelKeys are the label keys AuthorizationPolicy, RequestAuthentication and
	// PeerAuthentication selectors name, sorted.
	securityLabelKeys []string
	// drSelectorKeys are the label keys DestinationRule workloadSelectors name, sorted.
	drSelectorKeys []string
	// localityLB is set when some DestinationRule has outlier detection or a locality setting,
	// or the mesh distributes by locality: only then may output depend on the proxy's locality.
	// failoverLabelKeys are the labels failoverPriority entries name, sorted.
	localityLB        bool
	failoverLabelKeys []string
	// peerDisables is set when some PeerAuthentication DISABLEs mTLS (for all ports or one):
	// only then must EDS resolve each endpoint's policy.
	peerDisables bool

	// identityMu guards identityOf, each service's identities (translate.ServiceIdentities),
	// computed once per snapshot: every client's mTLS clusters verify them, and they read
	// every endpoint.
	identityMu sync.Mutex
	identityOf map[*model.Service][]string
	// autoMTLS holds the auto-mTLS transport socket of each cluster ("<h2>|<name>"), which no
	// proxy input changes, so proxies of every scope share one.
	autoMTLSMu sync.Mutex
	autoMTLS   map[string]*corev3.TransportSocket
}

// autoMTLSSocket returns the auto-mTLS transport socket of cluster name (h2: advertising h2),
// built by build the first time it is asked for in this snapshot.
func (ix *snapIndex) autoMTLSSocket(name string, h2 bool, build func() *corev3.TransportSocket) *corev3.TransportSocket {
	key := strconv.FormatBool(h2) + "|" + name
	ix.autoMTLSMu.Lock()
	defer ix.autoMTLSMu.Unlock()
	ts, ok := ix.autoMTLS[key]
	if !ok {
		ts = build()
		if ix.autoMTLS == nil {
			ix.autoMTLS = map[string]*corev3.TransportSocket{}
		}
		ix.autoMTLS[key] = ts
	}
	return ts
}

// identities are the SPIFFE identities clients accept from svc's endpoints.
func (ix *snapIndex) identities(svc *model.Service) []string {
	ix.identityMu.Lock()
	defer ix.identityMu.Unlock()
	ids, ok := ix.identityOf[svc]
	if !ok {
		ids = translate.ServiceIdentities(svc, ix.snap.Mesh)
		if ix.identityOf == nil {
			ix.identityOf = map[*model.Service][]string{}
		}
		ix.identityOf[svc] = ids
	}
	return ids
}

type ipEndpoint struct {
	order int // position in hostname-then-endpoint order
	svc   *model.Service
	ep    *discoveryv1.Endpoint
}

// index returns the snapshot's index, building it once per snapshot.
func (g *Generator) index(snap *model.Snapshot) *snapIndex {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, ix := range g.indexes {
		if ix.snap == snap {
			return ix
		}
	}
	ix := newSnapIndex(snap)
	// Keep the two latest: pushes of one snapshot may still run while the next is built.
	g.indexes = append(g.indexes, ix)
	if len(g.indexes) > 2 {
		g.indexes = g.indexes[len(g.indexes)-2:]
	}
	return ix
}

func newSnapIndex(snap *model.Snapshot) *snapIndex {
	ix := &snapIndex{snap: snap, byIP: map[string][]ipEndpoint{}}
	n := 0
	for _, h := range snap.Hostnames() {
		svc := snap.Services[h]
		for _, ep := range svc.Endpoints {
			ix.byIP[ep.GetAddress()] = append(ix.byIP[ep.GetAddress()], ipEndpoint{order: n, svc: svc, ep: ep})
			n++
		}
	}
	keys := map[string]bool{}
	for _, vs := range snap.VirtualServices {
		for _, hr := range vs.Spec.GetHttp() {
			for _, m := range hr.GetMatch() {
				for k := range m.GetSourceLabels() {
					keys[k] = true
				}
			}
		}
		for _, r := range vs.Spec.GetTcp() {
			for _, m := range r.GetMatch() {
				for k := range m.GetSourceLabels() {
					keys[k] = true
				}
			}
		}
		for _, r := range vs.Spec.GetTls() {
			for _, m := range r.GetMatch() {
				for k := range m.GetSourceLabels() {
					keys[k] = true
				}
			}
		}
	}
	ix.sourceLabelKeys = translate.SortedKeys(keys)
	for _, gw := range snap.Gateways {
		for k := range gw.Spec.GetSelector() {
			keys[k] = true
		}
	}
	ix.routerLabelKeys = translate.SortedKeys(keys)
	ix.securityLabelKeys = authz.SelectorLabelKeys(snap)
	drKeys := map[string]bool{}
	for _, dr := range snap.DestinationRules {
		for k := range dr.Spec.GetWorkloadSelector().GetMatchLabels() {
			drKeys[k] = true
		}
	}
	ix.drSelectorKeys = translate.SortedKeys(drKeys)
	ix.localityLB, ix.failoverLabelKeys = translate.LocalityInputs(snap)
	ix.peerDisables = slices.ContainsFunc(snap.PeerAuthentications, func(c model.Config[*security.PeerAuthentication]) bool {
		disables := func(m *security.PeerAuthentication_MutualTLS) bool {
			return m.GetMode() == security.PeerAuthentication_MutualTLS_DISABLE
		}
		return disables(c.Spec.GetMtls()) || slices.ContainsFunc(slices.Collect(maps.Values(c.Spec.GetPortLevelMtls())), disables)
	})
	return ix
}

// indexCache holds the latest snapshots' indexes.
type indexCache struct {
	mu      sync.Mutex
	indexes []*snapIndex
}

// hasAutoPassthrough reports whether a Gateway selecting proxy has an AUTO_PASSTHROUGH server.
func hasAutoPassthrough(snap *model.Snapshot, proxy *model.Proxy) bool {
	for i := range snap.Gateways {
		gw := &snap.Gateways[i]
		if !model.LabelsMatch(gw.Spec.GetSelector(), proxy.Labels) {
			continue
		}
		for _, s := range gw.Spec.GetServers() {
			if (gatewayServer{server: s, proto: parseProtocol(s.GetPort().GetProtocol())}).autoPassthrough() && s.GetPort().GetNumber() != 0 {
				return true
			}
		}
	}
	return false
}
