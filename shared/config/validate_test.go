package config

import (
	"maps"
	"slices"
	"strings"
	"testing"
)

// doc builds a YAML document of kind from a spec body written at column 0.
func doc(kind, spec string) string {
	group := "networking.istio.io/v1"
	switch kind {
	case "PeerAuthentication", "AuthorizationPolicy", "RequestAuthentication":
		group = "security.istio.io/v1"
	}
	var b strings.Builder
	b.WriteString("apiVersion: " + group + "\nkind: " + kind + "\nmetadata:\n  name: x\n  namespace: ns\nspec:\n")
	for _, l := range strings.Split(strings.TrimSpace(spec), "\n") {
		b.WriteString("  " + l + "\n")
	}
	return b.String()
}

type vcase struct {
	name string
	kind string
	spec string
	// want lists the field paths of the expected errors; nil means valid.
	want []string
	// warn lists the field paths of the expected warnings.
	warn []string
}

func runValidate(t *testing.T, cases []vcase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.kind+"/"+tc.name, func(t *testing.T) {
			cfgs, errs := ParseYAML("f.yaml", []byte(doc(tc.kind, tc.spec)), "default")
			if len(errs) > 0 {
				t.Fatalf("parse: %v", errs)
			}
			if len(cfgs) != 1 {
				t.Fatalf("got %d configs", len(cfgs))
			}
			warnings, err := Validate(cfgs[0])
			var warned []string
			for _, w := range warnings {
				warned = append(warned, w.Field)
				if w.Kind != tc.kind || w.Name != "x" || w.File != "f.yaml" || !strings.HasPrefix(w.String(), "f.yaml: document 1: "+tc.kind+" ns/x: "+w.Field) {
					t.Errorf("warning lacks identity: %q", w.String())
				}
			}
			slices.Sort(warned)
			if !slices.Equal(warned, tc.warn) {
				t.Errorf("warnings = %q, want %q", warned, tc.warn)
			}
			var got []string
			for _, e := range Errors(err) {
				got = append(got, e.Field)
				if e.Kind != tc.kind || e.Namespace != "ns" || e.Name != "x" || e.File != "f.yaml" || e.Doc != 1 {
					t.Errorf("error lacks identity: %+v", e)
				}
				if !strings.Contains(e.Error(), "f.yaml: document 1: "+tc.kind+" ns/x: "+e.Field+": ") {
					t.Errorf("message %q does not name file, doc, resource and field", e.Error())
				}
			}
			slices.Sort(got)
			want := slices.Clone(tc.want)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("fields = %q, want %q\nerror: %v", got, want, err)
			}
		})
	}
}

