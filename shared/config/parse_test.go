package config

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"go.uber.org/goleak"
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
`
	cfgs, errs := ParseYAML("conf/f.yaml", []byte(in), "default")
	if len(cfgs) != 3 {
		t.Fatalf("got %d configs, want 3: %v", len(cfgs), cfgs)
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
	if ap := cfgs[2]; ap.Kind.TypeURL != schema.AuthorizationPolicy.TypeURL || ap.Source.Doc != 11 || Validate(ap) != nil {
		t.Errorf("ap = %+v, %v", ap, Validate(ap))
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
		{9, nil, "metadata.name", "DNS-1123"},
		{10, ErrMalformed, "", "must be a mapping"},
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
	Configs []string `json:"configs"`
	Errors  []string `json:"errors"`
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
				for _, e := range Errors(Validate(c)) {
					errs = append(errs, e)
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
