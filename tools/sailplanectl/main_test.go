package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"go.uber.org/goleak"
	networking "istio.io/api/networking/v1alpha3"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/grpcbootstrap"
	"sailplane.dev/shared/schema"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := rootCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func TestBootstrapGRPC(t *testing.T) {
	out, err := run(t, "bootstrap", "grpc", "--xds-address", "127.0.0.1:1234", "--namespace", "demo", "--pod", "web-1", "--ip", "10.1.2.3")
	if err != nil {
		t.Fatal(err)
	}
	var b grpcbootstrap.Bootstrap
	if err := json.Unmarshal([]byte(out), &b); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if got := b.XDSServers[0].ServerURI; got != "127.0.0.1:1234" {
		t.Errorf("server_uri = %q", got)
	}
	if want := "sidecar~10.1.2.3~web-1.demo~demo.svc.cluster.local"; b.Node.ID != want {
		t.Errorf("node.id = %q, want %q", b.Node.ID, want)
	}
	if b.Node.Metadata["GENERATOR"] != "grpc" || b.Node.Locality == nil {
		t.Errorf("node = %+v: want GENERATOR=grpc and a locality", b.Node)
	}
}

func TestBusGet(t *testing.T) {
	store := bus.NewStore()
	store.Upsert(schema.VirtualService.TypeURL,
		&bus.Resource{Name: "demo/b", Body: &networking.VirtualService{Hosts: []string{"b"}}},
		&bus.Resource{Name: "demo/a", Body: &networking.VirtualService{Hosts: []string{"a"}}})
	addr := serveBus(t, store)

	out, err := run(t, "bus", "get", "--bus", addr, "--body", "VirtualService", "Gateway")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"TYPE            NAME    VERSION",
		"VirtualService  demo/a  ",
		`{"hosts":["a"]}`,
	} {
		// protojson varies its spacing on purpose, so the body is compared without spaces.
		if !strings.Contains(out, want) && !strings.Contains(strings.ReplaceAll(out, " ", ""), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Index(out, "demo/a") > strings.Index(out, "demo/b") {
		t.Errorf("resources not sorted by name:\n%s", out)
	}

	out, err = run(t, "bus", "get", "--bus", addr, "-o", "json", "VirtualService")
	if err != nil {
		t.Fatal(err)
	}
	var got []busResource
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("-o json: %v\n%s", err, out)
	}
	var body struct{ Hosts []string }
	if len(got) != 2 || got[0].Name != "demo/a" || got[0].TypeURL != schema.VirtualService.TypeURL || got[0].Version == "" ||
		json.Unmarshal(got[0].Body, &body) != nil || len(body.Hosts) != 1 || body.Hosts[0] != "a" {
		t.Errorf("-o json = %s", out)
	}
}
