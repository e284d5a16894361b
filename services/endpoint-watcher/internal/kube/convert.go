// Package kube discovers services and endpoints in Kubernetes clusters: Services,
// EndpointSlices, Pods and Nodes from shared informers in the primary cluster and in remote
// clusters registered by kubeconfig Secrets, merged per hostname into the registry resources
// the ServiceEntry source also produces (one discoveryv1.Service and one discoveryv1.Endpoints
// per "<namespace>/<hostname>").
package kube

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/cache"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
)

// Registry is the value of Service.registry for everything this package produces.
const Registry = "kubernetes"

// Labels and annotations read from Kubernetes objects, as Istio names them.
const (
	AnnotationExportTo = "networking.istio.io/exportTo"
	LabelRegion        = "topology.kubernetes.io/region"
	LabelZone          = "topology.kubernetes.io/zone"
	LabelSubZone       = "topology.istio.io/subzone"
	LabelNetwork       = "topology.istio.io/network"
	// LabelGatewayPort names the port of a network gateway Service that takes mTLS from other
	// networks (DefaultGatewayPort without it).
	LabelGatewayPort    = "networking.istio.io/gatewayPort"
	DefaultGatewayPort  = 15443
	LabelMultiCluster   = "istio/multiCluster"
	DefaultClusterLocal = "cluster.local"
)

// Hostname is the mesh hostname of a Kubernetes Service.
func Hostname(name, namespace, clusterDomain string) string {
	return name + "." + namespace + ".svc." + clusterDomain
}

// protocols maps Istio's protocol names, lower-cased, to the canonical spelling.
var protocols = map[string]string{
	"tcp": "TCP", "udp": "UDP", "grpc": "GRPC", "grpc-web": "GRPC-Web", "http": "HTTP",
	"http_proxy": "HTTP_PROXY", "http2": "HTTP2", "https": "HTTPS", "tls": "TLS",
	"mongo": "Mongo", "redis": "Redis", "mysql": "MySQL",
}

// wellKnownTCPPorts are server-first protocols' ports (SMTP, DNS, MySQL, MongoDB) that Istio
// treats as TCP when undeclared: sniffing would wait forever for the client to speak first.
var wellKnownTCPPorts = map[int32]bool{25: true, 53: true, 3306: true, 27017: true}

// Protocol detects a Service port's protocol as Istio does: UDP ports are UDP; else
// appProtocol when set (Kubernetes' kubernetes.io/h2c, ws and wss included), else the port
// name, read up to its first "-" ("http-web" is HTTP, "grpc-web-x" GRPC-Web). A protocol Istio
// does not know is undeclared (empty), which proxies sniff, except on well-known server-first
// ports, which are TCP.
func Protocol(p corev1.ServicePort) string {
	if p.Protocol == corev1.ProtocolUDP {
		return "UDP"
	}
	name := strings.ToLower(p.Name)
	if p.AppProtocol != nil {
		name = strings.ToLower(*p.AppProtocol)
		switch name {
		case "kubernetes.io/h2c":
			return "HTTP2"
		case "kubernetes.io/ws":
			return "HTTP"
		case "kubernetes.io/wss":
			return "HTTPS"
		}
	}
	if strings.HasPrefix(name, "grpc-web") {
		return "GRPC-Web"
	}
	if i := strings.IndexByte(name, '-'); i >= 0 {
		name = name[:i]
	}
	if proto, ok := protocols[name]; ok {
		return proto
	}
	if wellKnownTCPPorts[p.Port] {
		return "TCP"
	}
	return ""
}

