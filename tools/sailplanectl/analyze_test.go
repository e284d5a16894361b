package main

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"
	networking "istio.io/api/networking/v1alpha3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
)

const missingSubset = `Referenced host+subset in destinationrule not found: "web+v2"`

func TestAnalyzeFiles(t *testing.T) {
	out, err := run(t, "analyze", "-f", "testdata/analyze.yaml")
	if !errors.Is(err, errFound) {
		t.Errorf("err = %v, want errFound", err)
	}
	want := "Error  IST0101  VirtualService demo/web  testdata/analyze.yaml document 3  spec.http[0].route[1].destination.subset  " + missingSubset
	if !strings.Contains(out, want) {
		t.Errorf("output lacks %q:\n%s", want, out)
	}
	// The Kubernetes Service in the file is the destination's service.
	if strings.Contains(out, "Referenced host not found") {
		t.Errorf("host reported missing:\n%s", out)
	}
}

// TestAnalyzeBus reads the live config from a config bus and the services from a registry bus, as
// the microservices serve them.
func TestAnalyzeBus(t *testing.T) {
	cfg := bus.NewStore()
	cfg.Upsert(schema.DestinationRule.TypeURL, &bus.Resource{Name: "demo/web", Body: &networking.DestinationRule{
		Host: "web", Subsets: []*networking.Subset{{Name: "v1"}},
	}})
	cfg.Upsert(schema.VirtualService.TypeURL, &bus.Resource{Name: "demo/web", Body: &networking.VirtualService{
		Hosts: []string{"web"},
		Http: []*networking.HTTPRoute{{Route: []*networking.HTTPRouteDestination{
			{Destination: &networking.Destination{Host: "web", Subset: "v1"}, Weight: 90},
			{Destination: &networking.Destination{Host: "web", Subset: "v2"}, Weight: 10},
		}}},
	}})
	reg := bus.NewStore()
	reg.Upsert(schema.Service.TypeURL, &bus.Resource{Name: "web.demo.svc.cluster.local", Body: &discoveryv1.Service{Hostname: "web.demo.svc.cluster.local", Namespace: "demo"}})
	cfgAddr, regAddr := serveBus(t, cfg), serveBus(t, reg)

	for _, tc := range []struct {
		name        string
		args        []string
		hostMissing bool
	}{
		{"registry bus", []string{"--bus", cfgAddr, "--registry-bus", regAddr}, false},
		// Without --registry-bus the services come from the config bus (hyper's single bus), and
		// one with none is a microservices' config bus: hosts are not checked.
		{"one bus", []string{"--bus", cfgAddr}, false},
		{"registry bus without services", []string{"--bus", cfgAddr, "--registry-bus", cfgAddr}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := run(t, append([]string{"analyze"}, tc.args...)...)
			if !errors.Is(err, errFound) {
				t.Errorf("err = %v, want errFound", err)
			}
			// Columns are compared without their padding, which depends on the other rows.
			if want := "VirtualService demo/web spec.http[0].route[1].destination.subset " + missingSubset; !strings.Contains(squeeze(out), want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
			if got := strings.Contains(out, `Referenced host not found: "web"`); got != tc.hostMissing {
				t.Errorf("host reported missing: %v, want %v:\n%s", got, tc.hostMissing, out)
			}
		})
	}
}

func TestAnalyzeClean(t *testing.T) {
	out, err := runIn(t, `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: api, namespace: demo}
spec:
  hosts: [api.example.com]
  ports: [{number: 443, name: tls, protocol: TLS}]
  resolution: DNS
`, "analyze", "-f", "-")
	if err != nil || out != "No problems found in 1 file.\n" {
		t.Errorf("analyze = %q, %v", out, err)
	}
}

// squeeze collapses each run of spaces to one.
func squeeze(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.Join(strings.Fields(l), " ")
	}
	return strings.Join(lines, "\n")
}

// TestAnalyzeGatewayAPI: Gateway API documents in files are analyzed with the Istio ones: a
// parent that does not exist, one whose listener does not take the route, a missing backend.
func TestAnalyzeGatewayAPI(t *testing.T) {
	out, err := run(t, "analyze", "-f", "testdata/analyze-gatewayapi.yaml")
	if !errors.Is(err, errFound) {
		t.Errorf("err = %v, want errFound", err)
	}
	for _, want := range []string{
		`Error IST0101 HTTPRoute demo/web testdata/analyze-gatewayapi.yaml document 3 spec.parentRefs[1] Referenced parent Gateway not found: "demo/private"`,
		`Warning IST0171 HTTPRoute demo/web testdata/analyze-gatewayapi.yaml document 3 spec.parentRefs[0] A condition with a negative status is present: type=Accepted, reason=NoMatchingListenerHostname`,
		`Error IST0101 HTTPRoute demo/web testdata/analyze-gatewayapi.yaml document 3 spec.rules[0].backendRefs[1] Referenced backend Service not found: "demo/api"`,
	} {
		if !strings.Contains(squeeze(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// The Kubernetes Service in the file is the first backend.
	if strings.Contains(out, `"demo/web"`) {
		t.Errorf("backend web reported missing:\n%s", out)
	}
}

// TestAnalyzeInfoPasses: an Info message (a Gateway of another controller's class) is printed
// but fails nothing, even with --warnings-as-errors.
func TestAnalyzeInfoPasses(t *testing.T) {
	out, err := runIn(t, `apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: other, namespace: demo}
spec:
  gatewayClassName: nginx
  listeners: [{name: http, port: 80, protocol: HTTP}]
`, "analyze", "--warnings-as-errors", "-f", "-")
	if err != nil {
		t.Errorf("err = %v, want none", err)
	}
	if want := "Info SPL0003 Gateway demo/other"; !strings.Contains(squeeze(out), want) {
		t.Errorf("output lacks %q:\n%s", want, out)
	}
}

// TestAnalyzeBusGatewayAPI: the Gateway API kinds a config bus serves (specs as
// google.protobuf.Struct) are analyzed.
func TestAnalyzeBusGatewayAPI(t *testing.T) {
	spec, err := structpb.NewStruct(map[string]any{
		"parentRefs": []any{map[string]any{"name": "missing"}},
		"rules":      []any{map[string]any{"backendRefs": []any{map[string]any{"name": "web", "port": 80}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg := bus.NewStore()
	cfg.Upsert(schema.HTTPRoute.TypeURL, &bus.Resource{Name: "demo/web", Body: spec})
	cfg.Upsert(schema.Service.TypeURL, &bus.Resource{Name: "web.demo.svc.cluster.local", Body: &discoveryv1.Service{Hostname: "web.demo.svc.cluster.local", Namespace: "demo"}})
	out, err := run(t, "analyze", "--bus", serveBus(t, cfg))
	if !errors.Is(err, errFound) {
		t.Errorf("err = %v, want errFound", err)
	}
	if want := `HTTPRoute demo/web spec.parentRefs[0] Referenced parent Gateway not found: "demo/missing"`; !strings.Contains(squeeze(out), want) {
		t.Errorf("output lacks %q:\n%s", want, out)
	}
}
