package envoygen

import (
	"errors"
	"slices"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"sailplane.dev/services/xds-server/internal/model"
)

func TestGenerateByType(t *testing.T) {
	tc := load(t, "testdata/sidecar-basic")
	p := tc.proxies[0].proxy
	g := New(testLogger(t))
	all, err := g.GenerateAll(tc.snap, p)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{resourcev3.ListenerType: len(all.Listeners), resourcev3.RouteType: len(all.Routes),
		resourcev3.ClusterType: len(all.Clusters), resourcev3.EndpointType: len(all.Endpoints)}
	for typeURL, n := range want {
		t.Run(typeURL, func(t *testing.T) {
			got, err := g.Generate(tc.snap, p, typeURL, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != n || n == 0 {
				t.Fatalf("%d resources, want %d (> 0)", len(got), n)
			}
			var names []string
			for _, r := range got {
				names = append(names, resourceName(r))
			}
			if !slices.IsSorted(names) {
				t.Errorf("not sorted: %v", names)
			}
			// Asking by name returns just those, ignoring unknown names.
			sub, err := g.Generate(tc.snap, p, typeURL, []string{names[0], "no-such-resource"})
			if err != nil {
				t.Fatal(err)
			}
			if len(sub) != 1 || resourceName(sub[0]) != names[0] {
				t.Fatalf("by name: got %d resources", len(sub))
			}
		})
	}
	eds, _ := g.Generate(tc.snap, p, resourcev3.EndpointType, []string{"outbound|9080||reviews.default.svc.cluster.local"})
	if len(eds) != 1 || eds[0].(*endpointv3.ClusterLoadAssignment).GetClusterName() != "outbound|9080||reviews.default.svc.cluster.local" {
		t.Fatalf("EDS by cluster name: %v", eds)
	}
	cds, _ := g.Generate(tc.snap, p, resourcev3.ClusterType, []string{BlackHoleCluster})
	if len(cds) != 1 || cds[0].(*clusterv3.Cluster).GetName() != BlackHoleCluster {
		t.Fatalf("CDS by name: %v", cds)
	}
}

func TestGenerateUnsupported(t *testing.T) {
	tc := load(t, "testdata/sidecar-basic")
	g := New(nil)
	proxyless := *tc.proxies[0].proxy
	proxyless.Type = model.Proxyless
	for name, call := range map[string]func() error{
		"proxyless": func() error {
			_, err := g.Generate(tc.snap, &proxyless, resourcev3.ClusterType, nil)
			return err
		},
		"unknown type": func() error {
			_, err := g.Generate(tc.snap, tc.proxies[0].proxy, resourcev3.SecretType, nil)
			return err
		},
		"nil proxy": func() error {
			_, err := g.GenerateAll(tc.snap, nil)
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			if err := call(); !errors.Is(err, ErrUnsupported) {
				t.Fatalf("err = %v, want ErrUnsupported", err)
			}
		})
	}
}

// TestEmptySnapshot: a proxy in an empty mesh still gets its fixed listeners and clusters.
func TestEmptySnapshot(t *testing.T) {
	tc := load(t, "testdata/sidecar-basic")
	snap := &model.Snapshot{Services: map[string]*model.Service{}}
	for _, np := range tc.proxies {
		res, err := New(testLogger(t)).GenerateAll(snap, np.proxy)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Listeners) != 2 || len(res.Clusters) != 3 || len(res.Routes) != 0 || len(res.Endpoints) != 0 {
			t.Fatalf("got %d listeners, %d clusters, %d routes, %d endpoints", len(res.Listeners), len(res.Clusters),
				len(res.Routes), len(res.Endpoints))
		}
		for _, m := range all(res) {
			if err := m.(interface{ ValidateAll() error }).ValidateAll(); err != nil {
				t.Error(err)
			}
		}
	}
}
