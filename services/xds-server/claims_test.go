package xdsserver

import (
	"crypto/tls"
	"errors"
	"io"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// TestNodeClaimsMatchCertificate: over TLS, a proxy whose certificate names one namespace or
// service account cannot claim another's (it would be served that workload's config); a
// matching claim is served, and a client without a certificate (nor a token) is refused. Over
// plaintext no identity is asked, as istiod asks none on 15010.
func TestNodeClaimsMatchCertificate(t *testing.T) {
	srv, mesh := secureServer(t)
	cert := issueFor(t, mesh, "demo", "web")
	withCert := credentials.NewTLS(&tls.Config{RootCAs: mesh.RootPool(), ServerName: "istiod.istio-system.svc", Certificates: []tls.Certificate{cert}})
	noCert := credentials.NewTLS(&tls.Config{RootCAs: mesh.RootPool(), ServerName: "istiod.istio-system.svc"})

	node := func(ns, sa string) *corev3.Node {
		n := &corev3.Node{Id: "sidecar~10.0.0.1~web-1." + ns + "~" + ns + ".svc.cluster.local"}
		if sa != "" {
			n.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{"SERVICE_ACCOUNT": structpb.NewStringValue(sa)}}
		}
		return n
	}
	for _, tc := range []struct {
		name  string
		creds credentials.TransportCredentials
		node  *corev3.Node
		want  codes.Code
	}{
		{"certificate and claims agree", withCert, node("demo", "web"), codes.OK},
		{"no service account claimed", withCert, node("demo", ""), codes.OK},
		{"another namespace claimed", withCert, node("payments", "web"), codes.PermissionDenied},
		{"another service account claimed", withCert, node("demo", "admin"), codes.PermissionDenied},
		{"TLS without a certificate", noCert, node("payments", "admin"), codes.Unauthenticated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := firstResponse(t, srv.SecureAddr().String(), tc.creds, clusters(tc.node))
			if got := status.Code(err); got != tc.want {
				t.Errorf("first response: %v, want %v", got, tc.want)
			}
		})
	}
	if _, err := firstResponse(t, srv.Addr().String(), insecure.NewCredentials(), clusters(node("payments", "admin"))); err != nil {
		t.Errorf("plaintext: %v, want an answer", err)
	}
}

func clusters(node *corev3.Node) *discoverygrpc.DiscoveryRequest {
	return &discoverygrpc.DiscoveryRequest{TypeUrl: resourcev3.ClusterType, Node: node}
}

// firstResponse opens an ADS stream, sends req and returns the first response, or the stream's error.
func firstResponse(t *testing.T, addr string, creds credentials.TransportCredentials, req *discoverygrpc.DiscoveryRequest) (*discoverygrpc.DiscoveryResponse, error) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(streamContext(t))
	if err != nil {
		return nil, err
	}
	// A Send failing with io.EOF means the server ended the stream: Recv has its status.
	if err := stream.Send(req); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return stream.Recv()
}
