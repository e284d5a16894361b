package model

import (
	"errors"
	"slices"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
)

func TestParseProxy(t *testing.T) {
	md := func(m map[string]any) *structpb.Struct {
		s, err := structpb.NewStruct(m)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, tc := range []struct {
		name string
		node *corev3.Node
		want Proxy
	}{
		{
			name: "sidecar with metadata",
			node: &corev3.Node{Id: "sidecar~10.1.2.3~reviews-v1-abc.bookinfo~bookinfo.svc.cluster.local", Metadata: md(map[string]any{
				"NAMESPACE": "bookinfo", "LABELS": map[string]any{"app": "reviews", "version": "v1", "n": 1.0},
				"SERVICE_ACCOUNT": "bookinfo-reviews", "CLUSTER_ID": "east", "ISTIO_VERSION": "1.31.1",
			})},
			want: Proxy{Type: SidecarProxy, ID: "reviews-v1-abc.bookinfo", IPs: []string{"10.1.2.3"},
				DNSDomain: "bookinfo.svc.cluster.local", Namespace: "bookinfo",
				Labels: map[string]string{"app": "reviews", "version": "v1"}, ServiceAccount: "bookinfo-reviews",
				ClusterID: "east", IstioVersion: "1.31.1"},
		},
		{
			name: "router, namespace from the DNS domain, default cluster",
			node: &corev3.Node{Id: "router~10.0.0.1~gw-1.istio-system~istio-system.svc.cluster.local"},
			want: Proxy{Type: Router, ID: "gw-1.istio-system", IPs: []string{"10.0.0.1"},
				DNSDomain: "istio-system.svc.cluster.local", Namespace: "istio-system", Labels: map[string]string{},
				ClusterID: DefaultClusterID},
		},
		{
			name: "proxyless by GENERATOR, namespace from the ID, INSTANCE_IPS",
			node: &corev3.Node{Id: "sidecar~10.0.0.2~app-1.demo~", Metadata: md(map[string]any{
				"GENERATOR": "grpc", "INSTANCE_IPS": "10.0.0.2, fd00::2"})},
			want: Proxy{Type: Proxyless, ID: "app-1.demo", IPs: []string{"10.0.0.2", "fd00::2"}, Namespace: "demo",
				Labels: map[string]string{}, ClusterID: DefaultClusterID, Generator: "grpc"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseProxy(tc.node)
			if err != nil {
				t.Fatal(err)
			}
			tc.want.NodeID = tc.node.GetId()
			if got.Type != tc.want.Type || got.ID != tc.want.ID || !slices.Equal(got.IPs, tc.want.IPs) ||
				got.DNSDomain != tc.want.DNSDomain || got.Namespace != tc.want.Namespace ||
				got.ServiceAccount != tc.want.ServiceAccount || got.ClusterID != tc.want.ClusterID ||
				got.IstioVersion != tc.want.IstioVersion || got.Generator != tc.want.Generator ||
				got.NodeID != tc.want.NodeID || len(got.Labels) != len(tc.want.Labels) {
				t.Fatalf("got %+v\nwant %+v", *got, tc.want)
			}
			for k, v := range tc.want.Labels {
				if got.Labels[k] != v {
					t.Errorf("label %s = %q, want %q", k, got.Labels[k], v)
				}
			}
			if !got.HasIP(tc.want.IPs[0]) || got.HasIP("192.0.2.99") {
				t.Error("HasIP")
			}
		})
	}
}

func TestParseProxyMalformed(t *testing.T) {
	for name, id := range map[string]string{
		"empty":        "",
		"three parts":  "sidecar~10.0.0.1~pod.ns",
		"unknown type": "waypoint~10.0.0.1~pod.ns~ns.svc.cluster.local",
		"bad ip":       "sidecar~not-an-ip~pod.ns~ns.svc.cluster.local",
		"no namespace": "sidecar~10.0.0.1~pod~",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ParseProxy(&corev3.Node{Id: id})
			var nie *NodeIDError
			if !errors.Is(err, ErrMalformedNodeID) || !errors.As(err, &nie) || nie.NodeID != id {
				t.Fatalf("ParseProxy(%q) = %v, want a NodeIDError", id, err)
			}
		})
	}
	if _, err := ParseProxy(nil); !errors.Is(err, ErrMalformedNodeID) {
		t.Fatalf("nil node: %v", err)
	}
}

func TestProxyLocality(t *testing.T) {
	node := &discoveryv1.Locality{Region: "node"}
	registry := &discoveryv1.Endpoint{Locality: &discoveryv1.Locality{Region: "reg", Zone: "z"}}
	tests := []struct {
		name   string
		labels map[string]string
		self   *discoveryv1.Endpoint
		want   *discoveryv1.Locality
	}{
		{"registry first", map[string]string{LabelRegion: "label"}, registry, registry.GetLocality()},
		{"topology labels", map[string]string{LabelZone: "zone-b", LabelLocality: "x/y"}, &discoveryv1.Endpoint{},
			&discoveryv1.Locality{Zone: "zone-b"}},
		{"locality label with dots", map[string]string{LabelLocality: "r.z.s"}, nil,
			&discoveryv1.Locality{Region: "r", Zone: "z", SubZone: "s"}},
		{"legacy label", map[string]string{"istio-locality": "r/z"}, nil, &discoveryv1.Locality{Region: "r", Zone: "z"}},
		{"node last", nil, nil, node},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := &Proxy{Labels: tc.labels, NodeLocality: node}
			if got := p.Locality(tc.self); !proto.Equal(got, tc.want) {
				t.Errorf("Locality = %v, want %v", got, tc.want)
			}
		})
	}
}
