package serviceentry

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"google.golang.org/protobuf/types/known/anypb"
	networking "istio.io/api/networking/v1alpha3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/endpoint-watcher/internal/bustest"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
)

const (
	svcType = "sailplane.dev/discovery/v1/Service"
	epsType = "sailplane.dev/discovery/v1/Endpoints"
)

// parse decodes exactly one YAML document.
func parse(t *testing.T, doc string) (string, *bus.Resource) {
	t.Helper()
	byType, err := bustest.ParseYAML([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	for typeURL, rs := range byType {
		if len(rs) == 1 && len(byType) == 1 {
			return typeURL, rs[0]
		}
	}
	t.Fatalf("want one document, got %v", byType)
	return "", nil
}

func set(t *testing.T, x *Index, doc string) {
	t.Helper()
	typeURL, r := parse(t, doc)
	var err error
	if typeURL == schema.ServiceEntry.TypeURL {
		err = x.SetServiceEntry(r)
	} else {
		err = x.SetWorkloadEntry(r)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func selectorSE(name, host, app string) string {
	return fmt.Sprintf(`
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: %s, namespace: ns}
spec:
  hosts: [%s]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{name: http, number: 80, protocol: HTTP}]
  workloadSelector: {labels: {app: %s}}
`, name, host, app)
}

func we(name, ns, addr string, labels string) string {
	return fmt.Sprintf(`
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: %s, namespace: %s}
spec: {address: %s, labels: %s}
`, name, ns, addr, labels)
}

// setup loads the initial state, flushes it, and forgets those calls.
func setup(t *testing.T, docs ...string) (*Index, *bustest.Recorder) {
	t.Helper()
	x, rec := NewIndex("Kubernetes"), bustest.NewRecorder()
	for _, d := range docs {
		set(t, x, d)
	}
	x.Flush(rec)
	rec.Reset()
	return x, rec
}

func wantCalls(t *testing.T, rec *bustest.Recorder, want ...bustest.Call) {
	t.Helper()
	got := rec.Calls()
	if len(got) != len(want) {
		t.Fatalf("calls = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].Op != want[i].Op || got[i].TypeURL != want[i].TypeURL || !slices.Equal(got[i].Names, want[i].Names) {
			t.Fatalf("call %d = %+v, want %+v (all: %+v)", i, got[i], want[i], got)
		}
	}
}

func endpointsOf(t *testing.T, rec *bustest.Recorder, name string) []string {
	t.Helper()
	r := rec.State(epsType)[name]
	if r == nil {
		t.Fatalf("no Endpoints %s", name)
	}
	var addrs []string
	for _, ep := range r.Body.(*discoveryv1.Endpoints).GetEndpoints() {
		addrs = append(addrs, ep.GetAddress())
	}
	return addrs
}

func TestIncremental(t *testing.T) {
	reviews := selectorSE("reviews", "reviews.ns.example", "reviews")
	ratings := selectorSE("ratings", "ratings.ns.example", "ratings")
	both := selectorSE("all", "all.ns.example", "reviews")

	t.Run("WE address change upserts one Endpoints and no Service", func(t *testing.T) {
		x, rec := setup(t, reviews, ratings, we("r1", "ns", "10.0.0.1", "{app: reviews}"))
		set(t, x, we("r1", "ns", "10.0.0.2", "{app: reviews}"))
		x.Flush(rec)
		wantCalls(t, rec, bustest.Call{Op: "Upsert", TypeURL: epsType, Names: []string{"ns/reviews.ns.example"}})
		if got := endpointsOf(t, rec, "ns/reviews.ns.example"); !slices.Equal(got, []string{"10.0.0.2"}) {
			t.Errorf("endpoints = %v", got)
		}
	})

	t.Run("WE matching two SEs upserts both Endpoints", func(t *testing.T) {
		x, rec := setup(t, reviews, ratings, both)
		set(t, x, we("r1", "ns", "10.0.0.1", "{app: reviews}"))
		x.Flush(rec)
		wantCalls(t, rec, bustest.Call{Op: "Upsert", TypeURL: epsType,
			Names: []string{"ns/all.ns.example", "ns/reviews.ns.example"}})
	})

	t.Run("deleting an SE deletes its Service and Endpoints", func(t *testing.T) {
		x, rec := setup(t, reviews, ratings, we("r1", "ns", "10.0.0.1", "{app: reviews}"))
		x.DeleteServiceEntry("ns/reviews")
		x.Flush(rec)
		wantCalls(t, rec,
			bustest.Call{Op: "Delete", TypeURL: svcType, Names: []string{"ns/reviews.ns.example"}},
			bustest.Call{Op: "Delete", TypeURL: epsType, Names: []string{"ns/reviews.ns.example"}})
		if _, ok := rec.State(svcType)["ns/ratings.ns.example"]; !ok {
			t.Error("ratings Service was removed")
		}
	})

	t.Run("unchanged content publishes nothing", func(t *testing.T) {
		x, rec := setup(t, reviews, we("r1", "ns", "10.0.0.1", "{app: reviews}"))
		set(t, x, reviews)
		set(t, x, we("r1", "ns", "10.0.0.1", "{app: reviews}"))
		x.Flush(rec)
		wantCalls(t, rec)
	})

	t.Run("WE in another namespace or not matching changes nothing", func(t *testing.T) {
		x, rec := setup(t, reviews)
		set(t, x, we("r1", "other", "10.0.0.1", "{app: reviews}"))
		set(t, x, we("r2", "ns", "10.0.0.2", "{app: details}"))
		x.Flush(rec)
		wantCalls(t, rec)
	})

	t.Run("WE relabelled out of a selector leaves its endpoints", func(t *testing.T) {
		x, rec := setup(t, reviews, ratings, we("r1", "ns", "10.0.0.1", "{app: reviews}"))
		set(t, x, we("r1", "ns", "10.0.0.1", "{app: ratings}"))
		x.Flush(rec)
		wantCalls(t, rec, bustest.Call{Op: "Upsert", TypeURL: epsType,
			Names: []string{"ns/ratings.ns.example", "ns/reviews.ns.example"}})
		if got := endpointsOf(t, rec, "ns/reviews.ns.example"); len(got) != 0 {
			t.Errorf("reviews endpoints = %v, want none", got)
		}
	})

	t.Run("deleting a WE upserts the Endpoints", func(t *testing.T) {
		x, rec := setup(t, reviews, we("r1", "ns", "10.0.0.1", "{app: reviews}"))
		x.DeleteWorkloadEntry("ns/r1")
		x.DeleteWorkloadEntry("ns/unknown")
		x.Flush(rec)
		wantCalls(t, rec, bustest.Call{Op: "Upsert", TypeURL: epsType, Names: []string{"ns/reviews.ns.example"}})
	})

	t.Run("SE label change upserts the Service only", func(t *testing.T) {
		x, rec := setup(t, reviews)
		_, r := parse(t, reviews)
		r.Labels = map[string]string{"team": "a"}
		if err := x.SetServiceEntry(r); err != nil {
			t.Fatal(err)
		}
		x.Flush(rec)
		wantCalls(t, rec, bustest.Call{Op: "Upsert", TypeURL: svcType, Names: []string{"ns/reviews.ns.example"}})
	})

	t.Run("host removed from an SE deletes only that host", func(t *testing.T) {
		x, rec := setup(t, `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: multi, namespace: ns}
spec: {hosts: [a.example, b.example], ports: [{name: http, number: 80}]}
`)
		set(t, x, `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: multi, namespace: ns}
spec: {hosts: [b.example], ports: [{name: http, number: 80}]}
`)
		x.Flush(rec)
		wantCalls(t, rec,
			bustest.Call{Op: "Delete", TypeURL: svcType, Names: []string{"ns/a.example"}},
			bustest.Call{Op: "Delete", TypeURL: epsType, Names: []string{"ns/a.example"}})
	})

	t.Run("deleting one of two merged SEs keeps the host", func(t *testing.T) {
		first := `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: first, namespace: ns, creationTimestamp: "2024-01-01T00:00:00Z"}
spec: {hosts: [m.example], ports: [{name: http, number: 80}], endpoints: [{address: 10.0.0.1}]}
`
		second := `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: second, namespace: ns, creationTimestamp: "2024-02-01T00:00:00Z"}
spec: {hosts: [m.example], ports: [{name: tcp, number: 81}], endpoints: [{address: 10.0.0.2}]}
`
		x, rec := setup(t, first, second)
		x.DeleteServiceEntry("ns/first")
		x.Flush(rec)
		wantCalls(t, rec,
			bustest.Call{Op: "Upsert", TypeURL: svcType, Names: []string{"ns/m.example"}},
			bustest.Call{Op: "Upsert", TypeURL: epsType, Names: []string{"ns/m.example"}})
		if got := endpointsOf(t, rec, "ns/m.example"); !slices.Equal(got, []string{"10.0.0.2"}) {
			t.Errorf("endpoints = %v", got)
		}
	})

	t.Run("untranslatable update keeps the last good version", func(t *testing.T) {
		x, rec := setup(t, reviews, ratings)
		_, r := parse(t, reviews)
		r.Body.(*networking.ServiceEntry).Ports[0].Number = 0
		err := x.SetServiceEntry(r)
		var te *TranslationError
		if !errors.As(err, &te) || te.Field != "spec.ports[0].number" || te.Namespace != "ns" || te.Name != "reviews" {
			t.Fatalf("err = %v", err)
		}
		x.Flush(rec)
		wantCalls(t, rec)
		if len(rec.State(svcType)) != 2 {
			t.Errorf("services = %v", rec.State(svcType))
		}
	})

	t.Run("bodies as Any are accepted", func(t *testing.T) {
		x, rec := setup(t)
		_, r := parse(t, reviews)
		a, err := anypb.New(r.Body)
		if err != nil {
			t.Fatal(err)
		}
		r.Body = a
		if err := x.SetServiceEntry(r); err != nil {
			t.Fatal(err)
		}
		x.Flush(rec)
		if _, ok := rec.State(svcType)["ns/reviews.ns.example"]; !ok {
			t.Error("no Service published")
		}
	})
}

func TestUntranslatable(t *testing.T) {
	cases := []struct {
		name  string
		kind  string
		res   *bus.Resource
		field string
	}{
		{"SE wrong body", "ServiceEntry", &bus.Resource{Name: "ns/a", Body: &networking.WorkloadEntry{}}, "body"},
		{"SE without namespace", "ServiceEntry", &bus.Resource{Name: "a", Body: &networking.ServiceEntry{}}, "metadata.namespace"},
		{"SE without hosts", "ServiceEntry", &bus.Resource{Name: "ns/a", Body: &networking.ServiceEntry{}}, "spec.hosts"},
		{"SE empty host", "ServiceEntry", &bus.Resource{Name: "ns/a", Body: &networking.ServiceEntry{Hosts: []string{"a", ""}}}, "spec.hosts[1]"},
		{"SE unknown resolution", "ServiceEntry", &bus.Resource{Name: "ns/a", Body: &networking.ServiceEntry{
			Hosts: []string{"a"}, Resolution: 42}}, "spec.resolution"},
		{"SE duplicate port name", "ServiceEntry", &bus.Resource{Name: "ns/a", Body: &networking.ServiceEntry{
			Hosts: []string{"a"}, Ports: []*networking.ServicePort{{Name: "p", Number: 1}, {Name: "p", Number: 2}}}}, "spec.ports[1].name"},
		{"SE bad targetPort", "ServiceEntry", &bus.Resource{Name: "ns/a", Body: &networking.ServiceEntry{
			Hosts: []string{"a"}, Ports: []*networking.ServicePort{{Name: "p", Number: 1, TargetPort: 1 << 20}}}}, "spec.ports[0].targetPort"},
		{"SE endpoint without address", "ServiceEntry", &bus.Resource{Name: "ns/a", Body: &networking.ServiceEntry{
			Hosts: []string{"a"}, Endpoints: []*networking.WorkloadEntry{{Address: "1.1.1.1"}, {}}}}, "spec.endpoints[1].address"},
		{"SE endpoint bad port", "ServiceEntry", &bus.Resource{Name: "ns/a", Body: &networking.ServiceEntry{
			Hosts: []string{"a"}, Endpoints: []*networking.WorkloadEntry{{Address: "1.1.1.1", Ports: map[string]uint32{"p": 70000}}}}}, "spec.endpoints[0].ports.p"},
		{"WE wrong body", "WorkloadEntry", &bus.Resource{Name: "ns/a", Body: &networking.ServiceEntry{}}, "body"},
		{"WE bad locality", "WorkloadEntry", &bus.Resource{Name: "ns/a", Body: &networking.WorkloadEntry{
			Address: "1.1.1.1", Locality: "a/b/c/d"}}, "spec.locality"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x := NewIndex("c")
			var err error
			if c.kind == "ServiceEntry" {
				err = x.SetServiceEntry(c.res)
			} else {
				err = x.SetWorkloadEntry(c.res)
			}
			var te *TranslationError
			if !errors.As(err, &te) || !errors.Is(err, ErrUntranslatable) {
				t.Fatalf("err = %v, want a TranslationError", err)
			}
			if te.Kind != c.kind || te.Field != c.field {
				t.Errorf("kind/field = %s/%s, want %s/%s (%v)", te.Kind, te.Field, c.kind, c.field, err)
			}
			rec := bustest.NewRecorder()
			x.Flush(rec)
			wantCalls(t, rec)
		})
	}
}