func TestValidateVirtualService(t *testing.T) {
	const route = "http:\n- route:\n  - destination:\n      host: reviews\n"
	runValidate(t, []vcase{
		{name: "valid", kind: "VirtualService", spec: "hosts: [reviews, '*.example.com', reviews.ns.svc.cluster.local]\n" + route},
		{name: "delegate without hosts", kind: "VirtualService", spec: route},
		{name: "no hosts with gateway", kind: "VirtualService", spec: "gateways: [gw]\n" + route, want: []string{"spec.hosts"}},
		{name: "bad host", kind: "VirtualService", spec: "hosts: [bad_host!]\n" + route, want: []string{"spec.hosts[0]"}},
		{name: "star on mesh", kind: "VirtualService", spec: "hosts: ['*']\n" + route, want: []string{"spec.hosts[0]"}},
		{name: "star on gateway", kind: "VirtualService", spec: "hosts: ['*']\ngateways: [istio-system/gw]\n" + route},
		{name: "bad gateway", kind: "VirtualService", spec: "hosts: [a]\ngateways: [bad_ns/gw, ok/gw, mesh]\n" + route, want: []string{"spec.gateways[0]"}},
		{name: "no routes", kind: "VirtualService", spec: "hosts: [a]", want: []string{"spec"}},
		{name: "empty http route", kind: "VirtualService", spec: "hosts: [a]\nhttp:\n- name: r\n", want: []string{"spec.http[0]"}},
		{name: "route and redirect", kind: "VirtualService", spec: "hosts: [a]\n" + route + "  redirect: {uri: /x}\n", want: []string{"spec.http[0]"}},
		{name: "direct response", kind: "VirtualService", spec: "hosts: [a]\nhttp:\n- directResponse: {status: 503}\n"},
		{name: "bad direct response", kind: "VirtualService", spec: "hosts: [a]\nhttp:\n- directResponse: {status: 99}\n", want: []string{"spec.http[0].directResponse.status"}},
		{name: "bad redirect", kind: "VirtualService", spec: "hosts: [a]\nhttp:\n- redirect: {uri: /x, redirectCode: 200, port: 70000}\n",
			want: []string{"spec.http[0].redirect.redirectCode", "spec.http[0].redirect.port"}},
		{name: "destination without host", kind: "VirtualService", spec: "hosts: [a]\nhttp:\n- route:\n  - destination: {subset: v1}\n", want: []string{"spec.http[0].route[0].destination.host"}},
		{name: "missing destination", kind: "VirtualService", spec: "hosts: [a]\nhttp:\n- route:\n  - weight: 100\n", want: []string{"spec.http[0].route[0].destination"}},
		{name: "weights sum 100", kind: "VirtualService", spec: "hosts: [a]\nhttp:\n- route:\n  - destination: {host: a, subset: v1}\n    weight: 75\n  - destination: {host: a, subset: v2}\n    weight: 25\n"},
		{name: "weights all zero", kind: "VirtualService", spec: "hosts: [a]\nhttp:\n- route:\n  - destination: {host: a, subset: v1}\n  - destination: {host: a, subset: v2}\n", want: []string{"spec.http[0].route"}},
		{name: "tcp weights all zero", kind: "VirtualService", spec: "hosts: [a]\ntcp:\n- route:\n  - destination: {host: a, subset: v1}\n  - destination: {host: a, subset: v2}\n", want: []string{"spec.tcp[0].route"}},
		{name: "lone destination without weight", kind: "VirtualService", spec: "hosts: [a]\nhttp:\n- route:\n  - destination: {host: a}\n"},
		{name: "relative weights", kind: "VirtualService", spec: "hosts: [a]\nhttp:\n- route:\n  - destination: {host: a}\n    weight: 1\n  - destination: {host: b}\n    weight: 3\n"},
		{name: "weight over 100", kind: "VirtualService", spec: "hosts: [a]\nhttp:\n- route:\n  - destination: {host: a}\n    weight: 50\n  - destination: {host: b}\n    weight: 150\n"},
		{name: "negative weight", kind: "VirtualService", spec: "hosts: [a]\nhttp:\n- route:\n  - destination: {host: a}\n    weight: -1\n", want: []string{"spec.http[0].route[0].weight"}},
		{name: "bad port", kind: "VirtualService", spec: "hosts: [a]\nhttp:\n- route:\n  - destination: {host: a, port: {number: 0}}\n", want: []string{"spec.http[0].route[0].destination.port.number"}},
		{name: "bad subset", kind: "VirtualService", spec: "hosts: [a]\nhttp:\n- route:\n  - destination: {host: a, subset: V_1}\n", want: []string{"spec.http[0].route[0].destination.subset"}},
		{name: "empty uri match", kind: "VirtualService", spec: "hosts: [a]\nhttp:\n- match:\n  - uri: {}\n  - uri: {prefix: ''}\n  route:\n  - destination: {host: a}\n"},
		{name: "empty method prefix", kind: "VirtualService", spec: "hosts: [a]\nhttp:\n- match:\n  - method: {prefix: ''}\n  route:\n  - destination: {host: a}\n", want: []string{"spec.http[0].match[0].method.prefix"}},
		{name: "header presence", kind: "VirtualService", spec: "hosts: [a]\nhttp:\n- match:\n  - headers: {end-user: {}, x-v: {exact: v2}}\n  route:\n  - destination: {host: a}\n"},
		{name: "uppercase header", kind: "VirtualService", spec: "hosts: [a]\nhttp:\n- match:\n  - headers: {End-User: {exact: j}, ':authority': {prefix: a}}\n  route:\n  - destination: {host: a}\n"},
		{name: "bad header name", kind: "VirtualService", spec: "hosts: [a]\nhttp:\n- match:\n  - headers: {'end user': {exact: j}}\n  route:\n  - destination: {host: a}\n", want: []string{"spec.http[0].match[0].headers[end user]"}},
		{name: "jwt claim on mesh", kind: "VirtualService", spec: "hosts: [a]\nhttp:\n- match:\n  - headers: {'@request.auth.claims.group': {exact: g}}\n  route:\n  - destination: {host: a}\n", want: []string{"spec.http[0].match[0].headers[@request.auth.claims.group]"}},
		{name: "jwt claim on gateway", kind: "VirtualService", spec: "hosts: [a]\ngateways: [gw]\nhttp:\n- match:\n  - headers: {'@request.auth.claims.group': {exact: g}}\n  route:\n  - destination: {host: a}\n"},
		{name: "header operations", kind: "VirtualService", spec: "hosts: [a]\n" + route + "  headers:\n    request: {set: {':authority': b, ':path': /x}, remove: [host]}\n    response: {add: {x-ok: v}}\n",
			want: []string{"spec.http[0].headers.request.set[:path]", "spec.http[0].headers.request.remove[0]"}},
		{name: "bad match port", kind: "VirtualService", spec: "hosts: [a]\nhttp:\n- match:\n  - port: 70000\n  route:\n  - destination: {host: a}\n", want: []string{"spec.http[0].match[0].port"}},
		{name: "retries", kind: "VirtualService", spec: "hosts: [a]\n" + route + "  retries: {attempts: -1, perTryTimeout: 0s}\n  timeout: -1s\n",
			want: []string{"spec.http[0].retries.attempts", "spec.http[0].retries.perTryTimeout", "spec.http[0].timeout"}},
		{name: "good retries", kind: "VirtualService", spec: "hosts: [a]\n" + route + "  retries: {attempts: 3, perTryTimeout: 2s, retryOn: 'gateway-error,connect-failure'}\n  timeout: 10s\n"},
		{name: "fault", kind: "VirtualService", spec: "hosts: [a]\n" + route + "  fault:\n    delay: {percentage: {value: 101}, fixedDelay: 5s}\n    abort: {percentage: {value: -1}, httpStatus: 700}\n",
			want: []string{"spec.http[0].fault.delay.percentage.value", "spec.http[0].fault.abort.percentage.value", "spec.http[0].fault.abort.httpStatus"}},
		{name: "fault without delay type", kind: "VirtualService", spec: "hosts: [a]\n" + route + "  fault:\n    delay: {percentage: {value: 10}}\n", want: []string{"spec.http[0].fault.delay.fixedDelay"}},
		{name: "good fault", kind: "VirtualService", spec: "hosts: [a]\n" + route + "  fault:\n    abort: {percentage: {value: 10}, httpStatus: 503}\n"},
		{name: "mirror", kind: "VirtualService", spec: "hosts: [a]\n" + route + "  mirror: {host: ''}\n  mirrorPercentage: {value: 200}\n",
			want: []string{"spec.http[0].mirror.host", "spec.http[0].mirrorPercentage.value"}},
		{name: "delegate", kind: "VirtualService", spec: "hosts: [a]\nhttp:\n- delegate: {name: ''}\n", want: []string{"spec.http[0].delegate.name"}},
		{name: "tcp", kind: "VirtualService", spec: "hosts: [a]\ntcp:\n- match:\n  - port: 0\n  route: []\n", want: []string{"spec.tcp[0].route"}},
		{name: "good tcp", kind: "VirtualService", spec: "hosts: [a]\ntcp:\n- match:\n  - port: 27017\n  route:\n  - destination: {host: mongo, port: {number: 5555}}\n"},
		{name: "tls without sni", kind: "VirtualService", spec: "hosts: [a]\ntls:\n- match:\n  - port: 443\n  route:\n  - destination: {host: a}\n", want: []string{"spec.tls[0].match[0].sniHosts"}},
		{name: "overlapping hosts", kind: "VirtualService", spec: "hosts: ['*.example.com', api.example.com]\n" + route, want: []string{"spec.hosts[0]"}},
		{name: "rule after catch-all", kind: "VirtualService", spec: "hosts: [a]\n" + route + "- match:\n  - uri: {prefix: /v2}\n  route:\n  - destination: {host: b}\n", warn: []string{"spec.http[1]"}},
		{name: "duplicate match", kind: "VirtualService", spec: "hosts: [a]\nhttp:\n- match:\n  - uri: {exact: /x}\n  route:\n  - destination: {host: a}\n- match:\n  - {name: again, uri: {exact: /x}}\n  route:\n  - destination: {host: b}\n",
			warn: []string{"spec.http[1]", "spec.http[1].match[0]"}},
		{name: "covered prefix", kind: "VirtualService", spec: "hosts: [a]\nhttp:\n- match:\n  - uri: {prefix: /api}\n  route:\n  - destination: {host: a}\n- match:\n  - uri: {prefix: /api/v1}\n  - uri: {prefix: /other}\n  route:\n  - destination: {host: b}\n",
			warn: []string{"spec.http[1].match[0]"}},
		{name: "prefix with other method", kind: "VirtualService", spec: "hosts: [a]\nhttp:\n- match:\n  - uri: {prefix: /api}\n  route:\n  - destination: {host: a}\n- match:\n  - uri: {prefix: /api/v1}\n    method: {exact: POST}\n  route:\n  - destination: {host: b}\n"},
		{name: "tcp after catch-all", kind: "VirtualService", spec: "hosts: [a]\ntcp:\n- route:\n  - destination: {host: a}\n- route:\n  - destination: {host: b}\n", warn: []string{"spec.tcp[1]"}},
		{name: "legacy gateway name", kind: "VirtualService", spec: "hosts: [a]\ngateways: [gw.istio-system]\n" + route, warn: []string{"spec.gateways[0]"}},
		{name: "exportTo", kind: "VirtualService", spec: "hosts: [a]\nexportTo: ['*', 'bad_ns']\n" + route, want: []string{"spec.exportTo[1]", "spec.exportTo"}},
	})
}

