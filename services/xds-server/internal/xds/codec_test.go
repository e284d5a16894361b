package xds

import (
	"bytes"
	"fmt"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
)

// TestCodec: the zero-copy encoding decodes to the same message as proto.Marshal's, for every
// field of both response types, and leaves other messages to the proto codec.
func TestCodec(t *testing.T) {
	big := make([]byte, 100_000)
	for i := range big {
		big[i] = byte(i)
	}
	anys := []*anypb.Any{
		{TypeUrl: "type.googleapis.com/x", Value: []byte("abc")},
		{TypeUrl: "type.googleapis.com/x", Value: big},
		{TypeUrl: "type.googleapis.com/empty"},
		{},
	}
	cp := &corev3.ControlPlane{Identifier: "sailplane"}
	md := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"k": {}}}
	for name, msg := range map[string]proto.Message{
		"sotw": &discoverygrpc.DiscoveryResponse{VersionInfo: "v1", Resources: anys, Canary: true,
			TypeUrl: "type.googleapis.com/x", Nonce: "7", ControlPlane: cp},
		"sotw empty": &discoverygrpc.DiscoveryResponse{TypeUrl: "t", Nonce: "1"},
		"delta": &discoverygrpc.DeltaDiscoveryResponse{SystemVersionInfo: "3", TypeUrl: "type.googleapis.com/x",
			Nonce: "9", RemovedResources: []string{"gone"}, ControlPlane: cp,
			RemovedResourceNames: []*discoverygrpc.ResourceName{{Name: "gone2"}},
			ResourceErrors:       []*discoverygrpc.ResourceError{{ResourceName: &discoverygrpc.ResourceName{Name: "bad"}}},
			Resources: []*discoverygrpc.Resource{
				{Name: "a", Version: "1", Resource: anys[0], Aliases: []string{"al"}, Ttl: durationpb.New(5),
					CacheControl: &discoverygrpc.Resource_CacheControl{DoNotCache: true}, Metadata: md},
				{Name: "b", Version: "2", Resource: anys[1]},
				{Name: "c", Version: "3"},
				{Name: "d", Resource: anys[3]},
			}},
		"other": &discoverygrpc.DiscoveryRequest{TypeUrl: "t", ResourceNames: []string{"a"}},
	} {
		t.Run(name, func(t *testing.T) {
			data, err := Codec().Marshal(msg)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := msg.(*discoverygrpc.DiscoveryRequest); !ok && name != "sotw empty" {
				shared := false
				for _, b := range data {
					if d := b.ReadOnlyData(); len(d) == len(big) && &d[0] == &big[0] {
						shared = true
					}
				}
				if !shared {
					t.Error("the large resource was copied, want its bytes referenced")
				}
			}
			want, _ := proto.Marshal(msg)
			if data.Len() != len(want) {
				t.Errorf("encoded %d bytes, proto.Marshal gives %d", data.Len(), len(want))
			}
			got := msg.ProtoReflect().New().Interface()
			if err := Codec().Unmarshal(data, got); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, msg) {
				t.Fatalf("round trip differs:\n got %v\nwant %v", got, msg)
			}
		})
	}
}

// TestPreparedResponse: responses built from pre-encoded entries decode to the messages the
// entries stand for, in both protocols.
func TestPreparedResponse(t *testing.T) {
	big := make([]byte, 70_000)
	entries := []*entry{
		newEntry("a", "v1", "type.googleapis.com/x", []byte("abc")),
		newEntry("b", "v2", "type.googleapis.com/x", big),
		newEntry("c", "v3", "type.googleapis.com/x", nil),
	}
	sotw := &discoverygrpc.DiscoveryResponse{TypeUrl: "type.googleapis.com/x", VersionInfo: "9", Nonce: "1"}
	delta := &discoverygrpc.DeltaDiscoveryResponse{TypeUrl: "type.googleapis.com/x", SystemVersionInfo: "9", Nonce: "2",
		RemovedResources: []string{"z"}}
	wantSotW := proto.Clone(sotw).(*discoverygrpc.DiscoveryResponse)
	wantDelta := proto.Clone(delta).(*discoverygrpc.DeltaDiscoveryResponse)
	for _, e := range entries {
		wantSotW.Resources = append(wantSotW.Resources, &anypb.Any{TypeUrl: e.any.GetTypeUrl(), Value: e.any.GetValue()})
		wantDelta.Resources = append(wantDelta.Resources, &discoverygrpc.Resource{Name: e.name, Version: e.version,
			Resource: &anypb.Any{TypeUrl: e.any.GetTypeUrl(), Value: e.any.GetValue()}})
	}
	for name, tc := range map[string]struct {
		prepared *preparedResponse
		want     proto.Message
	}{
		"sotw":  {&preparedResponse{head: sotw, entries: entries}, wantSotW},
		"delta": {&preparedResponse{head: delta, delta: true, entries: entries}, wantDelta},
	} {
		t.Run(name, func(t *testing.T) {
			data, err := Codec().Marshal(tc.prepared)
			if err != nil {
				t.Fatal(err)
			}
			got := tc.want.ProtoReflect().New().Interface()
			if err := proto.Unmarshal(data.Materialize(), got); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, tc.want) {
				t.Fatalf("decoded %v\nwant %v", got, tc.want)
			}
		})
	}
}

// TestUnmarshalRequest: the request decoder that shares the names' bytes gives what
// proto.Unmarshal gives, and refuses what it refuses.
func TestUnmarshalRequest(t *testing.T) {
	var many []string
	for i := range 40 {
		many = append(many, fmt.Sprintf("outbound|80||svc-%d", i))
	}
	for name, names := range map[string][]string{"few": {"outbound|80||a", "outbound|80||b", ""}, "many": many, "none": nil} {
		t.Run(name, func(t *testing.T) {
			req := &discoverygrpc.DiscoveryRequest{VersionInfo: "v", TypeUrl: "t", ResponseNonce: "3",
				Node: &corev3.Node{Id: "sidecar~1.2.3.4~a.b~b.svc.cluster.local"}, ResourceNames: names}
			b, _ := proto.Marshal(req)
			for _, owned := range []bool{false, true, false} { // the last from the cache
				buf := bytes.Clone(b)
				var got discoverygrpc.DiscoveryRequest
				if err := unmarshalRequest(buf, owned, &got); err != nil {
					t.Fatal(err)
				}
				if !owned {
					clear(buf) // borrowed bytes are reused by gRPC once we return
				}
				if !proto.Equal(&got, req) {
					t.Fatalf("owned=%v: got %v, want %v", owned, &got, req)
				}
			}
			bad := append(bytes.Clone(b), 0x1a, 0x01, 0xff) // resource_names: "\xff"
			if err := unmarshalRequest(bad, true, &discoverygrpc.DiscoveryRequest{}); err == nil {
				t.Error("invalid UTF-8 name accepted")
			}
			if err := unmarshalRequest(b[:len(b)-2], true, &discoverygrpc.DiscoveryRequest{}); err == nil {
				t.Error("truncated request accepted")
			}
		})
	}
}
