package gatewayapi

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"sailplane.dev/shared/golden"
)

// TestMain (goleak) is in main_test.go.

// testServices is a registry built from the Service and ServiceEntry documents of a case.
type testServices struct {
	byHost  map[string]Service
	entries map[string][]string
}

func (s testServices) Service(h, _ string) (Service, bool) { v, ok := s.byHost[h]; return v, ok }
func (s testServices) ServiceEntryHosts(ns, name string) ([]string, bool) {
	h, ok := s.entries[ns+"/"+name]
	return h, ok
}

// readInput decodes a case: Gateway API documents, plus core Services, Istio ServiceEntries
// and Namespaces standing for the registry. A Service annotated test.sailplane.dev/ready: "false"
// has no endpoints.
func readInput(t testing.TB, path string) Input {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	reg := testServices{byHost: map[string]Service{}, entries: map[string][]string{}}
	in := Input{Services: reg, DomainSuffix: "cluster.local"}
	for i, doc := range bytes.Split(b, []byte("\n---")) {
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		var head struct{ Kind string }
		if err := yaml.Unmarshal(doc, &head); err != nil {
			t.Fatalf("%s: document %d: %v", path, i, err)
		}
		into := func(v any) {
			if err := yaml.UnmarshalStrict(doc, v); err != nil {
				t.Fatalf("%s: document %d (%s): %v", path, i, head.Kind, err)
			}
		}
		switch head.Kind {
		case "GatewayClass":
			v := &gwv1.GatewayClass{}
			into(v)
			in.GatewayClasses = append(in.GatewayClasses, v)
		case "Gateway":
			v := &gwv1.Gateway{}
			into(v)
			in.Gateways = append(in.Gateways, v)
		case "BackendTLSPolicy":
			v := &gwv1.BackendTLSPolicy{}
			into(v)
			in.BackendTLSPolicies = append(in.BackendTLSPolicies, v)
		case "ListenerSet":
			v := &gwv1.ListenerSet{}
			into(v)
			in.ListenerSets = append(in.ListenerSets, v)
		case "HTTPRoute":
			v := &gwv1.HTTPRoute{}
			into(v)
			in.HTTPRoutes = append(in.HTTPRoutes, v)
		case "GRPCRoute":
			v := &gwv1.GRPCRoute{}
			into(v)
			in.GRPCRoutes = append(in.GRPCRoutes, v)
		case "TCPRoute":
			v := &gwv1.TCPRoute{}
			into(v)
			in.TCPRoutes = append(in.TCPRoutes, v)
		case "TLSRoute":
			v := &gwv1.TLSRoute{}
			into(v)
			in.TLSRoutes = append(in.TLSRoutes, v)
		case "ReferenceGrant":
			v := &gwv1.ReferenceGrant{}
			into(v)
			in.ReferenceGrants = append(in.ReferenceGrants, v)
		case "Namespace":
			v := &corev1.Namespace{}
			into(v)
			if in.NamespaceLabels == nil {
				in.NamespaceLabels = map[string]map[string]string{}
			}
			in.NamespaceLabels[v.Name] = v.Labels
		case "Service":
			v := &corev1.Service{}
			into(v)
			s := Service{Hostname: fmt.Sprintf("%s.%s.svc.cluster.local", v.Name, v.Namespace), Selector: v.Spec.Selector,
				Ready: v.Annotations["test.sailplane.dev/ready"] != "false"}
			if v.Spec.ClusterIP != "" {
				s.Addresses = []string{v.Spec.ClusterIP}
			}
			if v.Spec.Type == corev1.ServiceTypeLoadBalancer {
				s.LoadBalancer = true
				for _, in := range v.Status.LoadBalancer.Ingress {
					s.ExternalAddresses = append(s.ExternalAddresses, cmp.Or(in.IP, in.Hostname))
				}
			}
			s.ExternalAddresses = append(s.ExternalAddresses, v.Spec.ExternalIPs...)
			for _, p := range v.Spec.Ports {
				s.Ports = append(s.Ports, ServicePort{Name: p.Name, Number: uint32(p.Port), Protocol: "HTTP"})
			}
			reg.byHost[s.Hostname] = s
		case "ServiceEntry":
			var se struct {
				Metadata struct{ Name, Namespace string }
				Spec     struct{ Hosts []string }
			}
			if err := yaml.Unmarshal(doc, &se); err != nil {
				t.Fatal(err)
			}
			reg.entries[se.Metadata.Namespace+"/"+se.Metadata.Name] = se.Spec.Hosts
			for _, h := range se.Spec.Hosts {
				reg.byHost[h] = Service{Hostname: h, Ready: true}
			}
		default:
			t.Fatalf("%s: document %d: unknown kind %q", path, i, head.Kind)
		}
	}
	return in
}

// renderOutput writes the generated Istio config as Kubernetes-style YAML documents.
func renderOutput(t testing.TB, out Output) []byte {
	t.Helper()
	var docs []string
	add := func(kind, ns, name string, spec proto.Message) {
		j, err := protojson.Marshal(spec)
		if err != nil {
			t.Fatal(err)
		}
		var m any
		if err := json.Unmarshal(j, &m); err != nil {
			t.Fatal(err)
		}
		b, err := yaml.Marshal(map[string]any{"apiVersion": "networking.istio.io/v1", "kind": kind,
			"metadata": map[string]any{"name": name, "namespace": ns}, "spec": m})
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, string(b))
	}
	for _, c := range out.Gateways {
		add("Gateway", c.Namespace, c.Name, c.Spec)
	}
	for _, c := range out.VirtualServices {
		add("VirtualService", c.Namespace, c.Name, c.Spec)
	}
	for _, c := range out.DestinationRules {
		add("DestinationRule", c.Namespace, c.Name, c.Spec)
	}
	return []byte(strings.Join(docs, "---\n"))
}

func renderStatus(t testing.TB, out Output) []byte {
	t.Helper()
	var docs []string
	for _, s := range out.Status {
		b, err := yaml.Marshal(map[string]any{"kind": s.Kind.Kind, "namespace": s.Namespace, "name": s.Name,
			"generation": s.Generation, "status": s.Value})
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, string(b))
	}
	return []byte(strings.Join(docs, "---\n"))
}

func TestTranslateGolden(t *testing.T) {
	for _, dir := range golden.Cases(t, "testdata") {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			in := readInput(t, filepath.Join(dir, "input.yaml"))
			out := Translate(in)
			golden.Compare(t, filepath.Join(dir, "output.golden.yaml"), renderOutput(t, out))
			golden.Compare(t, filepath.Join(dir, "status.golden.yaml"), renderStatus(t, out))
			// Deterministic: the same input in reverse order gives the same output.
			rev := in
			rev.HTTPRoutes = reversed(in.HTTPRoutes)
			rev.Gateways = reversed(in.Gateways)
			rev.GRPCRoutes = reversed(in.GRPCRoutes)
			rev.ReferenceGrants = reversed(in.ReferenceGrants)
			if a, b := renderOutput(t, Translate(rev)), renderOutput(t, out); !bytes.Equal(a, b) {
				t.Errorf("output depends on input order:\n%s\nvs\n%s", a, b)
			}
		})
	}
}

func reversed[T any](s []T) []T {
	out := make([]T, len(s))
	for i, v := range s {
		out[len(s)-1-i] = v
	}
	return out
}
