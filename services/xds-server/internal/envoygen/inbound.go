package envoygen

import (
	"cmp"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/services/xds-server/internal/translate"
)

// inboundPassthroughBind is the source address of connections the proxy makes to its own
// workload's pod IP; iptables leaves traffic from it alone, so it does not loop back.
const inboundPassthroughBind = "127.0.0.6"

// noCleanup is the longest interval Envoy accepts, as istiod sets it on inbound ORIGINAL_DST
// clusters: the workload's hosts never go stale.
var noCleanup = durationpb.New(time.Duration(math.MaxInt64/int64(time.Second)-1) * time.Second)

// inboundPort is a port the proxy's own workload serves, reached through virtualInbound.
type inboundPort struct {
	port  uint32 // the workload's port, which captured traffic is addressed to
	proto protocol
	mongo bool // declared MONGO: mongo_proxy before tcp_proxy (see mongoProxy)
	grpc  bool // declared GRPC or GRPC-WEB: no inbound retries (see inboundHCM)
	// endpoint is where the workload is reached; nil for the connection's original
	// destination (the pod IP and port), istiod's default inbound passthrough.
	endpoint *corev3.Address
	// host and servicePort name the service this port serves, whose DestinationRule's
	// connection pool (port-level settings by servicePort) also limits the inbound side.
	host        string
	servicePort uint32
}

// inboundPorts lists the workload's ports (see snapIndex.inboundPorts).
func (b *builder) inboundPorts() []inboundPort {
	return b.ix.inboundPorts(specOf(b.sidecar), b.proxy, b)
}

// inboundPorts lists the workload's ports: from the Sidecar's ingress listeners when it has
// some, else from the services that have one of the proxy's IPs among their endpoints. b, when
// not nil, logs what is skipped and reports conflicts.
func (ix *snapIndex) inboundPorts(sc *networking.Sidecar, proxy *model.Proxy, b *builder) []inboundPort {
	var eps []ipEndpoint
	for _, ip := range proxy.IPs {
		eps = append(eps, ix.byIP[ip]...)
	}
	if len(proxy.IPs) > 1 {
		slices.SortFunc(eps, func(a, b ipEndpoint) int { return cmp.Compare(a.order, b.order) })
		eps = slices.CompactFunc(eps, func(a, b ipEndpoint) bool { return a.order == b.order })
	}
	// Inbound traffic goes to the pod IP it was sent to (istiod's PASSTHROUGH default), or to
	// localhost for apps that bind only there.
	localhost := ix.snap.Mesh.GetInboundTrafficPolicy().GetMode() == meshv1alpha1.MeshConfig_InboundTrafficPolicy_LOCALHOST
	var fromServices []inboundPort
	taken := map[uint32]inboundPort{}
	for _, e := range eps {
		for _, p := range e.svc.Spec.GetPorts() {
			target := translate.EndpointPort(e.ep, p)
			if target == 0 {
				continue
			}
			in := inboundPort{port: target, proto: portProtocol(p), mongo: isMongo(p.GetProtocol()),
				grpc: isGRPC(p.GetProtocol()), host: e.svc.Spec.GetHostname(), servicePort: p.GetNumber()}
			if first, ok := taken[target]; ok {
				// The first service keeps the port. Services of one protocol share it well
				// enough; of different ones, the second's clients get the wrong handling.
				if b != nil && first.proto != in.proto && first.host != in.host {
					b.report(model.MetricInboundConflict, proxy.ID, fmt.Sprintf("Conflicting inbound listener:%d. existing: %s, incoming: %s",
						target, first.host, in.host))
				}
				continue
			}
			taken[target] = in
			if localhost {
				in.endpoint = translate.SocketAddress("127.0.0.1", target)
			}
			fromServices = append(fromServices, in)
		}
	}
	slices.SortFunc(fromServices, func(a, b inboundPort) int { return cmp.Compare(a.port, b.port) })
	ing := sc.GetIngress()
	if len(ing) == 0 {
		return fromServices
	}
	var out []inboundPort
	seen := map[uint32]bool{}
	for _, l := range ing {
		p := l.GetPort()
		if p.GetNumber() == 0 || seen[p.GetNumber()] {
			continue
		}
		var addr *corev3.Address
		if de := l.GetDefaultEndpoint(); de != "" {
			a, ok := parseDefaultEndpoint(de, proxy.IPs)
			if !ok {
				if b != nil {
					b.log.Debug("skipping Sidecar ingress with unusable defaultEndpoint", "defaultEndpoint", de)
				}
				continue
			}
			addr = a
		}
		seen[p.GetNumber()] = true
		in := inboundPort{port: p.GetNumber(), proto: parseProtocol(p.GetProtocol()), mongo: isMongo(p.GetProtocol()),
			grpc: isGRPC(p.GetProtocol()), endpoint: addr,
			servicePort: p.GetNumber()}
		// The service is the one whose workload port is the listener's, as in istiod.
		if i := slices.IndexFunc(fromServices, func(s inboundPort) bool { return s.port == p.GetNumber() }); i >= 0 {
			in.host = fromServices[i].host
		}
		out = append(out, in)
	}
	return out
}

