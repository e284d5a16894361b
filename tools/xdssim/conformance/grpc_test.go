package conformance

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	pb "sigs.k8s.io/gateway-api/conformance/echo-basic/grpcechoserver"
	grpcutil "sigs.k8s.io/gateway-api/conformance/utils/grpc"

	"sailplane.dev/tools/xdsdiff"
)

// echoServer answers like the suite's gRPC echo backend: the method, authority and headers.
type echoServer struct {
	pb.UnimplementedGrpcEchoServer
}

func (echoServer) Echo(ctx context.Context, in *pb.EchoRequest) (*pb.EchoResponse, error) {
	a := &pb.Assertions{FullyQualifiedMethod: pb.GrpcEcho_Echo_FullMethodName, Context: &pb.Context{Pod: "grpc-a"}}
	md, _ := metadata.FromIncomingContext(ctx)
	if vs := md.Get(":authority"); len(vs) > 0 {
		a.Authority = vs[0]
	}
	for k, vs := range md {
		for _, v := range vs {
			a.Headers = append(a.Headers, &pb.Header{Key: k, Value: v})
		}
	}
	return &pb.EchoResponse{Assertions: a, Request: in}, nil
}

func TestGRPCClient(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pb.RegisterGrpcEchoServer(srv, echoServer{})
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	defer func() { srv.Stop(); <-done }()
	_, p, _ := net.SplitHostPort(lis.Addr().String())
	port, _ := strconv.Atoi(p)

	route := &routev3.Route{
		Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Path{Path: pb.GrpcEcho_Echo_FullMethodName},
			Headers: []*routev3.HeaderMatcher{{Name: "x-pick", HeaderMatchSpecifier: &routev3.HeaderMatcher_PresentMatch{PresentMatch: true}}}},
		Action: &routev3.Route_Route{Route: &routev3.RouteAction{
			ClusterSpecifier:     &routev3.RouteAction_Cluster{Cluster: "g"},
			HostRewriteSpecifier: &routev3.RouteAction_HostRewriteLiteral{HostRewriteLiteral: "echo.internal"},
		}},
		RequestHeadersToAdd: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "x-added", Value: "yes"}}},
	}
	rc := &routev3.RouteConfiguration{VirtualHosts: []*routev3.VirtualHost{{Name: "grpc", Domains: []string{"grpc.example.com"}, Routes: []*routev3.Route{route}}}}
	hcm := &hcmv3.HttpConnectionManager{RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: rc}}
	l := &listenerv3.Listener{Name: "0.0.0.0_80", Address: addr("0.0.0.0", 80), FilterChains: []*listenerv3.FilterChain{{
		Filters: []*listenerv3.Filter{{Name: "envoy.filters.network.http_connection_manager",
			ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(t, hcm)}}}}}}
	snap := xdsdiff.Snapshot{}
	for _, m := range []proto.Message{l, edsCluster("g"), cla("g", "127.0.0.1", uint32(port))} {
		a := mustAny(t, m)
		snap[a.TypeUrl] = append(snap[a.TypeUrl], a)
	}
	c := &GRPCClient{RT: &RoundTripper{Fetch: func(context.Context, string) (xdsdiff.Snapshot, error) { return snap, nil }}}
	defer c.Close()
	const gw = "198.18.0.1:80"
	send := func(t *testing.T, exp grpcutil.ExpectedResponse) *grpcutil.Response {
		t.Helper()
		resp, err := c.SendRPC(t, gw, exp, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	t.Run("routed by method and header", func(t *testing.T) {
		resp := send(t, grpcutil.ExpectedResponse{EchoRequest: &pb.EchoRequest{},
			RequestMetadata: &grpcutil.RequestMetadata{Authority: "grpc.example.com", Metadata: map[string]string{"x-pick": "1"}}})
		if resp.Code != codes.OK {
			t.Fatalf("code %v", resp.Code)
		}
		a := resp.Response.GetAssertions()
		headers := map[string]string{}
		for _, h := range a.GetHeaders() {
			headers[h.GetKey()] = h.GetValue()
		}
		if a.GetAuthority() != "echo.internal" || headers["x-added"] != "yes" || headers["x-pick"] != "1" {
			t.Errorf("authority %q, headers %v", a.GetAuthority(), headers)
		}
	})
	t.Run("no route is Unimplemented", func(t *testing.T) {
		resp := send(t, grpcutil.ExpectedResponse{EchoTwoRequest: &pb.EchoRequest{},
			RequestMetadata: &grpcutil.RequestMetadata{Authority: "grpc.example.com", Metadata: map[string]string{"x-pick": "1"}}})
		if resp.Code != codes.Unimplemented {
			t.Errorf("code %v, want Unimplemented (Envoy's 404 NR)", resp.Code)
		}
	})
	t.Run("header matcher misses", func(t *testing.T) {
		resp := send(t, grpcutil.ExpectedResponse{EchoRequest: &pb.EchoRequest{},
			RequestMetadata: &grpcutil.RequestMetadata{Authority: "grpc.example.com"}})
		if resp.Code != codes.Unimplemented {
			t.Errorf("code %v, want Unimplemented", resp.Code)
		}
	})
}