func TestValidateDestinationRule(t *testing.T) {
	runValidate(t, []vcase{
		{name: "valid", kind: "DestinationRule", spec: `
host: reviews
trafficPolicy:
  loadBalancer: {simple: LEAST_REQUEST}
  connectionPool:
    tcp: {maxConnections: 100, connectTimeout: 30ms}
    http: {http1MaxPendingRequests: 10, maxRequestsPerConnection: 1}
  outlierDetection: {consecutive5xxErrors: 7, interval: 5m, baseEjectionTime: 15m, maxEjectionPercent: 50}
  tls: {mode: ISTIO_MUTUAL}
  portLevelSettings:
  - port: {number: 80}
    loadBalancer:
      consistentHash: {httpCookie: {name: user, ttl: 0s}}
subsets:
- name: v1
  labels: {version: v1}
- name: v2
  labels: {version: v2}
  trafficPolicy:
    loadBalancer:
      consistentHash: {httpHeaderName: x-user, maglev: {tableSize: 65537}}
`},
		{name: "no host", kind: "DestinationRule", spec: "subsets: []", want: []string{"spec.host"}},
		{name: "bad host", kind: "DestinationRule", spec: "host: 'a..b'", want: []string{"spec.host"}},
		{name: "subsets", kind: "DestinationRule", spec: `
host: r
subsets:
- name: v1
  labels: {version: v1}
- name: v1
  labels: {version: v2}
- labels: {version: v3}
- name: v4
  labels: {version: 'bad value!'}
`, want: []string{"spec.subsets[1].name", "spec.subsets[2].name", "spec.subsets[3].labels[version]"}},
		{name: "consistent hash", kind: "DestinationRule", spec: `
host: r
trafficPolicy:
  loadBalancer:
    consistentHash: {httpHeaderName: '', minimumRingSize: 10, maglev: {tableSize: 100}}
`, want: []string{"spec.trafficPolicy.loadBalancer.consistentHash.httpHeaderName", "spec.trafficPolicy.loadBalancer.consistentHash.minimumRingSize", "spec.trafficPolicy.loadBalancer.consistentHash.maglev.tableSize"}},
		{name: "consistent hash without key", kind: "DestinationRule", spec: "host: r\ntrafficPolicy:\n  loadBalancer:\n    consistentHash: {}\n",
			want: []string{"spec.trafficPolicy.loadBalancer.consistentHash"}},
		{name: "connection pool", kind: "DestinationRule", spec: `
host: r
trafficPolicy:
  connectionPool:
    tcp: {maxConnections: -1, connectTimeout: 0s}
    http: {http2MaxRequests: -5, maxRetries: -1}
`, want: []string{"spec.trafficPolicy.connectionPool.tcp.maxConnections", "spec.trafficPolicy.connectionPool.tcp.connectTimeout", "spec.trafficPolicy.connectionPool.http.http2MaxRequests", "spec.trafficPolicy.connectionPool.http.maxRetries"}},
		{name: "outlier detection", kind: "DestinationRule", spec: `
host: r
trafficPolicy:
  outlierDetection: {maxEjectionPercent: 101, minHealthPercent: -1, interval: 0s}
`, want: []string{"spec.trafficPolicy.outlierDetection.maxEjectionPercent", "spec.trafficPolicy.outlierDetection.minHealthPercent", "spec.trafficPolicy.outlierDetection.interval"}},
		{name: "port level", kind: "DestinationRule", spec: `
host: r
trafficPolicy:
  portLevelSettings:
  - port: {number: 80}
  - port: {number: 80}
  - tls: {mode: MUTUAL}
`, want: []string{"spec.trafficPolicy.portLevelSettings[1].port.number", "spec.trafficPolicy.portLevelSettings[2].port", "spec.trafficPolicy.portLevelSettings[2].tls.clientCertificate", "spec.trafficPolicy.portLevelSettings[2].tls.privateKey"}},
		{name: "warmup", kind: "DestinationRule", spec: "host: r\ntrafficPolicy:\n  loadBalancer:\n    simple: ROUND_ROBIN\n    warmup: {duration: 60s, minimumPercent: 10, aggression: 2}\n"},
		{name: "bad warmup", kind: "DestinationRule", spec: "host: r\ntrafficPolicy:\n  loadBalancer:\n    simple: ROUND_ROBIN\n    warmup: {minimumPercent: 101, aggression: 0}\n",
			want: []string{"spec.trafficPolicy.loadBalancer.warmup.duration", "spec.trafficPolicy.loadBalancer.warmup.minimumPercent", "spec.trafficPolicy.loadBalancer.warmup.aggression"}},
		{name: "mutual with credential", kind: "DestinationRule", spec: "host: r\ntrafficPolicy:\n  tls: {mode: MUTUAL, credentialName: c}\n"},
		{name: "subset policy", kind: "DestinationRule", spec: "host: r\nsubsets:\n- name: a\n  trafficPolicy:\n    outlierDetection: {maxEjectionPercent: 200}\n",
			want: []string{"spec.subsets[0].trafficPolicy.outlierDetection.maxEjectionPercent"}},
	})
}

