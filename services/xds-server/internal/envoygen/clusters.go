package envoygen

import (
	"cmp"
	"fmt"
	"math"
	"net/netip"
	"strings"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	caresv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/network/dns_resolver/cares/v3"
	rawbufferv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/raw_buffer/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/xds-server/internal/authn"
	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/services/xds-server/internal/translate"
)

const (
	defaultConnectTimeout  = 10 * time.Second
	httpProtocolOptionsKey = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
	tlsTransportSocket     = "envoy.transport_sockets.tls"
	maxRingSize            = 8 * 1024 * 1024
)

// clusters returns every cluster the proxy needs, sorted by name.
func (b *builder) clusters() []*clusterv3.Cluster {
	out := []*clusterv3.Cluster{b.blackHoleCluster()}
	if b.proxy.IsSidecar() {
		out = append(out, b.passthroughCluster(), b.inboundPassthroughCluster())
		for _, in := range b.inboundPorts() {
			out = append(out, b.inboundCluster(in))
		}
	}
	for _, oc := range b.outboundClusters(true) {
		out = append(out, oc.cluster)
	}
	return sortByName(out)
}

// outboundCluster is a generated cluster with what its endpoints are built from.
type outboundCluster struct {
	cluster *clusterv3.Cluster
	svc     *model.Service
	port    *discoveryv1.Port
	subset  *networking.Subset    // nil for the whole service
	lb      *translate.LocalityLB // nil without locality load balancing
	// sniDNAT marks the cluster an AUTO_PASSTHROUGH gateway forwards an mTLS connection to by
	// its SNI (SNIDNATClusterName): it adds no TLS, and balances over mTLS endpoints only.
	sniDNAT bool
}

// SNIDNATClusterName is istiod's name of the cluster, and the SNI, by which an
// AUTO_PASSTHROUGH gateway routes to a service port (subset): "outbound_.<port>_.<subset>_.<host>".
func SNIDNATClusterName(port uint32, subset, host string) string {
	return "outbound_." + itoa(port) + "_." + subset + "_." + host
}

// outboundClusters builds the proxy's outbound clusters; without withTLS, leaving out their
// TLS settings, which load assignments do not read.
func (b *builder) outboundClusters(withTLS bool) []outboundCluster {
	var out []outboundCluster
	// As istiod: a gateway with an AUTO_PASSTHROUGH server gets an SNI-DNAT cluster for every
	// port of every mesh service it sees.
	sniDNAT := b.proxy.IsRouter() && hasAutoPassthrough(b.snap, b.proxy)
	for _, svc := range b.services {
		host := svc.Spec.GetHostname()
		dr := b.binds.DestinationRule(host)
		for _, port := range b.visiblePorts(svc) {
			for _, ss := range append([]*networking.Subset{nil}, translate.Subsets(specOf(dr))...) {
				pol := translate.TrafficPolicy(specOf(dr), port.GetNumber(), ss.GetName())
				if why := b.tlsRefusal(pol.TLS, specOf(dr).GetWorkloadSelector() != nil); why != "" {
					// Traffic the rule says to encrypt must not leave in plaintext: no cluster
					// (requests for it fail) rather than one without the TLS.
					name := ClusterName(port.GetNumber(), ss.GetName(), host)
					if withTLS {
						b.log.Warn("leaving out cluster whose TLS cannot be built", "cluster", name, "reason", why)
						b.report(model.MetricClusterTLSRefused, name, why)
					}
					continue
				}
				lb := translate.NewLocalityLB(pol, b.snap.Mesh, b.locality, b.topologyLabels)
				out = append(out, outboundCluster{svc: svc, port: port, subset: ss, lb: lb,
					cluster: b.outboundCluster(svc, port, ss, pol, lb, withTLS)})
				if sniDNAT && !svc.Spec.GetMeshExternal() && !strings.EqualFold(port.GetProtocol(), "UDP") {
					c := b.outboundCluster(svc, port, ss, pol, lb, false)
					renameCluster(c, SNIDNATClusterName(port.GetNumber(), ss.GetName(), host))
					out = append(out, outboundCluster{svc: svc, port: port, subset: ss, lb: lb, cluster: c, sniDNAT: true})
				}
			}
		}
	}
	return out
}

func (b *builder) connectTimeout() *durationpb.Duration {
	if d := b.snap.Mesh.GetConnectTimeout(); d != nil && d.AsDuration() > 0 {
		return d
	}
	return durationpb.New(defaultConnectTimeout)
}

