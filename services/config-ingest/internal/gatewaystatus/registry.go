package gatewaystatus

import (
	"cmp"
	"slices"
	"strings"

	networking "istio.io/api/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"

	"sailplane.dev/shared/gatewayapi"
)

// registry answers Translate's service lookups from a snapshot of the cluster's Services and
// ServiceEntries.
type registry struct {
	byHost map[string][]visible
}

type visible struct {
	svc gatewayapi.Service
	ns  string
	// exportTo as a ServiceEntry has it; nil: everywhere.
	exportTo []string
}

var _ gatewayapi.Services = (*registry)(nil)

// serviceEntry is a ServiceEntry's spec and namespace, from an informer or a file.
type serviceEntry struct {
	ns   string
	spec *networking.ServiceEntry
}

// ready, when set, says whether a Service's workloads are ready (Config.ServiceReady); a
// Service it does not know, and every ServiceEntry, counts as ready.
func newRegistry(services []*corev1.Service, entries []serviceEntry, domain string, ready func(ns, name string) (bool, bool)) *registry {
	r := &registry{byHost: map[string][]visible{}}
	for _, s := range services {
		host := s.Name + "." + s.Namespace + ".svc." + domain
		svc := gatewayapi.Service{Hostname: host, Selector: s.Spec.Selector, Ready: true}
		if ready != nil {
			if r, known := ready(s.Namespace, s.Name); known {
				svc.Ready = r
			}
		}
		for _, p := range s.Spec.Ports {
			svc.Ports = append(svc.Ports, gatewayapi.ServicePort{Name: p.Name, Number: uint32(p.Port), Protocol: serviceProtocol(p)})
		}
		for _, ip := range s.Spec.ClusterIPs {
			if ip != "" && ip != corev1.ClusterIPNone {
				svc.Addresses = append(svc.Addresses, ip)
			}
		}
		// What istiod takes for a Service's external addresses: a LoadBalancer's ingress (IP,
		// else host name) and the externalIPs.
		if s.Spec.Type == corev1.ServiceTypeLoadBalancer {
			svc.LoadBalancer = true
			for _, in := range s.Status.LoadBalancer.Ingress {
				if a := cmp.Or(in.IP, in.Hostname); a != "" {
					svc.ExternalAddresses = append(svc.ExternalAddresses, a)
				}
			}
		}
		svc.ExternalAddresses = append(svc.ExternalAddresses, s.Spec.ExternalIPs...)
		r.byHost[host] = append(r.byHost[host], visible{svc: svc, ns: s.Namespace})
	}
	for _, se := range entries {
		for _, host := range se.spec.GetHosts() {
			svc := gatewayapi.Service{Hostname: host, Addresses: slices.Clone(se.spec.GetAddresses()), Ready: true}
			for _, p := range se.spec.GetPorts() {
				svc.Ports = append(svc.Ports, gatewayapi.ServicePort{Name: p.GetName(), Number: p.GetNumber(), Protocol: strings.ToUpper(p.GetProtocol())})
			}
			r.byHost[host] = append(r.byHost[host], visible{svc: svc, ns: se.ns, exportTo: se.spec.GetExportTo()})
		}
	}
	return r
}

// Service returns the first service of that hostname visible from ns: a Kubernetes Service
// everywhere, a ServiceEntry as its exportTo says.
func (r *registry) Service(hostname, ns string) (gatewayapi.Service, bool) {
	for _, v := range r.byHost[hostname] {
		if exported(v.exportTo, v.ns, ns) {
			return v.svc, true
		}
	}
	return gatewayapi.Service{}, false
}

func exported(to []string, owner, ns string) bool {
	if len(to) == 0 {
		return true
	}
	for _, t := range to {
		if t == "*" || t == ns || (t == "." && owner == ns) {
			return true
		}
	}
	return false
}

// serviceProtocol is Istio's protocol of a Service port: its appProtocol, else the prefix of
// its name ("http-web"), else "UnsupportedProtocol" (Istio's name for "detect it").
func serviceProtocol(p corev1.ServicePort) string {
	if p.Protocol == corev1.ProtocolUDP {
		return "UDP"
	}
	if p.AppProtocol != nil {
		switch ap := strings.ToLower(*p.AppProtocol); ap {
		case "kubernetes.io/h2c":
			return "HTTP2"
		case "kubernetes.io/ws", "kubernetes.io/wss":
			return "HTTP"
		default:
			if proto, ok := known(ap); ok {
				return proto
			}
		}
	}
	prefix, _, _ := strings.Cut(p.Name, "-")
	if proto, ok := known(strings.ToLower(prefix)); ok {
		return proto
	}
	return "UnsupportedProtocol"
}

func known(name string) (string, bool) {
	switch name {
	case "http", "http2", "https", "grpc", "grpc-web", "tcp", "tls", "mongo", "redis", "mysql":
		return strings.ToUpper(name), true
	}
	return "", false
}
