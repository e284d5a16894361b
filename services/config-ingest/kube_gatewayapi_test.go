package configingest_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sschema "k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"sailplane.dev/shared/config"
	"sailplane.dev/shared/gatewayapi"
	"sailplane.dev/shared/gatewayapi/validation"
	"sailplane.dev/shared/schema"
	"sailplane.dev/tools/testenv"
)

// gatewayAPIClient is a client of kind k in version (k.Version when empty).
func gatewayAPIClient(t *testing.T, e *kenv, k schema.Kind, ns string, version ...string) dynamic.ResourceInterface {
	t.Helper()
	dc, err := dynamic.NewForConfig(e.k.RestConfig())
	if err != nil {
		t.Fatal(err)
	}
	v := k.Version
	if len(version) > 0 {
		v = version[0]
	}
	r := dc.Resource(k8sschema.GroupVersionResource{Group: k.Group, Version: v, Resource: k.Plural})
	if k.ClusterScoped {
		return r
	}
	return r.Namespace(ns)
}

// object is a Gateway API object from YAML.
func object(t *testing.T, doc string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
		t.Fatal(err)
	}
	return u
}

// Without the Gateway API CRDs config-ingest runs, says so, and publishes the Gateway API
// kinds empty; once they are installed, a GatewayClass, a Gateway and an HTTPRoute reach the
// bus (the namespaced ones only from namespaces the discoverySelectors select), and follow
// updates and deletions.
func TestKubeGatewayAPI(t *testing.T) {
	k := testenv.KubeForTest(t) // its own: the CRDs are installed mid-test
	e := newKenv(t, k)
	in, out := e.ns("in", map[string]string{"mesh-" + e.id: "yes"}), e.ns("out", nil)
	e.setMesh("discoverySelectors:\n- matchLabels: {mesh-" + e.id + ": \"yes\"}\n")
	e.createVS(in, "r", vsSpec("r", 0))
	ing := e.start("pod-0", nil)
	rec := ing.rec
	if ing.logs.Count("Gateway API CRDs not installed") != 1 {
		t.Error("no log line says the Gateway API CRDs are not installed")
	}
	if rec.get(schema.VirtualService, in+"/r") == nil {
		t.Fatal("Istio config not published without the Gateway API CRDs")
	}
	rec.mu.Lock()
	for _, kind := range schema.GatewayAPI {
		if rec.replaced[kind.TypeURL] != 1 || len(rec.state[kind.TypeURL]) != 0 {
			t.Errorf("%s: replaced %d times with %d resources, want its empty state published once", kind.Kind, rec.replaced[kind.TypeURL], len(rec.state[kind.TypeURL]))
		}
	}
	rec.mu.Unlock()

	if err := k.InstallGatewayAPICRDs(e.ctx()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "CRDs noticed", func() bool { return ing.logs.Count("Gateway API CRDs installed") == 1 })
	create := func(kind schema.Kind, ns, doc string) {
		t.Helper()
		obj := object(t, doc)
		_, version, _ := strings.Cut(obj.GetAPIVersion(), "/")
		if _, err := gatewayAPIClient(t, e, kind, ns, version).Create(e.ctx(), obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	create(schema.GatewayClass, "", gatewayClassDoc)
	gwDoc := strings.Replace(k8sGatewayDoc("80"), "namespace: apps, ", "", 1)
	create(schema.KubernetesGateway, in, gwDoc)
	create(schema.KubernetesGateway, out, gwDoc)
	routeDoc := strings.Replace(httpRouteDoc, "namespace: apps", "namespace: "+in, 1)
	create(schema.HTTPRoute, in, routeDoc)

	waitFor(t, "Gateway API objects published", func() bool {
		return rec.get(schema.GatewayClass, "istio") != nil && rec.get(schema.KubernetesGateway, in+"/web") != nil &&
			rec.get(schema.HTTPRoute, in+"/reviews") != nil
	})
	if rec.get(schema.KubernetesGateway, out+"/web") != nil {
		t.Error("a Gateway of a namespace the discoverySelectors do not select was published")
	}
	if rec.get(schema.Gateway, in+"/web") != nil {
		t.Error("the Gateway API Gateway was published as Istio's Gateway")
	}
	r := rec.get(schema.HTTPRoute, in+"/reviews")
	route, err := gatewayapi.Decode[gwv1.HTTPRoute](r)
	if err != nil {
		t.Fatal(err)
	}
	// As the API server stored it: its defaults set (weight 1, kind Service).
	ref := route.Spec.Rules[0].BackendRefs[0]
	if route.Namespace != in || route.CreationTimestamp.IsZero() || *ref.Port != 9080 || *ref.Weight != 1 || *ref.Kind != "Service" {
		t.Errorf("HTTPRoute = %+v %+v", route.ObjectMeta, ref)
	}

	// An update and a deletion follow.
	routes := gatewayAPIClient(t, e, schema.HTTPRoute, in)
	cur, err := routes.Get(e.ctx(), "reviews", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedStringSlice(cur.Object, []string{"v2.example.com"}, "spec", "hostnames"); err != nil {
		t.Fatal(err)
	}
	if _, err := routes.Update(e.ctx(), cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "updated HTTPRoute", func() bool {
		route, err := gatewayapi.Decode[gwv1.HTTPRoute](rec.get(schema.HTTPRoute, in+"/reviews"))
		return err == nil && len(route.Spec.Hostnames) == 1 && route.Spec.Hostnames[0] == "v2.example.com"
	})
	if err := routes.Delete(e.ctx(), "reviews", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "deleted HTTPRoute", func() bool { return rec.get(schema.HTTPRoute, in+"/reviews") == nil })
	if rec.get(schema.KubernetesGateway, in+"/web") == nil || rec.get(schema.GatewayClass, "istio") == nil {
		t.Error("deleting the route took other objects with it")
	}

	// Dropping the selectors brings the other namespace's Gateway in; the cluster-scoped
	// GatewayClass, in no namespace, stays through the re-evaluation of everything.
	e.setMesh("trustDomain: example.org\n")
	waitFor(t, "all namespaces", func() bool { return rec.get(schema.KubernetesGateway, out+"/web") != nil })
	if rec.get(schema.GatewayClass, "istio") == nil {
		t.Error("the GatewayClass was dropped when the discoverySelectors changed")
	}
}

// Files mode refuses what the API server refuses and stores what it stores: each document of
// the validation package's golden cases is created in a real API server with the Gateway API
// CRDs, and gets the same verdict there and from shared/gatewayapi/validation, a valid one the
// same spec, defaults included.
func TestGatewayAPIValidationMatchesAPIServer(t *testing.T) {
	k := testenv.KubeForTest(t, testenv.WithGatewayAPICRDs())
	e := newKenv(t, k)
	for _, ns := range []string{"apps", "backends"} {
		if _, err := e.kube.CoreV1().Namespaces().Create(e.ctx(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []string{"valid", "invalid"} {
		data, err := os.ReadFile("../../shared/gatewayapi/validation/testdata/" + c + "/input.yaml")
		if err != nil {
			t.Fatal(err)
		}
		docs := config.SplitDocuments(data)
		cfgs, errs := config.ParseYAML(c+".yaml", data, "default")
		if len(errs) > 0 || len(cfgs) != len(docs) {
			t.Fatalf("%s: %d documents, %d parsed: %v", c, len(docs), len(cfgs), errs)
		}
		for i, cfg := range cfgs {
			ours, ourErr := validation.Validate(cfg)
			obj := object(t, string(docs[i]))
			_, version, _ := strings.Cut(obj.GetAPIVersion(), "/")
			create := func() (*unstructured.Unstructured, error) {
				return gatewayAPIClient(t, e, cfg.Kind, cfg.Namespace, version).Create(e.ctx(), obj,
					metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict})
			}
			stored, apiErr := create()
			if apierrors.IsNotFound(apiErr) {
				// A version the CRDs no longer serve (TCPRoute v1alpha2), which files mode still
				// reads, as v1: post it as v1.
				version = cfg.Kind.Version
				obj.SetAPIVersion(cfg.Kind.APIVersion())
				stored, apiErr = create()
			}
			what := c + " document " + itoa(i+1) + " (" + cfg.Kind.Kind + " " + cfg.Name + ")"
			if (ourErr == nil) != (apiErr == nil) {
				t.Errorf("%s: ours %v, the API server's %v", what, ourErr, apiErr)
				continue
			}
			if apiErr != nil {
				// For the same reasons: every field we name, the API server names.
				for _, e := range config.Errors(ourErr) {
					if !strings.Contains(apiErr.Error(), e.Field) {
						t.Errorf("%s: we refuse %s, the API server does not name it: %v", what, e.Field, apiErr)
					}
				}
				t.Logf("%s refused by both:\n  ours: %v\n  API server: %v", what, ourErr, apiErr)
				continue
			}
			if version != cfg.Kind.Version {
				// Compare the v1 the API server serves, as config-ingest publishes it.
				if stored, err = gatewayAPIClient(t, e, cfg.Kind, cfg.Namespace).Get(e.ctx(), cfg.Name, metav1.GetOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			js, err := protojson.Marshal(ours.Spec)
			if err != nil {
				t.Fatal(err)
			}
			var got, want any
			if err := json.Unmarshal(js, &got); err != nil {
				t.Fatal(err)
			}
			wantJS, err := json.Marshal(stored.Object["spec"])
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(wantJS, &want); err != nil {
				t.Fatal(err)
			}
			if g, w := mustJSON(t, got), mustJSON(t, want); g != w {
				t.Errorf("%s: our spec\n%s\nthe API server's\n%s", what, g, w)
			}
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