func (b *builder) outboundCluster(svc *model.Service, port *discoveryv1.Port, subset *networking.Subset,
	pol translate.Policy, lb *translate.LocalityLB, withTLS bool) *clusterv3.Cluster {
	host := svc.Spec.GetHostname()
	name := ClusterName(port.GetNumber(), subset.GetName(), host)
	c := &clusterv3.Cluster{
		Name:           name,
		ConnectTimeout: b.connectTimeout(),
		LbPolicy:       clusterv3.Cluster_LEAST_REQUEST,
		CircuitBreakers: &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{
			defaultThresholds()}},
		CommonLbConfig: &clusterv3.Cluster_CommonLbConfig{},
	}
	switch svc.Spec.GetResolution() {
	case discoveryv1.Resolution_DNS, discoveryv1.Resolution_DNS_ROUND_ROBIN:
		if svc.Spec.GetResolution() == discoveryv1.Resolution_DNS {
			c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STRICT_DNS}
		} else {
			c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_LOGICAL_DNS}
		}
		b.setDNS(c)
		c.LoadAssignment = b.dnsLoadAssignment(name, svc, port, subset, lb, b.endpointMTLS(svc, port, subset.GetName()))
	case discoveryv1.Resolution_NONE:
		if b.proxy.IsRouter() {
			// As istiod: gateways cannot use original-destination clusters (connections reach
			// them addressed to the gateway), so they balance over the endpoints.
			c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS}
			c.EdsClusterConfig = &clusterv3.Cluster_EdsClusterConfig{EdsConfig: adsConfigSource(), ServiceName: name}
			break
		}
		c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST}
		c.LbPolicy = clusterv3.Cluster_CLUSTER_PROVIDED
		if t := port.GetTargetPort(); t != 0 && svc.Spec.GetRegistry() == "serviceentry" {
			// As istiod: a ServiceEntry's targetPort still applies at the original destination.
			c.LbConfig = &clusterv3.Cluster_OriginalDstLbConfig_{OriginalDstLbConfig: &clusterv3.Cluster_OriginalDstLbConfig{
				UpstreamPortOverride: wrapperspb.UInt32(t)}}
		}
	default:
		c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS}
		c.EdsClusterConfig = &clusterv3.Cluster_EdsClusterConfig{EdsConfig: adsConfigSource(), ServiceName: name}
	}
	proto := portProtocol(port)
	log := b.log.With("cluster", name)
	if c.LbPolicy != clusterv3.Cluster_CLUSTER_PROVIDED {
		applyLB(c, pol.LB)
	} else if pol.LB != nil {
		log.Debug("load balancer settings do not apply to a service without resolution")
	}
	pool := applyConnectionPool(c, pol.Pool)
	// Sidecars sniff an undeclared port and forward in the client's HTTP version, which
	// istiod keeps even when the DestinationRule asks to upgrade to h2.
	sniffed := proto == protoSniffed && b.proxy.IsSidecar()
	h2 := proto == protoHTTP2 || (!sniffed && pool.upgradesH2(proto.isHTTP(), b.snap.Mesh.GetH2UpgradePolicy()))
	httpOpts := pool.options(h2, sniffed)
	if od := pol.Outlier; od != nil {
		applyOutlier(c, od)
	}
	if c.CommonLbConfig.HealthyPanicThreshold == nil {
		// As istiod (which sends unhealthy endpoints by default): never panic into routing to
		// hosts known to be down (stated on original-destination clusters too, as istiod does).
		c.CommonLbConfig.HealthyPanicThreshold = &typev3.Percent{}
	}
	if lb.WeightedLocalities() && c.LbPolicy != clusterv3.Cluster_CLUSTER_PROVIDED {
		c.CommonLbConfig.LocalityConfigSpecifier = &clusterv3.Cluster_CommonLbConfig_LocalityWeightedLbConfig_{
			LocalityWeightedLbConfig: &clusterv3.Cluster_CommonLbConfig_LocalityWeightedLbConfig{}}
	}
	t, autoMTLS := pol.TLS, false
	if !withTLS {
		t = nil
	} else if t == nil && b.autoMTLS(svc, pol) {
		t, autoMTLS = &networking.ClientTLSSettings{Mode: networking.ClientTLSSettings_ISTIO_MUTUAL}, true
	}
	if t != nil {
		var ts *corev3.TransportSocket
		var auto *corev3.UpstreamHttpProtocolOptions
		if autoMTLS {
			// The same for every proxy: built once per snapshot.
			ts = b.ix.autoMTLSSocket(name, h2, func() *corev3.TransportSocket {
				ts, _ := b.upstreamTLS(t, svc, port.GetNumber(), subset.GetName(), h2, log)
				return ts
			})
		} else {
			ts, auto = b.upstreamTLS(t, svc, port.GetNumber(), subset.GetName(), h2, log)
		}
		c.TransportSocket = ts
		if autoMTLS && c.GetType() != clusterv3.Cluster_ORIGINAL_DST {
			// mTLS to the endpoints that have a sidecar (EDS marks them), plaintext to the rest.
			c.TransportSocket = nil
			c.TransportSocketMatches = []*clusterv3.Cluster_TransportSocketMatch{
				{Name: "tlsMode-" + translate.TLSModeIstio, Match: istioTLSModeMatch, TransportSocket: ts},
				{Name: "tlsMode-disabled", Match: &structpb.Struct{}, TransportSocket: rawBufferTransportSocket},
			}
		}
		if auto != nil {
			// Like istiod: the SNI and SAN come from each request's Host when the rule names none.
			if httpOpts == nil {
				httpOpts = upstreamHTTPOptions(false, nil)
			}
			httpOpts.UpstreamHttpProtocolOptions = auto
		}
	}
	if httpOpts != nil {
		c.TypedExtensionProtocolOptions = map[string]*anyMsg{httpProtocolOptionsKey: mustAny(httpOpts)}
	}
	return c
}