func TestValidateServiceEntry(t *testing.T) {
	runValidate(t, []vcase{
		{name: "valid dns", kind: "ServiceEntry", spec: "hosts: [api.example.com]\nports:\n- {number: 443, name: https, protocol: TLS}\nresolution: DNS\nlocation: MESH_EXTERNAL\n"},
		{name: "valid static", kind: "ServiceEntry", spec: "hosts: [db.internal]\naddresses: [10.0.0.0/24]\nports:\n- {number: 5432, name: pg, protocol: TCP}\nresolution: STATIC\nendpoints:\n- address: 10.0.0.5\n  ports: {pg: 15432}\n"},
		{name: "valid selector", kind: "ServiceEntry", spec: "hosts: [vm.internal]\nports:\n- {number: 80, name: http}\nresolution: STATIC\nworkloadSelector:\n  labels: {app: vm}\n"},
		{name: "no hosts", kind: "ServiceEntry", spec: "ports:\n- {number: 80, name: http}\n", want: []string{"spec.hosts"}, warn: []string{"spec.ports[0]"}},
		{name: "star host", kind: "ServiceEntry", spec: "hosts: ['*']\n", want: []string{"spec.hosts[0]"}},
		{name: "ports", kind: "ServiceEntry", spec: "hosts: [a.com]\nports:\n- {number: 80, name: http}\n- {number: 80, name: http}\n- {number: 0, name: x}\n- {number: 81}\n- {number: 82, name: yy, protocol: FOO}\n",
			want: []string{"spec.ports[1].number", "spec.ports[1].name", "spec.ports[2].number", "spec.ports[3].name", "spec.ports[4].protocol"},
			warn: []string{"spec.ports[0]", "spec.ports[1]", "spec.ports[2]", "spec.ports[3]"}},
		{name: "bad address", kind: "ServiceEntry", spec: "hosts: [a.com]\naddresses: [not-an-ip, 10.0.0.0/40]\n", want: []string{"spec.addresses[0]", "spec.addresses[1]"}},
		{name: "static without endpoints", kind: "ServiceEntry", spec: "hosts: [a.com]\nresolution: STATIC\n"},
		{name: "several hosts on tcp", kind: "ServiceEntry", spec: "hosts: [a.com, b.com]\nports:\n- {number: 443, name: tls, protocol: TLS}\n- {number: 5432, name: pg, protocol: TCP}\nresolution: DNS\n", want: []string{"spec.ports[1].protocol"}},
		{name: "partial wildcard", kind: "ServiceEntry", spec: "hosts: ['*x.com']\nresolution: NONE\n", warn: []string{"spec.hosts[0]"}},
		{name: "tcp without address, allocated", kind: "ServiceEntry", spec: "hosts: [a.com]\nports:\n- {number: 22, name: ssh, protocol: TCP}\nresolution: DNS\n"},
		{name: "endpoint port not declared", kind: "ServiceEntry", spec: "hosts: [a.com]\nresolution: STATIC\nendpoints:\n- {address: 1.1.1.1, ports: {http: 80}}\n", want: []string{"spec.endpoints[0].ports[http]"}},
		{name: "static with hostname endpoint", kind: "ServiceEntry", spec: "hosts: [a.com]\nresolution: STATIC\nendpoints:\n- address: foo.com\n", want: []string{"spec.endpoints[0].address"}},
		{name: "selector and endpoints", kind: "ServiceEntry", spec: "hosts: [a.com]\nresolution: STATIC\nworkloadSelector: {labels: {app: a}}\nendpoints:\n- address: 1.2.3.4\n", want: []string{"spec.workloadSelector"}},
		{name: "none with endpoints", kind: "ServiceEntry", spec: "hosts: [a.com]\nresolution: NONE\nendpoints:\n- address: 1.2.3.4\n", want: []string{"spec.endpoints"}},
		{name: "dns wildcard", kind: "ServiceEntry", spec: "hosts: ['*.a.com']\nresolution: DNS\naddresses: [10.0.0.0/8]\n", want: []string{"spec.hosts[0]", "spec.addresses"}},
		{name: "dns round robin", kind: "ServiceEntry", spec: "hosts: [a.com]\nresolution: DNS_ROUND_ROBIN\nendpoints:\n- address: a.com\n- address: b.com\n", want: []string{"spec.endpoints"}},
		{name: "dns bad endpoint", kind: "ServiceEntry", spec: "hosts: [a.com]\nresolution: DNS\nendpoints:\n- address: 'bad host'\n", want: []string{"spec.endpoints[0].address"}},
		{name: "endpoint port names", kind: "ServiceEntry", spec: "hosts: [a.com]\nports:\n- {number: 80, name: http}\nresolution: STATIC\nendpoints:\n- address: 1.1.1.1\n  ports: {grpc: 90, http: 0}\n",
			want: []string{"spec.endpoints[0].ports[grpc]", "spec.endpoints[0].ports[http]"}},
	})
}

