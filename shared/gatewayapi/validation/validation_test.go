package validation_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	"sailplane.dev/shared/config"
	"sailplane.dev/shared/gatewayapi/validation"
	"sailplane.dev/shared/gatewayapi/validation/internal/schemafile"
	"sailplane.dev/shared/golden"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type goldenDoc struct {
	Object string   `json:"object,omitempty"`
	Errors []string `json:"errors,omitempty"`
	// Spec is the valid object's spec as it is published, with the CRD's defaults.
	Spec any `json:"spec,omitempty"`
}

// testdata/<case>/input.yaml → golden.yaml: each document's errors, or its defaulted spec.
func TestGolden(t *testing.T) {
	for _, dir := range golden.Cases(t, "testdata") {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(dir, "input.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			cfgs, errs := config.ParseYAML("input.yaml", data, "default")
			if len(errs) > 0 {
				t.Fatalf("parse: %v", errs)
			}
			var got []goldenDoc
			for _, c := range cfgs {
				d := goldenDoc{Object: c.Kind.Kind + " " + c.BusName()}
				v, err := validation.Validate(c)
				for _, e := range config.Errors(err) {
					d.Errors = append(d.Errors, e.Error())
				}
				if err == nil {
					js, err := protojson.Marshal(v.Spec)
					if err != nil {
						t.Fatal(err)
					}
					var spec any
					if err := yaml.Unmarshal(js, &spec); err != nil {
						t.Fatal(err)
					}
					d.Spec = spec
				}
				got = append(got, d)
			}
			out, err := yaml.Marshal(got)
			if err != nil {
				t.Fatal(err)
			}
			golden.Compare(t, filepath.Join(dir, "golden.yaml"), out)
		})
	}
}

// Errors name file, document, object and field, and say which check refused them.
func TestErrorsNameTheField(t *testing.T) {
	const doc = `apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: apps}
spec:
  rules:
  - backendRefs: [{name: reviews}]
`
	cfgs, _ := config.ParseYAML("conf/routes.yaml", []byte("---\n"+doc), "default")
	_, err := validation.Validate(cfgs[0])
	es := config.Errors(err)
	if len(es) != 1 {
		t.Fatalf("errors = %v", err)
	}
	e := es[0]
	if e.File != "conf/routes.yaml" || e.Doc != 1 || e.Kind != "HTTPRoute" || e.Group != "gateway.networking.k8s.io" ||
		e.Name != "r" || e.Field != "spec.rules[0].backendRefs[0]" || !errors.Is(e, validation.ErrRefused) ||
		!strings.Contains(e.Error(), "Must have port for Service reference") {
		t.Errorf("error = %#v: %v", e, e)
	}
	unknown := strings.Replace(doc, "name: reviews", "name: reviews, prot: 80", 1)
	cfgs, _ = config.ParseYAML("conf/routes.yaml", []byte(unknown), "default")
	_, err = validation.Validate(cfgs[0])
	if es := config.Errors(err); len(es) != 1 || es[0].Field != "spec.rules[0].backendRefs[0].prot" || !errors.Is(es[0], config.ErrSchema) {
		t.Errorf("unknown field: %v", err)
	}
}

// The embedded schemas are those of deploy/crds/gateway-api, which `make crds` copies from the
// pinned module: regenerated, they are the same.
func TestEmbeddedSchemasMatchDeploy(t *testing.T) {
	f, err := schemafile.Read(os.DirFS("../../../deploy/crds/gateway-api"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := f.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("schemas.gen.json")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Error("schemas.gen.json differs from deploy/crds/gateway-api: run make crds")
	}
	if f.BundleVersion != validation.BundleVersion() || f.Channel != "standard" {
		t.Errorf("bundle %s %s, embedded %s", f.BundleVersion, f.Channel, validation.BundleVersion())
	}
}