// istioTLSModeMatch selects the endpoints EDS marks as able to take Istio mTLS.
var istioTLSModeMatch = &structpb.Struct{Fields: map[string]*structpb.Value{
	translate.TLSModeKey: structpb.NewStringValue(translate.TLSModeIstio)}}

// rawBufferTransportSocket is plaintext, shared: generated resources are never modified.
var rawBufferTransportSocket = &corev3.TransportSocket{Name: "envoy.transport_sockets.raw_buffer",
	ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAny(&rawbufferv3.RawBuffer{})}}

// autoMTLS reports whether a cluster of svc whose DestinationRule sets no TLS originates
// Istio mTLS by itself, as istiod decides it: the mesh's enableAutoMtls (on by default), for
// services inside the mesh whose namespace does not DISABLE mTLS by PeerAuthentication. A
// service reached at the original destination (no resolution, or a PASSTHROUGH load balancer)
// gets it only when every endpoint has a sidecar, since its cluster cannot choose per endpoint.
func (b *builder) autoMTLS(svc *model.Service, pol translate.Policy) bool {
	if on := b.snap.Mesh.GetEnableAutoMtls(); (on != nil && !on.GetValue()) || svc.Spec.GetMeshExternal() {
		return false
	}
	if (svc.Spec.GetResolution() == discoveryv1.Resolution_NONE ||
		pol.LB.GetSimple() == networking.LoadBalancerSettings_PASSTHROUGH) && !model.EndpointsInMesh(svc.Endpoints) {
		return false
	}
	return b.namespaceMTLS(svc.Spec.GetNamespace()) != authn.Disable
}

// namespaceMTLS is the PeerAuthentication mode of a namespace, resolved once per builder.
func (b *builder) namespaceMTLS(ns string) authn.Mode {
	if m, ok := b.nsModes[ns]; ok {
		return m
	}
	if b.nsModes == nil {
		b.nsModes = map[string]authn.Mode{}
	}
	m := authn.NamespaceMode(b.snap, ns)
	b.nsModes[ns] = m
	return m
}

// poolHTTP is what a connection pool asks of a cluster's HTTP protocol options.
type poolHTTP struct {
	common            *corev3.HttpProtocolOptions // nil when the pool sets none
	h2Upgrade         networking.ConnectionPoolSettings_HTTPSettings_H2UpgradePolicy
	useClientProtocol bool
	// For clusters that speak h2 only.
	maxConcurrentStreams uint32
	h2Keepalive          *corev3.KeepaliveSettings
}

// upgradesH2 reports whether an outbound cluster upgrades HTTP/1.1 to h2, as istiod: the
// pool's UPGRADE on any port (its author knows the port speaks HTTP), the mesh's on ports
// declared HTTP unless the pool says DO_NOT_UPGRADE; never when the client's protocol is kept.
func (p poolHTTP) upgradesH2(declaredHTTP bool, mesh meshv1alpha1.MeshConfig_H2UpgradePolicy) bool {
	switch {
	case p.useClientProtocol:
		return false
	case p.h2Upgrade == networking.ConnectionPoolSettings_HTTPSettings_UPGRADE:
		return true
	case p.h2Upgrade == networking.ConnectionPoolSettings_HTTPSettings_DO_NOT_UPGRADE:
		return false
	}
	return declaredHTTP && mesh == meshv1alpha1.MeshConfig_UPGRADE
}

