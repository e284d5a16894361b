package main

import (
	"encoding/json"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	networking "istio.io/api/networking/v1alpha3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
)

// serveBus serves store as a bus on 127.0.0.1 until the test ends and returns its address.
func serveBus(t *testing.T, store *bus.Store) string {
	t.Helper()
	gs := grpc.NewServer()
	bus.NewServer(store).Register(gs)
	return serve(t, gs)
}

func TestBusList(t *testing.T) {
	store := bus.NewStore()
	store.Upsert(schema.VirtualService.TypeURL,
		&bus.Resource{Name: "demo/a", Body: &networking.VirtualService{Hosts: []string{"a"}}},
		&bus.Resource{Name: "demo/b", Body: &networking.VirtualService{Hosts: []string{"b"}}})
	store.Upsert(schema.Service.TypeURL, &bus.Resource{Name: "a.demo.svc.cluster.local", Body: &discoveryv1.Service{Hostname: "a.demo.svc.cluster.local"}})
	addr := serveBus(t, store)

	out, err := run(t, "bus", "list", "--bus", addr)
	if err != nil {
		t.Fatal(err)
	}
	want := "KIND            TYPE URL                               RESOURCES\n" +
		"VirtualService  networking.istio.io/v1/VirtualService  2\n" +
		"Service         sailplane.dev/discovery/v1/Service     1\n"
	if out != want {
		t.Errorf("bus list:\n%s\nwant:\n%s", out, want)
	}

	out, err = run(t, "bus", "list", "--bus", addr, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var rows []struct {
		Kind      string
		Resources int
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil || len(rows) != 2 || rows[0].Kind != "VirtualService" || rows[0].Resources != 2 {
		t.Errorf("bus list -o json = %s (%v)", out, err)
	}
}

func TestBusUnreachable(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	_, err = run(t, "bus", "list", "--bus", addr, "--timeout", "500ms")
	if err == nil || !strings.Contains(err.Error(), "no full state within 500ms") {
		t.Errorf("err = %v", err)
	}
}

// TestCompletion: shell completion offers the kinds for bus get and the formats for -o.
func TestCompletion(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"__complete", "bus", "get", ""}, "VirtualService\n"},
		{[]string{"__complete", "validate", "-o", ""}, "yaml\n"},
		{[]string{"completion", "bash"}, "__start_sailplanectl"},
	} {
		out, err := run(t, tc.args...)
		if err != nil || !strings.Contains(out, tc.want) {
			t.Errorf("%v = %q, %v; want it to contain %q", tc.args, out, err, tc.want)
		}
	}
}