// exportTo parses the exportTo annotation: comma-separated namespaces, "." for the Service's
// own, "*" for all (kept, unlike an absent annotation, which leaves the mesh's
// defaultServiceExportTo in force).
func exportTo(ns, annotation string) []string {
	var out []string
	for e := range strings.SplitSeq(annotation, ",") {
		switch e = strings.TrimSpace(e); e {
		case "":
			continue
		case "*":
			return []string{"*"}
		case ".":
			e = ns
		}
		if !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	slices.Sort(out)
	return out
}

// convertPorts translates a Service's ports; a numeric targetPort differing from the port is
// kept, a named one is resolved per endpoint by the EndpointSlices.
func convertPorts(svc *corev1.Service) []*discoveryv1.Port {
	out := make([]*discoveryv1.Port, 0, len(svc.Spec.Ports))
	for _, p := range svc.Spec.Ports {
		dp := &discoveryv1.Port{Name: p.Name, Number: uint32(p.Port), Protocol: Protocol(p)}
		if p.TargetPort.Type == intstr.Int && p.TargetPort.IntVal > 0 && p.TargetPort.IntVal != p.Port {
			dp.TargetPort = uint32(p.TargetPort.IntVal)
		}
		out = append(out, dp)
	}
	return out
}

func isHeadless(svc *corev1.Service) bool {
	return svc.Spec.ClusterIP == corev1.ClusterIPNone
}

// convertService translates one cluster's Service, without endpoints.
func convertService(svc *corev1.Service, hostname, clusterID string) *discoveryv1.Service {
	out := &discoveryv1.Service{
		Hostname:  hostname,
		Namespace: svc.Namespace,
		Ports:     convertPorts(svc),
		Labels:    svc.Labels,
		Registry:  Registry,
		ExportTo:  exportTo(svc.Namespace, svc.Annotations[AnnotationExportTo]),
		ClusterId: clusterID,
	}
	out.NetworkGateways = networkGateways(svc, clusterID)
	switch {
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		out.Resolution = discoveryv1.Resolution_DNS
		out.MeshExternal = true
	case isHeadless(svc):
		// Clients connect to the pod IPs they resolved themselves: passthrough.
		out.Resolution = discoveryv1.Resolution_NONE
	default:
		out.Resolution = discoveryv1.Resolution_STATIC
		if len(svc.Spec.ClusterIPs) > 0 {
			out.Addresses = slices.Clone(svc.Spec.ClusterIPs)
		} else if svc.Spec.ClusterIP != "" {
			out.Addresses = []string{svc.Spec.ClusterIP}
		}
	}
	return out
}

// Health maps EndpointSlice conditions to the registry's health. Per the API, a nil ready or
// serving means true and a nil terminating means false.
func Health(c discovery.EndpointConditions) discoveryv1.Health {
	ready := c.Ready == nil || *c.Ready
	serving := c.Serving == nil || *c.Serving
	terminating := c.Terminating != nil && *c.Terminating
	switch {
	case ready && !terminating:
		return discoveryv1.Health_HEALTHY
	case serving && terminating:
		return discoveryv1.Health_DRAINING
	}
	return discoveryv1.Health_UNHEALTHY
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func nodeLocality(n *corev1.Node) *discoveryv1.Locality {
	if n == nil {
		return nil
	}
	l := &discoveryv1.Locality{Region: n.Labels[LabelRegion], Zone: n.Labels[LabelZone], SubZone: n.Labels[LabelSubZone]}
	if l.Region == "" && l.Zone == "" && l.SubZone == "" {
		return nil
	}
	return l
}

// The transforms keep only what the registry reads, so that the informers' caches of a large
// cluster (tens of thousands of Pods) stay small. They must be idempotent: client-go may apply
// them to an object already transformed.

func stripMeta(m metav1.ObjectMeta, labels map[string]string, annotations map[string]string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion,
		Labels: labels, Annotations: annotations, DeletionTimestamp: m.DeletionTimestamp,
	}
}

func pick(m map[string]string, keys ...string) map[string]string {
	var out map[string]string
	for _, k := range keys {
		if v, ok := m[k]; ok {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}

func transform(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Pod:
		p := &corev1.Pod{
			ObjectMeta: stripMeta(o.ObjectMeta, o.Labels, nil),
			Spec: corev1.PodSpec{NodeName: o.Spec.NodeName, ServiceAccountName: o.Spec.ServiceAccountName,
				Hostname: o.Spec.Hostname, Subdomain: o.Spec.Subdomain},
			Status: corev1.PodStatus{Phase: o.Status.Phase, PodIP: o.Status.PodIP},
		}
		for _, c := range o.Status.Conditions {
			if c.Type == corev1.PodReady {
				p.Status.Conditions = []corev1.PodCondition{{Type: c.Type, Status: c.Status}}
			}
		}
		return p, nil
	case *corev1.Service:
		s := &corev1.Service{
			ObjectMeta: stripMeta(o.ObjectMeta, o.Labels, pick(o.Annotations, AnnotationExportTo)),
			Spec: corev1.ServiceSpec{
				Ports: o.Spec.Ports, Selector: o.Spec.Selector, ClusterIP: o.Spec.ClusterIP,
				ClusterIPs: o.Spec.ClusterIPs, Type: o.Spec.Type, ExternalName: o.Spec.ExternalName,
			},
		}
		// Its outside addresses are where other networks reach it when it is an east-west
		// gateway, by its network label or meshNetworks' registryServiceName.
		s.Spec.ExternalIPs = o.Spec.ExternalIPs
		s.Status.LoadBalancer = o.Status.LoadBalancer
		return s, nil
	case *discovery.EndpointSlice:
		s := &discovery.EndpointSlice{
			ObjectMeta:  stripMeta(o.ObjectMeta, pick(o.Labels, discovery.LabelServiceName), nil),
			AddressType: o.AddressType,
			Ports:       o.Ports,
			Endpoints:   make([]discovery.Endpoint, len(o.Endpoints)),
		}
		for i, e := range o.Endpoints {
			s.Endpoints[i] = discovery.Endpoint{Addresses: e.Addresses, Conditions: e.Conditions, NodeName: e.NodeName, Zone: e.Zone}
			if e.TargetRef != nil {
				s.Endpoints[i].TargetRef = &corev1.ObjectReference{Kind: e.TargetRef.Kind, Namespace: e.TargetRef.Namespace, Name: e.TargetRef.Name}
			}
		}
		return s, nil
	case *corev1.Namespace:
		return &corev1.Namespace{ObjectMeta: stripMeta(o.ObjectMeta, pick(o.Labels, LabelNetwork), nil)}, nil
	case *corev1.Node:
		return &corev1.Node{ObjectMeta: stripMeta(o.ObjectMeta, pick(o.Labels, LabelRegion, LabelZone, LabelSubZone), nil)}, nil
	}
	return obj, nil
}

var _ cache.TransformFunc = transform

// untomb returns the object of a delete notification, which may be a tombstone.
func untomb(obj any) any {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return obj
}

// networkGateways are the east-west gateways a Service is, as istiod reads them: a Service
// labelled with a network is that network's gateway at each of its load balancer addresses
// (IP or host name) and external IPs, on the port the gatewayPort label names (15443 by
// default), which the Service must have.
//
// A Service without the label has its outside addresses listed with no network and no port:
// meshNetworks may name it a network's gateway (registryServiceName), which the xds-server
// applies, as istiod does, with the port meshNetworks gives.
func networkGateways(svc *corev1.Service, clusterID string) []*discoveryv1.NetworkGateway {
	nw := svc.Labels[LabelNetwork]
	if nw == "" {
		var out []*discoveryv1.NetworkGateway
		for _, a := range externalAddresses(svc) {
			out = append(out, &discoveryv1.NetworkGateway{ClusterId: clusterID, Address: a})
		}
		return out
	}
	port := uint32(DefaultGatewayPort)
	if v := svc.Labels[LabelGatewayPort]; v != "" {
		p, err := strconv.ParseUint(v, 10, 16)
		if err != nil || p == 0 {
			return nil
		}
		port = uint32(p)
	}
	if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return uint32(p.Port) == port }) {
		return nil
	}
	var out []*discoveryv1.NetworkGateway
	for _, a := range externalAddresses(svc) {
		out = append(out, &discoveryv1.NetworkGateway{Network: nw, ClusterId: clusterID, Address: a, Port: port})
	}
	return out
}

// externalAddresses are a Service's load balancer addresses (IP or host name) and external IPs.
func externalAddresses(svc *corev1.Service) []string {
	var addrs []string
	if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		for _, in := range svc.Status.LoadBalancer.Ingress {
			if a := cmp.Or(in.IP, in.Hostname); a != "" {
				addrs = append(addrs, a)
			}
		}
	}
	return append(addrs, svc.Spec.ExternalIPs...)
}