// options are a cluster's HTTP protocol options as istiod builds them: the client's HTTP
// version when downstream or the pool asks for it, else h2 or HTTP/1.1 explicitly; nil when
// nothing asks for any. istiod sets the pool's options whatever the port's protocol (Envoy
// uses them only where the cluster carries HTTP, e.g. a TCP port's sniffed traffic).
func (p poolHTTP) options(h2, downstream bool) *httpv3.HttpProtocolOptions {
	switch {
	case downstream || p.useClientProtocol:
		return downstreamHTTPOptions(p.common)
	case h2:
		o := upstreamHTTPOptions(true, p.common)
		h2opts := o.GetExplicitHttpConfig().GetHttp2ProtocolOptions()
		if p.maxConcurrentStreams > 0 {
			h2opts.MaxConcurrentStreams = wrapperspb.UInt32(p.maxConcurrentStreams)
		}
		h2opts.ConnectionKeepalive = p.h2Keepalive
		return o
	case p.common != nil:
		return upstreamHTTPOptions(false, p.common)
	}
	return nil
}

// applyConnectionPool sets a connection pool's limits on c (a DestinationRule's for clients,
// also a Sidecar's for the inbound side), returning what it asks of the HTTP options. HTTP
// limits become circuit breakers on every port, as in istiod.
func applyConnectionPool(c *clusterv3.Cluster, cp *networking.ConnectionPoolSettings) poolHTTP {
	var pool poolHTTP
	if cp == nil {
		return pool
	}
	th := c.CircuitBreakers.Thresholds[0]
	tcp, hp := cp.GetTcp(), cp.GetHttp()
	if n := tcp.GetMaxConnections(); n > 0 {
		th.MaxConnections = wrapperspb.UInt32(uint32(n))
	}
	if d := tcp.GetConnectTimeout(); d != nil && d.AsDuration() > 0 {
		c.ConnectTimeout = d
	}
	if ka := tcp.GetTcpKeepalive(); ka != nil {
		k := &corev3.TcpKeepalive{}
		if ka.GetProbes() > 0 {
			k.KeepaliveProbes = wrapperspb.UInt32(ka.GetProbes())
		}
		if t := ka.GetTime(); t != nil {
			k.KeepaliveTime = wrapperspb.UInt32(uint32(max(t.AsDuration()/time.Second, 1)))
		}
		if t := ka.GetInterval(); t != nil {
			k.KeepaliveInterval = wrapperspb.UInt32(uint32(max(t.AsDuration()/time.Second, 1)))
		}
		c.UpstreamConnectionOptions = &clusterv3.UpstreamConnectionOptions{TcpKeepalive: k}
	}
	if n := hp.GetHttp1MaxPendingRequests(); n > 0 {
		th.MaxPendingRequests = wrapperspb.UInt32(uint32(n))
	}
	if n := hp.GetHttp2MaxRequests(); n > 0 {
		th.MaxRequests = wrapperspb.UInt32(uint32(n))
	}
	if n := hp.GetMaxRetries(); n > 0 {
		th.MaxRetries = wrapperspb.UInt32(uint32(n))
	}
	pool.h2Upgrade = hp.GetH2UpgradePolicy()
	pool.useClientProtocol = hp.GetUseClientProtocol()
	pool.maxConcurrentStreams = uint32(max(hp.GetMaxConcurrentStreams(), 0))
	if ka := hp.GetHttp2KeepAlive(); ka != nil {
		pool.h2Keepalive = &corev3.KeepaliveSettings{Interval: ka.GetInterval(), Timeout: ka.GetTimeout()}
	}
	// As istiod: the HTTP idle timeout, else the TCP one.
	idle := cmp.Or(hp.GetIdleTimeout(), tcp.GetIdleTimeout())
	maxDuration := tcp.GetMaxConnectionDuration()
	perConn := uint32(max(hp.GetMaxRequestsPerConnection(), 0))
	if idle != nil || maxDuration != nil || perConn > 0 || pool.maxConcurrentStreams > 0 || pool.h2Keepalive != nil {
		pool.common = &corev3.HttpProtocolOptions{IdleTimeout: idle, MaxConnectionDuration: maxDuration}
		if perConn > 0 {
			pool.common.MaxRequestsPerConnection = wrapperspb.UInt32(perConn)
		}
	}
	return pool
}

// defaultThresholds lifts Envoy's low default limits the way istiod does: the mesh, not
// Envoy's defaults, decides when to shed load.
// upstreamHTTPOptions speaks HTTP/2 or HTTP/1.1 to the upstream, with common options if any.
func upstreamHTTPOptions(h2 bool, common *corev3.HttpProtocolOptions) *httpv3.HttpProtocolOptions {
	opts := &httpv3.HttpProtocolOptions{CommonHttpProtocolOptions: common}
	if h2 {
		opts.UpstreamProtocolOptions = &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{
			ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
				ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{
					Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}}}}
	} else {
		opts.UpstreamProtocolOptions = &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{
			ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
				ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_HttpProtocolOptions{
					HttpProtocolOptions: &corev3.Http1ProtocolOptions{}}}}
	}
	return opts
}