func TestValidateWorkloadEntryAndGroup(t *testing.T) {
	runValidate(t, []vcase{
		{name: "valid", kind: "WorkloadEntry", spec: "address: 10.1.2.3\nports: {http: 8080}\nlabels: {app: vm}\nserviceAccount: vm-sa\n"},
		{name: "network only", kind: "WorkloadEntry", spec: "network: net2\n", warn: []string{"spec.address"}},
		{name: "hostname", kind: "WorkloadEntry", spec: "address: vm1.example.com\n"},
		{name: "no address", kind: "WorkloadEntry", spec: "ports: {http: 80}\n", want: []string{"spec.address"}},
		{name: "bad address and port", kind: "WorkloadEntry", spec: "address: 'a b'\nports: {http: 70000}\n", want: []string{"spec.address", "spec.ports[http]"}},
		{name: "group valid", kind: "WorkloadGroup", spec: "metadata: {labels: {app: vm}}\ntemplate: {ports: {http: 80}, serviceAccount: sa}\n"},
		{name: "group with address", kind: "WorkloadGroup", spec: "template: {address: 1.2.3.4}\n"},
		{name: "group probe", kind: "WorkloadGroup", spec: "template: {}\nprobe:\n  periodSeconds: -1\n  httpGet: {port: 0, scheme: FTP, httpHeaders: [{name: 'bad header', value: v}, {name: X-Ok, value: v}]}\n",
			want: []string{"spec.probe.periodSeconds", "spec.probe.httpGet.port", "spec.probe.httpGet.scheme", "spec.probe.httpGet.httpHeaders[0].name"}},
		{name: "group probe without method", kind: "WorkloadGroup", spec: "template: {}\nprobe: {periodSeconds: 5}\n", want: []string{"spec.probe"}},
		{name: "group tcp probe", kind: "WorkloadGroup", spec: "template: {}\nprobe: {tcpSocket: {port: 70000}}\n", want: []string{"spec.probe.tcpSocket.port"}},
		{name: "unix socket", kind: "WorkloadEntry", spec: "address: unix:///var/run/app.sock\n"},
		{name: "abstract unix socket", kind: "WorkloadEntry", spec: "address: unix://@app\n"},
		{name: "relative unix socket with ports", kind: "WorkloadEntry", spec: "address: unix://app.sock\nports: {http: 80}\n", want: []string{"spec.address", "spec.ports"}},
		{name: "unix socket directory", kind: "WorkloadEntry", spec: "address: unix:///var/run/\n", want: []string{"spec.address"}},
		{name: "bad port name", kind: "WorkloadEntry", spec: "address: 1.2.3.4\nports: {Http_1: 80}\n", want: []string{"spec.ports[Http_1]"}},
		{name: "group without template", kind: "WorkloadGroup", spec: "metadata: {labels: {app: vm}}\n", want: []string{"spec.template"}},
	})
}