// key spells an inbound port with everything generation reads of it. The service is read
// only through its DestinationRule (see inboundConnectionPool), so the key names that rule
// rather than the host: workloads of different services on the same ports share a scope.
func (in inboundPort) key(binds *model.Bindings) string {
	addr := "orig"
	if a := in.endpoint; a != nil {
		addr = a.GetPipe().GetPath()
		if sa := a.GetSocketAddress(); sa != nil {
			addr = sa.GetAddress() + ":" + itoa(sa.GetPortValue())
		}
	}
	k := itoa(in.port) + "," + itoa(uint32(in.proto)) + "," + addr
	if in.mongo {
		k += ",mongo"
	}
	if in.grpc {
		k += ",grpc"
	}
	if dr := in.destinationRule(binds); dr != nil {
		k += ",dr=" + dr.Namespace + "/" + dr.Name + "," + itoa(in.servicePort)
	}
	return k
}

// destinationRule is the rule of the service the port serves, nil if none applies.
func (in inboundPort) destinationRule(binds *model.Bindings) *model.Config[*networking.DestinationRule] {
	if in.host == "" {
		return nil
	}
	return binds.InboundDestinationRule(in.host)
}

// parseDefaultEndpoint reads a Sidecar ingress defaultEndpoint as istiod does:
// "127.0.0.1:8080" or "[::1]:8080" (localhost), "0.0.0.0:8080" or "[::]:8080" (the workload's
// own IPv4 or IPv6 address, localhost if it has none), or "unix:///path".
func parseDefaultEndpoint(s string, proxyIPs []string) (*corev3.Address, bool) {
	if path, ok := strings.CutPrefix(s, "unix://"); ok && path != "" {
		return &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: path}}}, true
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil || ap.Port() == 0 {
		return nil, false
	}
	addr := ap.Addr()
	if addr.IsUnspecified() {
		own := netip.IPv6Loopback()
		if addr.Is4() {
			own = netip.AddrFrom4([4]byte{127, 0, 0, 1})
		}
		for _, ipStr := range proxyIPs {
			if ip, err := netip.ParseAddr(ipStr); err == nil && ip.Is4() == addr.Is4() {
				own = ip
				break
			}
		}
		addr = own
	}
	return translate.SocketAddress(addr.String(), uint32(ap.Port())), true
}