func defaultThresholds() *clusterv3.CircuitBreakers_Thresholds {
	return &clusterv3.CircuitBreakers_Thresholds{
		MaxConnections:     wrapperspb.UInt32(math.MaxUint32),
		MaxPendingRequests: wrapperspb.UInt32(math.MaxUint32),
		MaxRequests:        wrapperspb.UInt32(math.MaxUint32),
		MaxRetries:         wrapperspb.UInt32(math.MaxUint32),
		// istiod tracks no remaining-capacity stats by default (DISABLE_TRACK_REMAINING_CB_METRICS).
	}
}

func applyLB(c *clusterv3.Cluster, lb *networking.LoadBalancerSettings) {
	if lb == nil {
		return
	}
	if ch := lb.GetConsistentHash(); ch != nil {
		if mg := ch.GetMaglev(); mg != nil {
			c.LbPolicy = clusterv3.Cluster_MAGLEV
			if n := mg.GetTableSize(); n > 0 {
				c.LbConfig = &clusterv3.Cluster_MaglevLbConfig_{MaglevLbConfig: &clusterv3.Cluster_MaglevLbConfig{
					TableSize: wrapperspb.UInt64(n)}}
			}
			return
		}
		c.LbPolicy = clusterv3.Cluster_RING_HASH
		size := ch.GetRingHash().GetMinimumRingSize()
		if size == 0 {
			size = ch.GetMinimumRingSize() //nolint:staticcheck // still honoured by Istio
		}
		if size == 0 {
			size = 1024 // Envoy's default, stated as istiod does
		}
		c.LbConfig = &clusterv3.Cluster_RingHashLbConfig_{RingHashLbConfig: &clusterv3.Cluster_RingHashLbConfig{
			MinimumRingSize: wrapperspb.UInt64(min(size, maxRingSize))}}
		return
	}
	switch lb.GetSimple() {
	case networking.LoadBalancerSettings_ROUND_ROBIN:
		c.LbPolicy = clusterv3.Cluster_ROUND_ROBIN
		if ss := slowStart(lb); ss != nil {
			c.LbConfig = &clusterv3.Cluster_RoundRobinLbConfig_{RoundRobinLbConfig: &clusterv3.Cluster_RoundRobinLbConfig{
				SlowStartConfig: ss}}
		}
	case networking.LoadBalancerSettings_RANDOM:
		c.LbPolicy = clusterv3.Cluster_RANDOM
	case networking.LoadBalancerSettings_PASSTHROUGH:
		// Istio turns PASSTHROUGH into an original-destination cluster.
		c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST}
		c.LbPolicy = clusterv3.Cluster_CLUSTER_PROVIDED
		c.EdsClusterConfig = nil
		c.LoadAssignment = nil
	default:
		c.LbPolicy = clusterv3.Cluster_LEAST_REQUEST
		if ss := slowStart(lb); ss != nil {
			c.LbConfig = &clusterv3.Cluster_LeastRequestLbConfig_{LeastRequestLbConfig: &clusterv3.Cluster_LeastRequestLbConfig{
				SlowStartConfig: ss}}
		}
	}
}

// slowStart ramps traffic to new endpoints up over the rule's warmup (or the deprecated
// warmupDurationSecs), with istiod's defaults: linear (aggression 1), from 10% of the weight.
func slowStart(lb *networking.LoadBalancerSettings) *clusterv3.Cluster_SlowStartConfig {
	if w := lb.GetWarmup(); w != nil {
		aggression, minPct := 1.0, 10.0
		if a := w.GetAggression(); a != nil {
			aggression = a.GetValue()
		}
		if m := w.GetMinimumPercent(); m != nil {
			minPct = m.GetValue()
		}
		// The runtime key is one Envoy will never find, so the value stays fixed (as istiod's).
		return &clusterv3.Cluster_SlowStartConfig{SlowStartWindow: w.GetDuration(),
			Aggression:       &corev3.RuntimeDouble{DefaultValue: aggression, RuntimeKey: "("},
			MinWeightPercent: &typev3.Percent{Value: minPct}}
	}
	if d := lb.GetWarmupDurationSecs(); d != nil {
		return &clusterv3.Cluster_SlowStartConfig{SlowStartWindow: d}
	}
	return nil
}