func TestValidateGateway(t *testing.T) {
	runValidate(t, []vcase{
		{name: "valid", kind: "Gateway", spec: `
selector: {istio: ingressgateway}
servers:
- port: {number: 80, name: http, protocol: HTTP}
  hosts: ['*']
  tls: {httpsRedirect: true}
- port: {number: 443, name: https, protocol: HTTPS}
  hosts: [bookinfo/reviews.example.com, '*/*.example.com']
  tls: {mode: SIMPLE, credentialName: cert}
`},
		{name: "no servers", kind: "Gateway", spec: "selector: {istio: ingressgateway}\n", want: []string{"spec.servers"}},
		{name: "server problems", kind: "Gateway", spec: `
servers:
- hosts: [a.com]
- port: {number: 0, protocol: HTTP}
- port: {number: 443, protocol: HTTPS}
  hosts: [a.com]
- port: {number: 8443, protocol: HTTPS}
  hosts: ['BAD_NS/a.com']
  tls: {mode: MUTUAL, serverCertificate: /c, privateKey: /k}
- port: {number: 81, protocol: SOAP}
  hosts: [a.com]
`, want: []string{"spec.servers[0].port", "spec.servers[1].port.number", "spec.servers[1].port.name", "spec.servers[1].hosts", "spec.servers[2].port.name", "spec.servers[2].tls",
			"spec.servers[3].port.name", "spec.servers[3].hosts[0]", "spec.servers[3].tls.caCertificates", "spec.servers[4].port.name", "spec.servers[4].port.protocol"}},
		{name: "duplicate port names", kind: "Gateway", spec: `
servers:
- port: {number: 80, name: http, protocol: HTTP}
  hosts: ['*']
- port: {number: 8080, name: http, protocol: HTTP}
  hosts: ['*']
`, want: []string{"spec.servers[1].port.name"}},
		{name: "https redirect on tcp", kind: "Gateway", spec: `
servers:
- port: {number: 31400, name: tcp, protocol: TCP}
  hosts: ['*']
  tls: {httpsRedirect: true}
`, warn: []string{"spec.servers[0].tls.httpsRedirect"}},
	})
}

