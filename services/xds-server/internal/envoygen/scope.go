package envoygen

import (
	"log/slog"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/xds-server/internal/authn"
	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/services/xds-server/internal/translate"
)

// builder holds one proxy's view of a snapshot while its resources are generated.
type builder struct {
	snap  *model.Snapshot
	proxy *model.Proxy
	ix    *snapIndex
	log   *slog.Logger
	// problems, when set, receives the conflicts generation resolves (see report).
	problems model.Problems
	// credentials: credentialName secrets are served (WithCredentials).
	credentials bool

	// auto are the auto-allocated addresses of ServiceEntry hosts without any, by
	// model.AutoAddressKey, when the proxy uses them (its DNS is captured); nil otherwise.
	auto map[string]model.AutoAddresses

	// sidecar is the Sidecar resource that applies to the proxy, nil if none does.
	sidecar *model.Config[*networking.Sidecar]
	// allowAny is the outbound traffic policy: pass unknown destinations through, or drop them.
	allowAny bool
	// services the proxy can reach, sorted by hostname.
	services []*model.Service

	// binds resolves VirtualServices and DestinationRules with the proxy's exportTo view.
	binds *model.Bindings
	// locality is where the proxy runs, and topologyLabels its labels with the topology ones
	// added: what locality load balancing reads of it.
	locality       *discoveryv1.Locality
	topologyLabels map[string]string
	// splitHorizon replaces endpoints of other networks by their gateways; nil in a mesh of
	// one network.
	splitHorizon *translate.SplitHorizon
	// nsModes caches the PeerAuthentication mode of destination namespaces (see autoMTLS).
	nsModes map[string]authn.Mode
	// mtlsSockets are the inbound mTLS transport sockets for TCP and HTTP chains, built once.
	mtlsSockets [2]*corev3.TransportSocket
}

func newBuilder(snap *model.Snapshot, proxy *model.Proxy, ix *snapIndex, log *slog.Logger) *builder {
	// A hostname several namespaces publish resolves to the one the proxy's namespace sees.
	snap = snap.ForNamespace(proxy.Namespace, proxy.IsRouter())
	b := &builder{snap: snap, proxy: proxy, ix: ix, log: log, allowAny: true}
	b.locality = proxy.Locality(snap.ProxyEndpoint(proxy))
	b.topologyLabels = translate.TopologyLabels(proxy.Labels, b.locality, proxy.ClusterID, proxy.Network)
	b.splitHorizon = translate.SplitHorizonFor(snap, proxy)
	if p := snap.Mesh.GetOutboundTrafficPolicy(); p != nil {
		b.allowAny = p.GetMode() == meshv1alpha1.MeshConfig_OutboundTrafficPolicy_ALLOW_ANY
	}
	if proxy.IsSidecar() {
		b.sidecar = model.SelectSidecar(snap, proxy)
	}
	if b.sidecar != nil {
		sc := b.sidecar.Spec
		if p := sc.GetOutboundTrafficPolicy(); p != nil {
			b.allowAny = p.GetMode() == networking.OutboundTrafficPolicy_ALLOW_ANY
		}
		for _, e := range sc.GetEgress() {
			for _, h := range e.GetHosts() {
				if _, _, ok := model.ParseEgressHost(h, b.sidecar.Namespace); !ok {
					b.log.Debug("skipping Sidecar egress host without namespace", "host", h)
				}
			}
		}
	}
	b.binds = snap.Bindings(viewerOf(proxy, b.sidecar))
	for _, h := range snap.Hostnames() {
		svc := snap.Services[h]
		if b.serviceVisible(svc) {
			b.services = append(b.services, svc)
		}
	}
	return b
}

// report tells the push status of a problem found in the proxy's configuration.
func (b *builder) report(metric, key, message string) {
	if b.problems != nil {
		b.problems.Report(b.snap, model.Problem{Metric: metric, Key: key, Proxy: b.proxy.ID, Message: message})
	}
}

func (b *builder) rootNamespace() string { return b.snap.RootNamespace() }

// viewerOf is whom a proxy's VirtualServices and DestinationRules are resolved for.
func viewerOf(p *model.Proxy, sc *model.Config[*networking.Sidecar]) *model.Viewer {
	return &model.Viewer{Namespace: p.Namespace, Labels: p.Labels, Sidecar: sc}
}

func (b *builder) serviceVisible(svc *model.Service) bool {
	if !b.snap.ServiceVisible(svc, b.proxy.Namespace) {
		return false
	}
	if len(specOf(b.sidecar).GetEgress()) == 0 {
		return true
	}
	for _, p := range svc.Spec.GetPorts() {
		if b.portVisible(svc, p) {
			return true
		}
	}
	return false
}

// portVisible applies the Sidecar egress scoping to one service port.
func (b *builder) portVisible(svc *model.Service, port *discoveryv1.Port) bool {
	if b.sidecar == nil {
		return true
	}
	return model.SidecarImportsPort(b.sidecar.Spec, b.sidecar.Namespace, svc.Spec.GetNamespace(), svc.Spec.GetHostname(), port.GetNumber())
}

// visiblePorts returns a service's ports the proxy may use, without duplicate numbers.
func (b *builder) visiblePorts(svc *model.Service) []*discoveryv1.Port {
	var out []*discoveryv1.Port
	seen := map[uint32]bool{}
	for _, p := range svc.Spec.GetPorts() {
		// As istiod, no UDP port gets an outbound listener or cluster: Envoy proxies TCP here.
		if p.GetNumber() == 0 || seen[p.GetNumber()] || strings.EqualFold(p.GetProtocol(), "UDP") || !b.portVisible(svc, p) {
			continue
		}
		seen[p.GetNumber()] = true
		out = append(out, p)
	}
	return out
}

// autoAddresses are svc's auto-allocated addresses of the proxy's IP families, IPv4 first, if
// it has any and the proxy uses them.
func (b *builder) autoAddresses(svc *model.Service) []string {
	if b.auto == nil || !model.AutoAllocatable(svc.Spec) {
		return nil
	}
	a, ok := b.auto[model.AutoAddressKey(svc.Spec)]
	if !ok {
		return nil
	}
	return a.For(b.proxy.IPFamilies())
}
