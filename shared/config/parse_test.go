package config

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/structpb"
	networking "istio.io/api/networking/v1alpha3"
	"sigs.k8s.io/yaml"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/golden"
	"sailplane.dev/shared/schema"
)

func TestMain(m *testing.M) {
	flag.Parse()
	goleak.VerifyTestMain(m)
}

func TestSplitDocuments(t *testing.T) {
	in := "# leading comment\n---\na: 1\n--- # second\nb: 2\n---\n\n# only a comment\n---\n--- {c: 3}\n...\nd: 4\n----not-a-marker: 5\n"
	docs := SplitDocuments([]byte(in))
	var got []string
	for _, d := range docs {
		got = append(got, strings.TrimSpace(string(d)))
	}
	want := []string{"a: 1", "b: 2", "{c: 3}", "d: 4\n----not-a-marker: 5"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestParseYAML(t *testing.T) {
	const in = `# reviews
apiVersion: networking.istio.io/v1alpha3
kind: VirtualService
metadata:
  name: reviews
  labels: {app: reviews}
  annotations: {note: x}
spec:
  hosts: [reviews]
  http:
  - timeout: 250ms
    route:
    - destination: {host: reviews, subset: v1}
---
apiVersion: networking.istio.io/v1beta1
kind: DestinationRule
metadata: {name: reviews, namespace: bookinfo}
spec:
  host: reviews
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: typo}
spec:
  hosts: [a]
  http:
  - route:
    - destinaton: {host: a}
---
a: [unclosed
---
apiVersion: networking.istio.io/v1
kind: Foo
metadata: {name: foo}
---
apiVersion: v1alpha1
kind: MeshConfig
metadata: {name: mesh}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {namespace: x}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: enum}
spec:
  host: a
  trafficPolicy: {loadBalancer: {simple: ROUNDROBIN}}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: Bad_Name}
---
- just
- a list
---
apiVersion: security.istio.io/v1beta1
kind: AuthorizationPolicy
metadata: {name: allow-nothing, namespace: istio-system}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: twice}
spec:
  host: a
spec:
  host: b
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: misspelled}
sepc:
  host: a
---
apiVersion: security.istio.io/v1alpha3
kind: PeerAuthentication
metadata: {name: old}
`
	cfgs, errs := ParseYAML("conf/f.yaml", []byte(in), "default")
	if len(cfgs) != 4 {
		t.Fatalf("got %d configs, want 4: %v", len(cfgs), cfgs)
	}
	vs := cfgs[0]
	if vs.Kind.TypeURL != schema.VirtualService.TypeURL || vs.Namespace != "default" || vs.Name != "reviews" ||
		vs.Labels["app"] != "reviews" || vs.Annotations["note"] != "x" || vs.Source != (Source{File: "conf/f.yaml", Doc: 1}) {
		t.Errorf("vs = %+v", vs)
	}
	spec := vs.Spec.(*networking.VirtualService)
	if spec.Http[0].Timeout.AsDuration().Milliseconds() != 250 || spec.Http[0].Route[0].Destination.Subset != "v1" {
		t.Errorf("spec = %v", spec)
	}
	if dr := cfgs[1]; dr.Kind.TypeURL != schema.DestinationRule.TypeURL || dr.Namespace != "bookinfo" || dr.Source.Doc != 2 {
		t.Errorf("dr = %+v", dr)
	}
	// A name the API server would refuse is read (Istio accepts it from files); Validate warns,
	// and refuses it for a Gateway, whose name Istio requires to be a DNS label.
	if gw := cfgs[2]; gw.Name != "Bad_Name" {
		t.Errorf("gw = %+v", gw)
	} else if ws, err := Validate(gw); len(ws) != 1 || ws[0].Field != "metadata.name" || Errors(err)[0].Field != "metadata.name" {
		t.Errorf("Gateway Bad_Name: warnings %v, error %v", ws, err)
	}
	if ap := cfgs[3]; ap.Kind.TypeURL != schema.AuthorizationPolicy.TypeURL || ap.Source.Doc != 11 {
		t.Errorf("ap = %+v", ap)
	} else if ws, err := Validate(ap); err != nil || len(ws) != 0 {
		t.Errorf("allow-nothing policy: %v, %v", ws, err)
	}
	want := []struct {
		doc   int
		is    error
		field string
		text  string
	}{
		{3, ErrSchema, "spec.http[0].route[0].destinaton", `unknown field "destinaton"`},
		{4, ErrMalformed, "", "conf/f.yaml: document 4: malformed YAML"},
		{5, ErrUnknownKind, "", `Foo default/foo: unknown kind networking.istio.io/v1 "Foo"`},
		{6, ErrUnknownKind, "", "MeshConfig is read from the mesh file"},
		{7, nil, "metadata.name", "PeerAuthentication: metadata.name: required"},
		{8, ErrSchema, "spec.trafficPolicy.loadBalancer.simple", `unknown value "ROUNDROBIN"`},
		{10, ErrMalformed, "", "must be a mapping"},
		{12, ErrMalformed, "", `DestinationRule default/twice: malformed YAML: line 7 of the document: key "spec" already set`},
		{13, ErrSchema, "sepc", `DestinationRule default/misspelled: sepc: does not match schema: unknown field "sepc"`},
		{14, ErrUnknownKind, "", "security.istio.io has no security.istio.io/v1alpha3 (versions: v1, v1beta1)"},
	}
	if len(errs) != len(want) {
		t.Fatalf("got %d errors, want %d: %v", len(errs), len(want), errs)
	}
	for i, w := range want {
		var e *Error
		if !errors.As(errs[i], &e) {
			t.Fatalf("error %d is %T", i, errs[i])
		}
		if e.Doc != w.doc || e.File != "conf/f.yaml" || e.Field != w.field || !strings.Contains(e.Error(), w.text) ||
			(w.is != nil && !errors.Is(e, w.is)) {
			t.Errorf("error %d = %q (doc %d, field %q), want doc %d field %q containing %q", i, e, e.Doc, e.Field, w.doc, w.field, w.text)
		}
	}
}

func TestParseYAMLTooLarge(t *testing.T) {
	big := "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata:\n  name: big\n  annotations:\n    blob: " +
		strings.Repeat("x", MaxResourceBytes) + "\nspec:\n  hosts: [a]\n"
	in := big + "---\n" + doc("DestinationRule", "host: a")
	cfgs, errs := ParseYAML("conf/big.yaml", []byte(in), "default")
	if len(cfgs) != 1 || cfgs[0].Kind.Kind != "DestinationRule" {
		t.Errorf("the document after the oversized one was not read: %v", cfgs)
	}
	if len(errs) != 1 {
		t.Fatalf("errors = %v, want one", errs)
	}
	var e *Error
	if !errors.As(errs[0], &e) || !errors.Is(e, ErrTooLarge) || e.Kind != "VirtualService" || e.Namespace != "default" || e.Name != "big" {
		t.Fatalf("error = %#v, want ErrTooLarge naming VirtualService default/big", errs[0])
	}
	want := fmt.Sprintf("conf/big.yaml: document 1: VirtualService default/big: resource too large: the document is %d bytes, more than the 1572864 bytes (1.5 MiB)", len(big))
	if !strings.HasPrefix(e.Error(), want) {
		t.Errorf("message = %q, want prefix %q", e.Error(), want)
	}
}

func TestParseYAMLTypeErrors(t *testing.T) {
	for _, tc := range []struct{ spec, field string }{
		{"hosts: reviews", "spec.hosts"},
		{"hosts: [a]\nhttp:\n- route:\n  - destination: {host: a}\n    weight: heavy", "spec.http[0].route[0].weight"},
		{"hosts: [a]\nhttp:\n- timeout: 1day\n  route: []", "spec.http[0].timeout"},
		{"hosts: [a]\nhttp: {a: b}", "spec.http"},
		{"hosts: [a]\nhttp:\n- match:\n  - headers: {x: {exakt: y}}", "spec.http[0].match[0].headers[x].exakt"},
		{"hosts: [a]\nhttp:\n- match:\n  - ignoreUriCase: yes please", "spec.http[0].match[0].ignoreUriCase"},
	} {
		_, errs := ParseYAML("f.yaml", []byte(doc("VirtualService", tc.spec)), "default")
		if len(errs) != 1 {
			t.Errorf("%q: got %v", tc.spec, errs)
			continue
		}
		if e := errs[0].(*Error); e.Field != tc.field || !errors.Is(e, ErrSchema) {
			t.Errorf("%q: got field %q (%v), want %q", tc.spec, e.Field, e, tc.field)
		}
	}
}

func TestResourceRoundTrip(t *testing.T) {
	cfgs, errs := ParseYAML("f.yaml", []byte(doc("VirtualService", "hosts: [a]\nhttp:\n- route:\n  - destination: {host: a}\n")), "default")
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	c := cfgs[0]
	c.Labels = map[string]string{"a": "b"}
	r := c.Resource()
	if r.Name != "ns/x" || r.Body != c.Spec || r.Labels["a"] != "b" {
		t.Fatalf("resource = %+v", r)
	}
	back := FromResource(schema.VirtualService, r)
	if !Equal(c, back) || back.Namespace != "ns" || back.Name != "x" {
		t.Fatalf("round trip: %+v", back)
	}
	mesh := FromResource(schema.MeshConfig, &bus.Resource{Name: "mesh"})
	if mesh.Name != "mesh" || mesh.Namespace != "" || (Config{Kind: schema.MeshConfig, Name: "mesh"}).BusName() != "mesh" {
		t.Fatalf("cluster-scoped: %+v", mesh)
	}
}

// goldenOutput is what testdata/<case>/golden.yaml holds for testdata/<case>/input.yaml.
type goldenOutput struct {
	Configs  []string `json:"configs"`
	Errors   []string `json:"errors"`
	Warnings []string `json:"warnings,omitempty"`
}

func TestGolden(t *testing.T) {
	for _, dir := range golden.Cases(t, "testdata") {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(dir, "input.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			cfgs, errs := ParseYAML("input.yaml", data, "default")
			var got goldenOutput
			for _, c := range cfgs {
				got.Configs = append(got.Configs, c.Kind.Kind+" "+c.BusName())
				ws, err := Validate(c)
				for _, e := range Errors(err) {
					errs = append(errs, e)
				}
				for _, w := range ws {
					got.Warnings = append(got.Warnings, w.String())
				}
			}
			for _, e := range errs {
				got.Errors = append(got.Errors, e.Error())
			}
			sort.Strings(got.Errors)
			out, err := yaml.Marshal(got)
			if err != nil {
				t.Fatal(err)
			}
			golden.Compare(t, filepath.Join(dir, "golden.yaml"), out)
		})
	}
}

// The Gateway API kinds are read in every version their CRDs serve, stored as v1 with the spec
// kept as the Struct of its JSON; GatewayClass is cluster-scoped.
func TestParseYAMLGatewayAPI(t *testing.T) {
	const in = `apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: istio, namespace: ignored}
spec: {controllerName: istio.io/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: Gateway
metadata: {name: web}
spec:
  gatewayClassName: istio
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TCPRoute
metadata: {name: db, namespace: data}
spec: {rules: [{backendRefs: [{name: db, port: 5432}]}]}
---
apiVersion: gateway.networking.k8s.io/v1alpha9
kind: HTTPRoute
metadata: {name: future}
`
	cfgs, errs := ParseYAML("conf/gw.yaml", []byte(in), "default")
	if len(cfgs) != 3 || len(errs) != 1 {
		t.Fatalf("got %d configs and errors %v, want 3 configs and 1 error", len(cfgs), errs)
	}
	if gc := cfgs[0]; gc.Kind.TypeURL != schema.GatewayClass.TypeURL || gc.Namespace != "" || gc.BusName() != "istio" {
		t.Errorf("GatewayClass = %+v", gc)
	}
	gw := cfgs[1]
	if gw.Kind.TypeURL != schema.KubernetesGateway.TypeURL || gw.BusName() != "default/web" {
		t.Errorf("Gateway = %+v", gw)
	}
	spec, ok := gw.Spec.(*structpb.Struct)
	if !ok || spec.Fields["gatewayClassName"].GetStringValue() != "istio" ||
		spec.Fields["listeners"].GetListValue().GetValues()[0].GetStructValue().Fields["port"].GetNumberValue() != 80 {
		t.Errorf("Gateway spec = %v", gw.Spec)
	}
	if ws, err := Validate(gw); err != nil || len(ws) != 0 {
		t.Errorf("Validate(Gateway) = %v, %v", ws, err)
	}
	if r := cfgs[2]; r.Kind.TypeURL != schema.TCPRoute.TypeURL || r.BusName() != "data/db" {
		t.Errorf("TCPRoute = %+v", r)
	}
	var e *Error
	if !errors.As(errs[0], &e) || e.Doc != 4 || e.Group != schema.GatewayAPIGroup || !errors.Is(e, ErrUnknownKind) ||
		!strings.Contains(e.Error(), "gateway.networking.k8s.io has no gateway.networking.k8s.io/v1alpha9 (versions: v1, v1beta1)") {
		t.Errorf("error = %v", errs[0])
	}
}