func TestValidateSidecar(t *testing.T) {
	runValidate(t, []vcase{
		{name: "valid", kind: "Sidecar", spec: `
workloadSelector: {labels: {app: ratings}}
ingress:
- port: {number: 9080, protocol: HTTP, name: http}
  defaultEndpoint: 127.0.0.1:8080
egress:
- port: {number: 9080, protocol: HTTP, name: http}
  hosts: [prod-us1/*]
- hosts: [istio-system/*, ./*, '*/foo.com']
`},
		{name: "problems", kind: "Sidecar", spec: `
ingress:
- defaultEndpoint: 1.2.3.4:80
- port: {number: 70000}
  defaultEndpoint: 127.0.0.1:8080
egress:
- hosts: [foo.com]
- hosts: []
`, want: []string{"spec.ingress[0].port", "spec.ingress[0].defaultEndpoint", "spec.ingress[1].port.number", "spec.egress[0].hosts[0]", "spec.egress[1].port", "spec.egress[1].hosts"}},
		{name: "empty", kind: "Sidecar", spec: "workloadSelector: {labels: {app: a}}\n", want: []string{"spec"}},
		{name: "selector without labels", kind: "Sidecar", spec: "workloadSelector: {}\noutboundTrafficPolicy: {mode: REGISTRY_ONLY}\n", warn: []string{"spec.workloadSelector"}},
	})
}

func TestValidateSecurity(t *testing.T) {
	runValidate(t, []vcase{
		{name: "valid", kind: "PeerAuthentication", spec: "selector: {matchLabels: {app: a}}\nmtls: {mode: STRICT}\nportLevelMtls:\n  8080: {mode: DISABLE}\n"},
		{name: "port level without selector", kind: "PeerAuthentication", spec: "portLevelMtls:\n  0: {mode: DISABLE}\n", want: []string{"spec.portLevelMtls", "spec.portLevelMtls[0]"}},
		{name: "empty port level", kind: "PeerAuthentication", spec: "selector: {matchLabels: {app: a}}\nportLevelMtls: {}\n", want: []string{"spec.portLevelMtls"}},
		{name: "selector without labels", kind: "PeerAuthentication", spec: "selector: {}\nmtls: {mode: STRICT}\n", warn: []string{"spec.selector"}},
		{name: "valid", kind: "AuthorizationPolicy", spec: `
selector: {matchLabels: {app: httpbin}}
action: ALLOW
rules:
- from:
  - source: {principals: [cluster.local/ns/default/sa/sleep], ipBlocks: [10.0.0.0/8]}
  to:
  - operation: {methods: [GET], ports: ['8080'], paths: ['/api/{*}/items/{**}']}
  when:
  - key: request.auth.claims[iss]
    values: [https://accounts.google.com]
`},
		{name: "allow nothing", kind: "AuthorizationPolicy", spec: "{}"},
		{name: "trust domains only", kind: "AuthorizationPolicy", spec: "rules:\n- from:\n  - source: {trustDomains: [td1.example.com]}\n  - source: {notTrustDomains: ['*.example.org']}\n"},
		{name: "problems", kind: "AuthorizationPolicy", spec: `
action: CUSTOM
rules:
- from:
  - source: {}
  - source: {ipBlocks: [bad]}
  to:
  - operation: {ports: ['http', '0'], paths: ['/a/{**}/{*}']}
  when:
  - key: ''
  - key: request.headers
    values: [x]
  - key: destination.port
    values: ['99999']
`, want: []string{"spec.provider.name", "spec.rules[0].from[0].source", "spec.rules[0].from[1].source.ipBlocks[0]", "spec.rules[0].to[0].operation.ports[0]",
			"spec.rules[0].to[0].operation.paths[0]", "spec.rules[0].when[0].key", "spec.rules[0].when[1].key", "spec.rules[0].when[2].values[0]"}},
		{name: "service accounts with namespaces", kind: "AuthorizationPolicy", spec: "rules:\n- from:\n  - source: {serviceAccounts: [ns/sa, 'a/b/c'], namespaces: [ns]}\n",
			want: []string{"spec.rules[0].from[0].source.serviceAccounts", "spec.rules[0].from[0].source.serviceAccounts[1]"}},
		{name: "provider without custom", kind: "AuthorizationPolicy", spec: "action: DENY\nprovider: {name: ext}\nrules: [{}]\n", want: []string{"spec.provider"}},
		{name: "deny without rules", kind: "AuthorizationPolicy", spec: "action: DENY\n", want: []string{"spec.rules"}},
		{name: "deny on http attributes", kind: "AuthorizationPolicy", spec: "action: DENY\nrules:\n- to:\n  - operation: {methods: [POST]}\n", warn: []string{"spec.rules[0]"}},
		{name: "selector and targetRef", kind: "AuthorizationPolicy", spec: "selector: {matchLabels: {a: b}}\ntargetRef: {group: gateway.networking.k8s.io, kind: Gateway, name: gw}\n", want: []string{"spec"}},
		{name: "bad targetRef", kind: "AuthorizationPolicy", spec: "targetRef: {kind: Pod, namespace: other}\n", want: []string{"spec.targetRef.name", "spec.targetRef.namespace", "spec.targetRef.kind"}},
		{name: "valid", kind: "RequestAuthentication", spec: "jwtRules:\n- issuer: https://example.com\n  jwksUri: https://example.com/jwks.json\n  fromHeaders: [{name: x-jwt, prefix: 'Bearer '}]\n  outputClaimToHeaders: [{header: x-sub, claim: sub}]\n"},
		{name: "problems", kind: "RequestAuthentication", spec: "jwtRules:\n- jwksUri: ftp://x\n  fromHeaders: [{prefix: x}]\n",
			want: []string{"spec.jwtRules[0].jwksUri", "spec.jwtRules[0].fromHeaders[0].name"}},
		{name: "empty values", kind: "RequestAuthentication", spec: `
targetRef: {kind: Service, name: svc}
jwtRules:
- audiences: ['']
  fromCookies: ['']
  fromParams: ['']
  outputClaimToHeaders: [{header: ':authority', claim: sub}, {header: x-a}]
`, want: []string{"spec.jwtRules[0].issuer", "spec.jwtRules[0].audiences[0]", "spec.jwtRules[0].fromCookies[0]", "spec.jwtRules[0].fromParams[0]",
			"spec.jwtRules[0].outputClaimToHeaders[0].header", "spec.jwtRules[0].outputClaimToHeaders[1]"}},
		{name: "targetRef to a Deployment", kind: "RequestAuthentication", spec: "targetRef: {group: apps, kind: Deployment, name: d}\n", want: []string{"spec.targetRef.kind"}},
		{name: "private jwks", kind: "RequestAuthentication", spec: `jwtRules: [{issuer: i, jwks: '{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}'}]`, warn: []string{"spec.jwtRules[0].jwks"}},
		{name: "bad jwks", kind: "RequestAuthentication", spec: `jwtRules: [{issuer: i, jwks: 'not json'}]`, want: []string{"spec.jwtRules[0].jwks"}},
	})
}