// inboundCluster is "inbound|<port>||": the workload's port, at the connection's original
// destination unless a localhost or Sidecar endpoint is set, with the connection pool of the
// service's DestinationRule (port-level settings replacing the rule's) overridden by the
// Sidecar's, so the server side admits what its clients are allowed to send.
func (b *builder) inboundCluster(in inboundPort) *clusterv3.Cluster {
	name := InboundClusterName(in.port)
	c := &clusterv3.Cluster{
		Name:            name,
		ConnectTimeout:  b.connectTimeout(),
		CircuitBreakers: &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{defaultThresholds()}},
		CommonLbConfig:  &clusterv3.Cluster_CommonLbConfig{},
	}
	if in.endpoint == nil {
		c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST}
		c.LbPolicy = clusterv3.Cluster_CLUSTER_PROVIDED
		c.CleanupInterval = noCleanup
	} else {
		c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC}
		c.LoadAssignment = &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{
			LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{
				Endpoint: &endpointv3.Endpoint{Address: in.endpoint}}}},
		}}}
	}
	if ip := in.endpoint.GetSocketAddress().GetAddress(); in.endpoint == nil || (ip != "" && ip != "127.0.0.1" && ip != "::1") {
		c.UpstreamBindConfig = &corev3.BindConfig{SourceAddress: translate.SocketAddress(inboundPassthroughBind, 0).GetSocketAddress()}
	}
	pool := applyConnectionPool(c, b.inboundConnectionPool(in))
	if opts := pool.options(in.proto == protoHTTP2, in.proto == protoSniffed); opts != nil {
		c.TypedExtensionProtocolOptions = map[string]*anyMsg{httpProtocolOptionsKey: mustAny(opts)}
	}
	return c
}

// inboundConnectionPool: the Sidecar's ingress listener pool for the port, else its
// inboundConnectionPool, else the service's DestinationRule's, else the mesh default.
func (b *builder) inboundConnectionPool(in inboundPort) *networking.ConnectionPoolSettings {
	sc := specOf(b.sidecar)
	for _, l := range sc.GetIngress() {
		if l.GetPort().GetNumber() == in.port && l.GetConnectionPool() != nil {
			return l.GetConnectionPool()
		}
	}
	if cp := sc.GetInboundConnectionPool(); cp != nil {
		return cp
	}
	if dr := in.destinationRule(b.binds); dr != nil {
		tp := dr.Spec.GetTrafficPolicy()
		for _, pls := range tp.GetPortLevelSettings() {
			if pls.GetPort().GetNumber() == in.servicePort {
				return cmp.Or(pls.GetConnectionPool(), b.snap.Mesh.GetDefaultTrafficPolicy().GetConnectionPool())
			}
		}
		if cp := tp.GetConnectionPool(); cp != nil {
			return cp
		}
	}
	return b.snap.Mesh.GetDefaultTrafficPolicy().GetConnectionPool()
}

// passthroughCluster sends to the connection's original destination, keeping the client's
// HTTP version (h2 and gRPC stay h2) when an HTTP manager forwards to it, as istiod does.
func (b *builder) passthroughCluster() *clusterv3.Cluster {
	c := &clusterv3.Cluster{
		Name:                 PassthroughCluster,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST},
		ConnectTimeout:       b.connectTimeout(),
		LbPolicy:             clusterv3.Cluster_CLUSTER_PROVIDED,
		CircuitBreakers:      &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{defaultThresholds()}},
		TypedExtensionProtocolOptions: downstreamProtocolOptions(
			&corev3.HttpProtocolOptions{IdleTimeout: durationpb.New(5 * time.Minute)}),
	}
	// The mesh-wide default pool caps passthrough egress too, as in istiod.
	applyConnectionPool(c, b.snap.Mesh.GetDefaultTrafficPolicy().GetConnectionPool())
	return c
}

// inboundPassthroughCluster forwards inbound traffic to ports no service declares.
func (b *builder) inboundPassthroughCluster() *clusterv3.Cluster {
	c := b.passthroughCluster()
	c.Name = InboundPassthroughCluster
	c.UpstreamBindConfig = &corev3.BindConfig{SourceAddress: translate.SocketAddress(inboundPassthroughBind, 0).GetSocketAddress()}
	return c
}