// applyOutlier sets outlier detection as istiod does: success-rate ejection off, each error
// kind the rule names enforced (a count of 0 turns it off), Envoy's defaults for the rest (five
// consecutive 5xx), and the panic threshold at minHealthPercent, 0 when unset, because Envoy's
// 50% default would send traffic to ejected hosts of the small services Kubernetes has.
func applyOutlier(c *clusterv3.Cluster, od *networking.OutlierDetection) {
	enforcing := func(n uint32) *wrapperspb.UInt32Value {
		if n > 0 {
			return wrapperspb.UInt32(100)
		}
		return wrapperspb.UInt32(0)
	}
	out := &clusterv3.OutlierDetection{EnforcingSuccessRate: wrapperspb.UInt32(0)}
	if n := od.GetConsecutive_5XxErrors(); n != nil {
		out.Consecutive_5Xx = wrapperspb.UInt32(n.GetValue())
		out.EnforcingConsecutive_5Xx = enforcing(n.GetValue())
	}
	if n := od.GetConsecutiveGatewayErrors(); n != nil {
		out.ConsecutiveGatewayFailure = wrapperspb.UInt32(n.GetValue())
		out.EnforcingConsecutiveGatewayFailure = enforcing(n.GetValue())
	}
	if od.GetSplitExternalLocalOriginErrors() {
		out.SplitExternalLocalOriginErrors = true
		if n := od.GetConsecutiveLocalOriginFailures().GetValue(); n > 0 {
			out.ConsecutiveLocalOriginFailure = wrapperspb.UInt32(n)
			out.EnforcingConsecutiveLocalOriginFailure = wrapperspb.UInt32(100)
		}
		out.EnforcingLocalOriginSuccessRate = wrapperspb.UInt32(0)
	}
	if d := od.GetInterval(); d != nil && d.AsDuration() > 0 {
		out.Interval = d
	}
	if d := od.GetBaseEjectionTime(); d != nil && d.AsDuration() > 0 {
		out.BaseEjectionTime = d
	}
	if p := od.GetMaxEjectionPercent(); p > 0 {
		out.MaxEjectionPercent = wrapperspb.UInt32(uint32(min(p, 100)))
	}
	c.OutlierDetection = out
	c.CommonLbConfig.HealthyPanicThreshold = &typev3.Percent{Value: float64(min(max(od.GetMinHealthPercent(), 0), 100))}
}

// tlsRefusal says why the proxy cannot be given the TLS origination t asks for, "" when it
// can (or t asks for none). Such a cluster is left out, never sent without TLS:
//
//   - credentialName on a sidecar, unless the rule has a workloadSelector and the secret is a
//     "kubernetes://" one the xds-server serves (WithCredentials; it then hands it to the
//     sidecar only if its account may read it, as istiod does). istiod sends a rule without
//     workloadSelector as plaintext, so that every sidecar the rule reaches does not wait on
//     a Secret it may not read: here the cluster is left out instead;
//   - MUTUAL without a client certificate (credentialName, or clientCertificate and
//     privateKey): istiod logs and sends plaintext;
//   - a mode this code does not know.
func (b *builder) tlsRefusal(t *networking.ClientTLSSettings, selected bool) string {
	switch t.GetMode() {
	case networking.ClientTLSSettings_DISABLE, networking.ClientTLSSettings_ISTIO_MUTUAL:
		return ""
	case networking.ClientTLSSettings_SIMPLE, networking.ClientTLSSettings_MUTUAL:
		mode := t.GetMode().String()
		switch cred := t.GetCredentialName(); {
		case cred != "" && b.proxy.IsSidecar() && !b.credentials:
			return fmt.Sprintf("DestinationRule tls mode %s with credentialName %q: the xds-server has no Kubernetes cluster "+
				"to serve the secret (%s) from, and will not send the cluster without TLS", mode, cred, credentialResource(cred))
		case cred != "" && b.proxy.IsSidecar() && !strings.HasPrefix(credentialResource(cred), "kubernetes://"):
			return fmt.Sprintf("DestinationRule tls mode %s with credentialName %q: Sailplane serves only kubernetes:// "+
				"secrets, and will not send the cluster without TLS", mode, cred)
		case cred != "" && b.proxy.IsSidecar() && !selected:
			return fmt.Sprintf("DestinationRule tls mode %s with credentialName %q and no workloadSelector: as istiod, "+
				"credentialName applies to sidecars only through a rule selecting them (istiod sends the cluster in "+
				"plaintext; Sailplane leaves it out)", mode, cred)
		case cred == "" && t.GetMode() == networking.ClientTLSSettings_MUTUAL &&
			(t.GetClientCertificate() == "" || t.GetPrivateKey() == ""):
			return "DestinationRule tls mode MUTUAL needs credentialName, or clientCertificate and privateKey"
		}
		return ""
	}
	return fmt.Sprintf("DestinationRule tls mode %s is not supported", t.GetMode().String())
}