func TestValidateMessage(t *testing.T) {
	cfgs, errs := ParseYAML("conf/reviews.yaml", []byte("---\n# c\n---\n"+doc("VirtualService", "hosts: [a]\nhttp:\n- route:\n  - destination: {host: a}\n    weight: -150\n")), "default")
	if len(errs) > 0 || len(cfgs) != 1 {
		t.Fatalf("parse: %v %v", cfgs, errs)
	}
	_, err := Validate(cfgs[0])
	const want = "conf/reviews.yaml: document 1: VirtualService ns/x: spec.http[0].route[0].weight: must not be negative, got -150"
	if err == nil || err.Error() != want {
		t.Fatalf("got %v\nwant %s", err, want)
	}
}

// TestValidateGatewayAndSidecarHosts: the hosts of Gateway servers and Sidecar egress
// listeners, with the verdict `istioctl validate -f` (Istio 1.31 master, the reference build)
// gives each: short names, partial wildcards, "~" on Gateways, empty parts, an all-digit
// top-level domain are refused; Gateways take IPv4 addresses (an IPv6 one has no dot: a short
// name to Istio), Sidecars do not.
func TestValidateGatewayAndSidecarHosts(t *testing.T) {
	gateway := map[string]bool{ // host -> valid
		"*": true, "ns/*": true, "*/*": true, "./foo.example.com": true, "foo.example.com": true,
		"*.example.com": true, "1.2.3.4": true, "ns/1.2.3.4": true, "example.com.": true,
		"UPPER.Example.com": true,
		"ext-host":          false, "ns/ext-host": false, "foo*.example.com": false, "*foo.example.com": false,
		"~/foo.example.com": false, "/foo.com": false, "ns/": false, "Bad_NS/a.com": false,
		"foo.123": false, "::1": false, "2001:db8::1": false, "a..b.com": false,
	}
	sidecar := map[string]bool{
		"~/foo.example.com": true, "~ns/foo.example.com": true, "~*/foo.example.com": true,
		"*/*": true, "./*": true,
		"ns/short": false, "ns/1.2.3.4": false, "foo.example.com": false, "ns/*foo.example.com": false,
	}
	var cases []vcase
	for _, h := range slices.Sorted(maps.Keys(gateway)) {
		c := vcase{name: h, kind: "Gateway", spec: `
selector: {istio: ingressgateway}
servers:
- port: {number: 80, name: http, protocol: HTTP}
  hosts: ["` + h + `"]
`}
		if !gateway[h] {
			c.want = []string{"spec.servers[0].hosts[0]"}
		}
		cases = append(cases, c)
	}
	for _, h := range slices.Sorted(maps.Keys(sidecar)) {
		c := vcase{name: h, kind: "Sidecar", spec: "egress:\n- hosts: [\"" + h + "\"]\n"}
		if !sidecar[h] {
			c.want = []string{"spec.egress[0].hosts[0]"}
		}
		cases = append(cases, c)
	}
	runValidate(t, cases)
}

// TestValidateShortGatewayHostMessage: the error says what is wrong and what to write.
func TestValidateShortGatewayHostMessage(t *testing.T) {
	cfgs, errs := ParseYAML("gw.yaml", []byte(doc("Gateway", `
servers:
- port: {number: 80, name: http, protocol: HTTP}
  hosts: [ext-host]
`)), "default")
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	_, err := Validate(cfgs[0])
	want := `gw.yaml: document 1: Gateway ns/x: spec.servers[0].hosts[0]: short names (non FQDN) are not allowed: "ext-host"`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %v, want it to contain %q", err, want)
	}
}
