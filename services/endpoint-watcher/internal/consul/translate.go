package consul

import (
	"cmp"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/hashicorp/consul/api"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
)

// Registry is the value of Service.registry for everything this package produces.
const Registry = "consul"

// ProtocolMetaKey is the service meta key that carries the instance port's protocol, as in
// Istio's Consul registry.
const ProtocolMetaKey = "protocol"

// protocols maps the values of the "protocol" meta (case-insensitive) to Istio protocol names.
// Anything else, or no meta, is TCP: an unknown protocol must not make Envoy parse bytes as HTTP.
var protocols = map[string]string{
	"tcp":   "TCP",
	"http":  "HTTP",
	"http2": "HTTP2",
	"grpc":  "GRPC",
	"https": "HTTPS",
	"tls":   "TLS",
	"udp":   "UDP",
}

func protocolOf(meta map[string]string) string {
	if p, ok := protocols[strings.ToLower(strings.TrimSpace(meta[ProtocolMetaKey]))]; ok {
		return p
	}
	return "TCP"
}

// translate turns the instances of one Consul service, as the health endpoint returns them, into
// a Service and its Endpoints. It returns nils when the service has no instance left that the
// mesh can route to, so the caller deletes both.
func translate(cfg *Config, name string, entries []*api.ServiceEntry) (*discoveryv1.Service, *discoveryv1.Endpoints) {
	// Sorted so that every choice below (first protocol of a port, endpoint order) is stable
	// across queries: an unchanged catalog must produce an equal resource.
	inst := make([]*api.ServiceEntry, 0, len(entries))
	for _, e := range entries {
		// Connect proxies and gateways are Consul's own data plane, not workloads of this service.
		if e == nil || e.Service == nil || e.Node == nil || e.Service.Kind != api.ServiceKindTypical {
			continue
		}
		inst = append(inst, e)
	}
	if len(inst) == 0 {
		return nil, nil
	}
	slices.SortFunc(inst, func(a, b *api.ServiceEntry) int {
		return cmp.Or(cmp.Compare(a.Node.Node, b.Node.Node), cmp.Compare(a.Service.ID, b.Service.ID))
	})

	// One service port per distinct instance port; when instances disagree on a port's
	// protocol the first one (in the order above) wins.
	protoOf := map[int]string{}
	for _, e := range inst {
		if e.Service.Port <= 0 {
			continue
		}
		if _, ok := protoOf[e.Service.Port]; !ok {
			protoOf[e.Service.Port] = protocolOf(e.Service.Meta)
		}
	}
	numbers := slices.Sorted(maps.Keys(protoOf))
	perProto := map[string]int{}
	for _, n := range numbers {
		perProto[protoOf[n]]++
	}
	hostname := name + "." + cfg.HostSuffix
	svc := &discoveryv1.Service{
		Hostname:   hostname,
		Namespace:  cfg.Namespace,
		Resolution: discoveryv1.Resolution_STATIC,
		Registry:   Registry,
		ClusterId:  cfg.ClusterID,
	}
	portName := map[int]string{}
	for _, n := range numbers {
		p := protoOf[n]
		// Named by protocol as Istio's Consul registry did; the number is appended only when
		// two ports share a protocol, so that names stay unique.
		pn := strings.ToLower(p)
		if perProto[p] > 1 {
			pn += "-" + strconv.Itoa(n)
		}
		portName[n] = pn
		svc.Ports = append(svc.Ports, &discoveryv1.Port{Name: pn, Number: uint32(n), Protocol: p})
	}

	eps := &discoveryv1.Endpoints{Hostname: hostname, Namespace: cfg.Namespace}
	for _, e := range inst {
		ep := &discoveryv1.Endpoint{
			Address:   cmp.Or(e.Service.Address, e.Node.Address),
			Labels:    labelsOf(e.Service),
			Health:    healthOf(e.Checks),
			ClusterId: cfg.ClusterID,
			Workload:  e.Node.Node + "/" + e.Service.ID,
		}
		if e.Service.Port > 0 {
			ep.Ports = map[string]uint32{portName[e.Service.Port]: uint32(e.Service.Port)}
		}
		if dc := cmp.Or(e.Node.Datacenter, e.Service.Datacenter); dc != "" {
			// Istio's Consul registry used the datacenter as the locality.
			ep.Locality = &discoveryv1.Locality{Region: dc}
		}
		eps.Endpoints = append(eps.Endpoints, ep)
	}
	return svc, eps
}

// labelsOf merges tags and service meta into endpoint labels. A tag "k=v" (or Istio's "k|v")
// becomes k=v and a bare tag becomes k="" so selectors can test for its presence; meta is
// explicitly key/value, so it wins over a tag with the same key.
func labelsOf(s *api.AgentService) map[string]string {
	if len(s.Tags)+len(s.Meta) == 0 {
		return nil
	}
	out := make(map[string]string, len(s.Tags)+len(s.Meta))
	for _, tag := range s.Tags {
		k, v, ok := strings.Cut(tag, "=")
		if !ok {
			k, v, _ = strings.Cut(tag, "|")
		}
		if k != "" {
			out[k] = v
		}
	}
	maps.Copy(out, s.Meta)
	return out
}

// healthOf follows Consul's DNS interface with its default only_passing=false: an instance is
// routable unless one of its checks, or its node's, is critical or in maintenance. Warnings are
// HEALTHY (they mean degraded, not down).
func healthOf(checks api.HealthChecks) discoveryv1.Health {
	for _, c := range checks {
		if c == nil {
			continue
		}
		if c.CheckID == api.NodeMaint || strings.HasPrefix(c.CheckID, api.ServiceMaintPrefix) ||
			c.Status == api.HealthCritical || c.Status == api.HealthMaint {
			return discoveryv1.Health_UNHEALTHY
		}
	}
	return discoveryv1.Health_HEALTHY
}
