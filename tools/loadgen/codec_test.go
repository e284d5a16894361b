package loadgen

import (
	"bytes"
	"slices"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// TestSotWResponseInPieces decodes a response cut into pieces at every size, as gRPC's data
// frames cut it, and checks it against the proto library's decoding.
func TestSotWResponseInPieces(t *testing.T) {
	var res []*anypb.Any
	for _, name := range []string{"80", "outbound|9080||reviews.default.svc.cluster.local"} {
		a, err := anypb.New(&routev3.RouteConfiguration{Name: name, VirtualHosts: []*routev3.VirtualHost{
			{Name: name + ":vh", Domains: []string{"marker-" + name}}}})
		if err != nil {
			t.Fatal(err)
		}
		res = append(res, a)
	}
	want := &discoverygrpc.DiscoveryResponse{VersionInfo: "v7", Nonce: "n3", TypeUrl: RouteType, Resources: res,
		Canary: true}
	enc, err := proto.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	for size := 1; size <= len(enc); size++ {
		var data mem.BufferSlice
		for b := range slices.Chunk(enc, size) {
			data = append(data, mem.SliceBuffer(b))
		}
		var got sotwResponse
		if err := got.unmarshal(data); err != nil {
			t.Fatalf("pieces of %d: %v", size, err)
		}
		if got.version != "v7" || got.nonce != "n3" || got.typeURL != RouteType || got.size != len(enc) {
			t.Fatalf("pieces of %d: version %q nonce %q type %q size %d", size, got.version, got.nonce, got.typeURL, got.size)
		}
		if len(got.values) != len(res) {
			t.Fatalf("pieces of %d: %d values, want %d", size, len(got.values), len(res))
		}
		for i, v := range got.values {
			if !bytes.Equal(v.bytes(), res[i].GetValue()) {
				t.Fatalf("pieces of %d: value %d differs", size, i)
			}
			name := nameField(v.prefix(maxNameLen))
			if name != []string{"80", "outbound|9080||reviews.default.svc.cluster.local"}[i] {
				t.Fatalf("pieces of %d: name %q", size, name)
			}
			if !v.contains([]byte("marker-" + name)) {
				t.Fatalf("pieces of %d: marker of %q not found", size, name)
			}
			if v.contains([]byte("marker-absent")) {
				t.Fatalf("pieces of %d: found an absent marker", size)
			}
		}
		got.free()
	}
}

func TestSotWResponseTruncated(t *testing.T) {
	enc, err := proto.Marshal(&discoverygrpc.DiscoveryResponse{VersionInfo: "v1", Nonce: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	var r sotwResponse
	if err := r.unmarshal(mem.BufferSlice{mem.SliceBuffer(enc[:len(enc)-1])}); err == nil {
		t.Fatal("a truncated response decoded without error")
	}
}