// upstreamTLS builds TLS origination as istiod does (cluster_tls.go). Certificates always come
// over SDS from the agent, named as Istio names them, so no key material travels in CDS.
//
//   - ISTIO_MUTUAL presents the workload certificate and accepts only the destination's SPIFFE
//     identities (the rule's subjectAltNames when it lists some), under the mesh root.
//   - SIMPLE and MUTUAL validate the server against caCertificates, else the system CA bundle
//     ("file-root:system"; none with insecureSkipVerify), or against "<credentialName>-cacert";
//     SANs and SNI as the rule names them. With no SNI, Envoy takes SNI (and, with no SANs
//     either, the SAN to verify) from each request's Host: the returned options say so.
//
// nil when the cluster originates no TLS.
func (b *builder) upstreamTLS(t *networking.ClientTLSSettings, svc *model.Service, port uint32, subset string,
	h2 bool, log interface{ Debug(string, ...any) }) (*corev3.TransportSocket, *corev3.UpstreamHttpProtocolOptions) {
	ctx := &tlsv3.UpstreamTlsContext{CommonTlsContext: &tlsv3.CommonTlsContext{TlsParams: &tlsv3.TlsParameters{
		TlsMinimumProtocolVersion: tlsv3.TlsParameters_TLSv1_2,
		TlsMaximumProtocolVersion: tlsv3.TlsParameters_TLSv1_3,
	}}}
	common := ctx.CommonTlsContext
	host := svc.Spec.GetHostname()
	var auto *corev3.UpstreamHttpProtocolOptions
	switch t.GetMode() {
	case networking.ClientTLSSettings_DISABLE:
		return nil, nil
	case networking.ClientTLSSettings_ISTIO_MUTUAL:
		sans := t.GetSubjectAltNames()
		if sans == nil {
			sans = b.ix.identities(svc)
		}
		common.TlsCertificateSdsSecretConfigs = []*tlsv3.SdsSecretConfig{sdsSecret("default")}
		common.ValidationContextType = combinedValidation(sans, "ROOTCA")
		common.AlpnProtocols = []string{"istio-peer-exchange", "istio"}
		if h2 {
			common.AlpnProtocols = append(common.AlpnProtocols, "h2")
		}
		ctx.Sni = cmp.Or(t.GetSni(), "outbound_."+itoa(port)+"_."+subset+"_."+host)
	case networking.ClientTLSSettings_SIMPLE, networking.ClientTLSSettings_MUTUAL:
		cred := t.GetCredentialName()
		skipVerify := t.GetInsecureSkipVerify().GetValue()
		ctx.Sni = t.GetSni()
		if ctx.Sni == "" {
			auto = &corev3.UpstreamHttpProtocolOptions{AutoSni: true,
				AutoSanValidation: len(t.GetSubjectAltNames()) == 0 && !skipVerify}
		}
		sans := t.GetSubjectAltNames()
		if len(sans) == 0 && svc.Spec.GetRegistry() == "serviceentry" {
			sans = b.ix.identities(svc)
		}
		mutual := t.GetMode() == networking.ClientTLSSettings_MUTUAL
		switch {
		case cred != "":
			name := credentialResource(cred)
			if mutual {
				common.TlsCertificateSdsSecretConfigs = []*tlsv3.SdsSecretConfig{credentialSDS(name)}
				b.credentialNotServed(name)
			}
			if !skipVerify {
				common.ValidationContextType = combinedValidationFrom(sans, credentialSDS(name+"-cacert"))
				b.credentialNotServed(name + "-cacert")
			}
		default:
			if mutual { // with both files: tlsRefusal leaves out clusters without them
				common.TlsCertificateSdsSecretConfigs = []*tlsv3.SdsSecretConfig{
					sdsSecret("file-cert:" + t.GetClientCertificate() + "~" + t.GetPrivateKey())}
			}
			if skipVerify {
				common.ValidationContextType = &tlsv3.CommonTlsContext_ValidationContext{}
			} else {
				vc := combinedValidation(sans, "file-root:"+cmp.Or(t.GetCaCertificates(), "system"))
				if crl := t.GetCaCrl(); crl != "" {
					vc.CombinedValidationContext.DefaultValidationContext.Crl = &corev3.DataSource{
						Specifier: &corev3.DataSource_Filename{Filename: crl}}
				}
				common.ValidationContextType = vc
			}
		}
		if d := b.snap.Mesh.GetTlsDefaults(); d != nil {
			common.TlsParams.EcdhCurves = d.GetEcdhCurves()
			common.TlsParams.CipherSuites = d.GetCipherSuites()
		}
		if h2 {
			common.AlpnProtocols = []string{"h2"}
		}
	default:
		// tlsRefusal leaves out clusters of other modes; nothing reaches here.
		log.Debug("unknown TLS mode", "mode", t.GetMode().String())
		return nil, nil
	}
	return &corev3.TransportSocket{Name: tlsTransportSocket,
		ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAny(ctx)}}, auto
}

