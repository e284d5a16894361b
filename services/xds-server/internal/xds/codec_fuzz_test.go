package xds

import (
	"bytes"
	"fmt"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
)

// FuzzUnmarshalRequest: whatever bytes a proxy sends, the request decoder refuses them when
// proto.Unmarshal does and otherwise decodes the same message, whether it may keep the bytes or
// not (borrowed bytes are overwritten once it returns), and whether the names come from the
// cache of known lists or not.
func FuzzUnmarshalRequest(f *testing.F) {
	var many []string
	for i := range 20 {
		many = append(many, fmt.Sprintf("outbound|80||svc-%d.default.svc.cluster.local", i))
	}
	for _, req := range []*discoverygrpc.DiscoveryRequest{
		{},
		{VersionInfo: "v", TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster", ResponseNonce: "3",
			Node: &corev3.Node{Id: "sidecar~10.0.0.1~web-1.app~app.svc.cluster.local"}, ResourceNames: []string{"a", "", "b"}},
		{TypeUrl: "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment", ResourceNames: many},
	} {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(append(bytes.Clone(b), 0x1a, 0x01, 0xff)) // a name that is not UTF-8
		f.Add(append(bytes.Clone(b), 0x18, 0x01))       // field 3 as a varint: an unknown field
	}

	f.Fuzz(func(t *testing.T, b []byte) {
		want := &discoverygrpc.DiscoveryRequest{}
		wantErr := proto.Unmarshal(b, want)
		for _, owned := range []bool{false, true, false} { // the last may come from the cache
			buf := bytes.Clone(b)
			got := &discoverygrpc.DiscoveryRequest{}
			err := unmarshalRequest(buf, owned, got)
			if !owned {
				clear(buf)
			}
			if (err == nil) != (wantErr == nil) {
				t.Fatalf("owned=%v: error %v, proto.Unmarshal's %v", owned, err, wantErr)
			}
			if err == nil && !proto.Equal(got, want) {
				t.Fatalf("owned=%v: decoded %v, proto.Unmarshal's %v", owned, got, want)
			}
		}
	})
}
