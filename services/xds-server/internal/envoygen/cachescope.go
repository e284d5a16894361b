package envoygen

import (
	"cmp"
	"slices"
	"strings"
	"sync"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	networking "istio.io/api/networking/v1alpha3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/services/xds-server/internal/translate"
)

// CacheScope names what the output of typeURL depends on for proxy at snap, so that proxies
// with equal scopes share one generation and encoding. It holds every proxy input the builder
// reads for that type:
//
//   - the proxy type and namespace (exportTo, DestinationRule precedence, short host names);
//   - the Sidecar resource that applies (it is chosen from the namespace and labels);
//   - for listeners and routes, the proxy's values of the label keys some selector of the
//     snapshot names (VirtualService sourceLabels, and Gateway selectors for gateways), since
//     labels are read only through those selectors;
//   - for sidecar clusters and listeners, the inbound ports the workload serves (derived from
//     its IPs and the services whose endpoints they are, or from the Sidecar's ingress), rather
//     than the IPs themselves, so every replica of a workload shares them.
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
			for _, in := range ix.inboundPorts(specOf(sc), proxy, nil) {
				b.WriteString(in.key())
				b.WriteByte(';')
			}
		}
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
	return ix
}

// inboundPorts lists the workload's ports: from the Sidecar's ingress listeners when it has
// some, else from the services that have one of the proxy's IPs among their endpoints.
func (ix *snapIndex) inboundPorts(sc *networking.Sidecar, proxy *model.Proxy, log interface{ Debug(string, ...any) }) []inboundPort {
	var out []inboundPort
	seen := map[uint32]bool{}
	if ing := sc.GetIngress(); len(ing) > 0 {
		for _, l := range ing {
			p := l.GetPort()
			if p.GetNumber() == 0 || seen[p.GetNumber()] {
				continue
			}
			addr := translate.SocketAddress("127.0.0.1", p.GetNumber())
			if de := l.GetDefaultEndpoint(); de != "" {
				a, ok := parseDefaultEndpoint(de)
				if !ok {
					if log != nil {
						log.Debug("skipping Sidecar ingress with unusable defaultEndpoint", "defaultEndpoint", de)
					}
					continue
				}
				addr = a
			}
			seen[p.GetNumber()] = true
			out = append(out, inboundPort{port: p.GetNumber(), proto: parseProtocol(p.GetProtocol(), p.GetName()), endpoint: addr})
		}
		return out
	}
	var eps []ipEndpoint
	for _, ip := range proxy.IPs {
		eps = append(eps, ix.byIP[ip]...)
	}
	if len(proxy.IPs) > 1 {
		slices.SortFunc(eps, func(a, b ipEndpoint) int { return cmp.Compare(a.order, b.order) })
		eps = slices.CompactFunc(eps, func(a, b ipEndpoint) bool { return a.order == b.order })
	}
	for _, e := range eps {
		for _, p := range e.svc.Spec.GetPorts() {
			target := translate.EndpointPort(e.ep, p)
			if target == 0 || seen[target] {
				continue
			}
			seen[target] = true
			out = append(out, inboundPort{port: target, proto: portProtocol(p), endpoint: translate.SocketAddress("127.0.0.1", target)})
		}
	}
	slices.SortFunc(out, func(a, b inboundPort) int { return cmp.Compare(a.port, b.port) })
	return out
}

// key spells an inbound port with everything generation reads of it.
func (in inboundPort) key() string {
	a := in.endpoint
	addr := a.GetPipe().GetPath()
	if sa := a.GetSocketAddress(); sa != nil {
		addr = sa.GetAddress() + ":" + itoa(sa.GetPortValue())
	}
	return itoa(in.port) + "," + itoa(uint32(in.proto)) + "," + addr
}

// indexCache holds the latest snapshots' indexes.
type indexCache struct {
	mu      sync.Mutex
	indexes []*snapIndex
}
