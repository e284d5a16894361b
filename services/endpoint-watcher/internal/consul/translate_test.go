package consul

import (
	"testing"

	"github.com/hashicorp/consul/api"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
)

func entry(node, id string, port int, addr string, meta map[string]string, tags []string, checks ...string) *api.ServiceEntry {
	e := &api.ServiceEntry{
		Node:    &api.Node{Node: node, Address: "10.0.0.1", Datacenter: "dc1"},
		Service: &api.AgentService{ID: id, Service: "web", Port: port, Address: addr, Meta: meta, Tags: tags},
	}
	for i, status := range checks {
		e.Checks = append(e.Checks, &api.HealthCheck{CheckID: "check" + string(rune('a'+i)), Status: status})
	}
	return e
}

func TestTranslate(t *testing.T) {
	cfg := &Config{HostSuffix: "service.consul", Namespace: "consul", ClusterID: "c1"}
	svc := func(ports ...*discoveryv1.Port) *discoveryv1.Service {
		return &discoveryv1.Service{Hostname: "web.service.consul", Namespace: "consul", Ports: ports,
			Resolution: discoveryv1.Resolution_STATIC, Registry: "consul", ClusterId: "c1"}
	}
	ep := func(workload, addr string, ports map[string]uint32, labels map[string]string, h discoveryv1.Health) *discoveryv1.Endpoint {
		return &discoveryv1.Endpoint{Address: addr, Ports: ports, Labels: labels, Health: h, ClusterId: "c1",
			Workload: workload, Locality: &discoveryv1.Locality{Region: "dc1"}}
	}
	eps := func(e ...*discoveryv1.Endpoint) *discoveryv1.Endpoints {
		return &discoveryv1.Endpoints{Hostname: "web.service.consul", Namespace: "consul", Endpoints: e}
	}
	healthy, unhealthy := discoveryv1.Health_HEALTHY, discoveryv1.Health_UNHEALTHY
	proxy := entry("n1", "web-proxy", 21000, "", nil, nil)
	proxy.Service.Kind = api.ServiceKindConnectProxy

	tests := []struct {
		name    string
		entries []*api.ServiceEntry
		svc     *discoveryv1.Service
		eps     *discoveryv1.Endpoints
	}{
		{name: "no instances"},
		{name: "only a connect proxy", entries: []*api.ServiceEntry{proxy}},
		{
			name:    "default protocol and node address",
			entries: []*api.ServiceEntry{entry("n1", "web-1", 80, "", nil, nil, api.HealthPassing)},
			svc:     svc(&discoveryv1.Port{Name: "tcp", Number: 80, Protocol: "TCP"}),
			eps:     eps(ep("n1/web-1", "10.0.0.1", map[string]uint32{"tcp": 80}, nil, healthy)),
		},
		{
			name: "protocol meta, labels from tags and meta, sorted endpoints",
			entries: []*api.ServiceEntry{
				entry("n2", "web-2", 8080, "198.18.0.2", map[string]string{"protocol": "GRPC", "v": "meta"}, []string{"v=tag", "a|b", "bare"}),
				entry("n1", "web-1", 8080, "198.18.0.1", map[string]string{"protocol": "grpc"}, nil),
				proxy,
			},
			svc: svc(&discoveryv1.Port{Name: "grpc", Number: 8080, Protocol: "GRPC"}),
			eps: eps(
				ep("n1/web-1", "198.18.0.1", map[string]uint32{"grpc": 8080}, map[string]string{"protocol": "grpc"}, healthy),
				ep("n2/web-2", "198.18.0.2", map[string]uint32{"grpc": 8080},
					map[string]string{"protocol": "GRPC", "v": "meta", "a": "b", "bare": ""}, healthy),
			),
		},
		{
			name: "ports per distinct number, names unique per protocol, first protocol wins",
			entries: []*api.ServiceEntry{
				entry("n1", "a", 81, "198.18.0.1", map[string]string{"protocol": "http"}, nil),
				entry("n1", "b", 82, "198.18.0.1", map[string]string{"protocol": "http"}, nil),
				entry("n1", "c", 90, "198.18.0.1", map[string]string{"protocol": "http2"}, nil),
				entry("n1", "d", 90, "198.18.0.1", map[string]string{"protocol": "tcp"}, nil),
				entry("n1", "e", 0, "198.18.0.1", map[string]string{"protocol": "mongo"}, nil),
			},
			svc: svc(
				&discoveryv1.Port{Name: "http-81", Number: 81, Protocol: "HTTP"},
				&discoveryv1.Port{Name: "http-82", Number: 82, Protocol: "HTTP"},
				&discoveryv1.Port{Name: "http2", Number: 90, Protocol: "HTTP2"},
			),
			eps: eps(
				ep("n1/a", "198.18.0.1", map[string]uint32{"http-81": 81}, map[string]string{"protocol": "http"}, healthy),
				ep("n1/b", "198.18.0.1", map[string]uint32{"http-82": 82}, map[string]string{"protocol": "http"}, healthy),
				ep("n1/c", "198.18.0.1", map[string]uint32{"http2": 90}, map[string]string{"protocol": "http2"}, healthy),
				ep("n1/d", "198.18.0.1", map[string]uint32{"http2": 90}, map[string]string{"protocol": "tcp"}, healthy),
				ep("n1/e", "198.18.0.1", nil, map[string]string{"protocol": "mongo"}, healthy),
			),
		},
		{
			name: "health",
			entries: []*api.ServiceEntry{
				entry("n1", "passing", 80, "198.18.0.1", nil, nil, api.HealthPassing, api.HealthPassing),
				entry("n1", "warning", 80, "198.18.0.2", nil, nil, api.HealthPassing, api.HealthWarning),
				entry("n1", "critical", 80, "198.18.0.3", nil, nil, api.HealthWarning, api.HealthCritical),
				func() *api.ServiceEntry {
					e := entry("n1", "maint", 80, "198.18.0.4", nil, nil, api.HealthPassing)
					e.Checks = append(e.Checks, &api.HealthCheck{CheckID: api.ServiceMaintPrefix + "maint", Status: api.HealthCritical})
					return e
				}(),
			},
			svc: svc(&discoveryv1.Port{Name: "tcp", Number: 80, Protocol: "TCP"}),
			eps: eps(
				ep("n1/critical", "198.18.0.3", map[string]uint32{"tcp": 80}, nil, unhealthy),
				ep("n1/maint", "198.18.0.4", map[string]uint32{"tcp": 80}, nil, unhealthy),
				ep("n1/passing", "198.18.0.1", map[string]uint32{"tcp": 80}, nil, healthy),
				ep("n1/warning", "198.18.0.2", map[string]uint32{"tcp": 80}, nil, healthy),
			),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			gotSvc, gotEps := translate(cfg, "web", tc.entries)
			if !proto.Equal(gotSvc, tc.svc) {
				t.Errorf("Service:\n got %v\nwant %v", prototext.Format(gotSvc), prototext.Format(tc.svc))
			}
			if !proto.Equal(gotEps, tc.eps) {
				t.Errorf("Endpoints:\n got %v\nwant %v", prototext.Format(gotEps), prototext.Format(tc.eps))
			}
		})
	}
}
