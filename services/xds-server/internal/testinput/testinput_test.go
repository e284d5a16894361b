package testinput

import (
	"testing"

	"go.uber.org/goleak"
	networking "istio.io/api/networking/v1alpha3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/shared/schema"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParse(t *testing.T) {
	items, err := Parse([]byte(`
apiVersion: sailplane.dev/v1
kind: Service
spec: {hostname: a.demo.svc.cluster.local, namespace: demo, ports: [{name: grpc, number: 7070}]}
---
---
apiVersion: networking.istio.io/v1alpha3
kind: VirtualService
metadata: {name: a, namespace: demo}
spec: {hosts: [a]}
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != 2 {
		t.Fatalf("%d items, want 2", len(items))
	}
	if items[0].Resource.Name != "demo/a.demo.svc.cluster.local" || items[0].Kind.TypeURL != schema.Service.TypeURL {
		t.Errorf("service item = %s %s", items[0].Kind.TypeURL, items[0].Resource.Name)
	}
	if p := items[0].Resource.Body.(*discoveryv1.Service).GetPorts()[0].GetNumber(); p != 7070 {
		t.Errorf("port = %d", p)
	}
	if vs := items[1].Resource.Body.(*networking.VirtualService); vs.GetHosts()[0] != "a" || items[1].Kind.TypeURL != schema.VirtualService.TypeURL {
		t.Errorf("virtual service = %v", vs)
	}
	if !items[0].Resource.CreateTime.Before(items[1].Resource.CreateTime) {
		t.Error("document order is not creation order")
	}
	if got := Changes(items); len(got) != 2 {
		t.Errorf("%d changes, want 2", len(got))
	}
}

func TestParseErrors(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown kind": "apiVersion: example.com/v1\nkind: Nope\nmetadata: {name: x}\n",
		"bad spec":     "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: x}\nspec: {nope: 1}\n",
		"no name":      "apiVersion: networking.istio.io/v1\nkind: VirtualService\nspec: {}\n",
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := Parse([]byte(doc)); err == nil {
				t.Fatal("no error")
			}
		})
	}
}