// combinedValidation accepts peers whose certificate chains to the SDS root named root and
// carries one of sans (any, when sans is empty).
func combinedValidation(sans []string, root string) *tlsv3.CommonTlsContext_CombinedValidationContext {
	return combinedValidationFrom(sans, sdsSecret(root))
}

// combinedValidationFrom is combinedValidation with the root from the SDS secret root.
func combinedValidationFrom(sans []string, root *tlsv3.SdsSecretConfig) *tlsv3.CommonTlsContext_CombinedValidationContext {
	v := &tlsv3.CertificateValidationContext{}
	for _, s := range sans {
		v.MatchTypedSubjectAltNames = append(v.MatchTypedSubjectAltNames, &tlsv3.SubjectAltNameMatcher{
			SanType: sanType(s),
			Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: s}}})
	}
	return &tlsv3.CommonTlsContext_CombinedValidationContext{
		CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
			DefaultValidationContext:         v,
			ValidationContextSdsSecretConfig: root,
		}}
}

// sanType is the kind of subject alt name s is written as: a URI (SPIFFE IDs), an IP, else DNS.
// istiod matches any kind (the deprecated match_subject_alt_names); typed matchers say which.
func sanType(s string) tlsv3.SubjectAltNameMatcher_SanType {
	if strings.Contains(s, "://") {
		return tlsv3.SubjectAltNameMatcher_URI
	}
	if _, err := netip.ParseAddr(s); err == nil {
		return tlsv3.SubjectAltNameMatcher_IP_ADDRESS
	}
	return tlsv3.SubjectAltNameMatcher_DNS
}

// credentialResource is the SDS name of a credentialName: "kubernetes://<name>" unless it
// names its kind (kubernetes://, configmap://, ...) itself.
func credentialResource(name string) string {
	if strings.Contains(name, "://") {
		return name
	}
	return "kubernetes://" + name
}

func (b *builder) blackHoleCluster() *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 BlackHoleCluster,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		ConnectTimeout:       b.connectTimeout(),
	}
}

// defaultDNSRefreshRate is the mesh's dnsRefreshRate when it sets none, as istiod's.
const defaultDNSRefreshRate = 60 * time.Second

// caresResolver is istiod's DNS resolver of DNS clusters: Envoy's c-ares, which opens a new UDP
// socket (a new source port) every 100 queries, making spoofed answers harder to land.
var caresResolver = &corev3.TypedExtensionConfig{Name: "envoy.network.dns_resolver.cares",
	TypedConfig: mustAny(&caresv3.CaresDnsResolverConfig{UdpMaxQueries: wrapperspb.UInt32(100)})}

// setDNS configures how a DNS cluster resolves, as istiod: re-resolving when the records' TTL
// expires, and after a failed lookup at the mesh's dnsRefreshRate (not Envoy's 5s, which would
// load the DNS servers), with 100ms of jitter; IPv6 addresses for a proxy that has only IPv6
// addresses, else IPv4. The fields are deprecated for the dns_cluster extension, which istiod
// does not use yet.
func (b *builder) setDNS(c *clusterv3.Cluster) {
	c.DnsLookupFamily = clusterv3.Cluster_V4_ONLY
	if ipv6Only(b.proxy.IPs) {
		c.DnsLookupFamily = clusterv3.Cluster_V6_ONLY
	}
	rate := b.snap.Mesh.GetDnsRefreshRate()
	if rate.AsDuration() <= time.Millisecond { // unset, or a rate Envoy refuses
		rate = durationpb.New(defaultDNSRefreshRate)
	}
	c.DnsRefreshRate = rate                              //nolint:staticcheck // see above
	c.RespectDnsTtl = true                               //nolint:staticcheck // see above
	c.DnsJitter = durationpb.New(100 * time.Millisecond) //nolint:staticcheck // see above
	c.TypedDnsResolverConfig = caresResolver
}

// ipv6Only reports whether the proxy has addresses and all of them are IPv6.
func ipv6Only(ips []string) bool {
	for _, ip := range ips {
		a, err := netip.ParseAddr(ip)
		if err != nil || a.Unmap().Is4() {
			return false
		}
	}
	return len(ips) > 0
}

// renameCluster gives a generated cluster (and its load assignment) another name.
func renameCluster(c *clusterv3.Cluster, name string) {
	c.Name = name
	if c.EdsClusterConfig != nil {
		c.EdsClusterConfig.ServiceName = name
	}
	if c.LoadAssignment != nil {
		c.LoadAssignment.ClusterName = name
	}
}
