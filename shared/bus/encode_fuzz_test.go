package bus

import (
	"maps"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	networking "istio.io/api/networking/v1alpha3"
)

// FuzzDecodeMCP: whatever a consumer receives as a resource, decoding it never panics and
// either fails or gives a named, versioned resource that encodes again (to the size the Store
// computes without encoding) and decodes back to itself.
func FuzzDecodeMCP(f *testing.F) {
	for _, r := range []*Resource{
		{Name: "ns/empty"},
		{Name: "ns/vs", Version: "v1", Body: &networking.VirtualService{Hosts: []string{"a", "b"},
			Http: []*networking.HTTPRoute{{Route: []*networking.HTTPRouteDestination{{Destination: &networking.Destination{Host: "a"}}}}}}},
		{Name: "mesh", Version: "v", CreateTime: time.Unix(1700000000, 5),
			Labels: map[string]string{"app": "x", "": ""}, Annotations: map[string]string{"note": "y"},
			Body: &networking.DestinationRule{Host: "a"}},
	} {
		m, err := toMCP(r)
		if err != nil {
			f.Fatal(err)
		}
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(mcpResourceTypeURL, b)
	}
	f.Add(mcpResourceTypeURL, []byte{})
	f.Add("type.googleapis.com/istio.networking.v1alpha3.VirtualService", []byte{0x0a, 0x01, 'a'})

	f.Fuzz(func(t *testing.T, typeURL string, value []byte) {
		r, err := decodeMCP(&anypb.Any{TypeUrl: typeURL, Value: value})
		if err != nil {
			if r != nil {
				t.Fatalf("error %v with a resource", err)
			}
			return
		}
		if r.Name == "" || r.Version == "" {
			t.Fatalf("decoded a resource without a name or version: %+v", r)
		}
		m, err := toMCP(r)
		if err != nil {
			t.Fatalf("decoded resource does not encode: %v", err)
		}
		if got, want := wireSize(r, r.Version, -1), proto.Size(m); got != want {
			t.Fatalf("wireSize = %d, encoded size %d", got, want)
		}
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatalf("decoded resource does not encode: %v", err)
		}
		back, err := decodeMCP(&anypb.Any{TypeUrl: mcpResourceTypeURL, Value: b})
		if err != nil {
			t.Fatalf("re-encoded resource does not decode: %v", err)
		}
		if back.Name != r.Name || back.Version != r.Version || !maps.Equal(back.Labels, r.Labels) ||
			!maps.Equal(back.Annotations, r.Annotations) || !back.CreateTime.Equal(r.CreateTime) ||
			(back.Body == nil) != (r.Body == nil) || r.Body != nil && !proto.Equal(back.Body, r.Body) {
			t.Fatalf("round trip: %+v, want %+v", back, r)
		}
	})
}
