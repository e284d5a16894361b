package conformance

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	pb "sigs.k8s.io/gateway-api/conformance/echo-basic/grpcechoserver"
	grpcutil "sigs.k8s.io/gateway-api/conformance/utils/grpc"

	"sailplane.dev/tools/xdssim"
)

// GRPCClient is the suite's grpc.Client (suite.ConformanceOptions.GRPCClient) over the
// simulator: the RPC's method path, authority and metadata are simulated as an HTTP/2 gRPC
// request to the gateway, then the RPC is made to the echo backend the simulation picked,
// with the rewritten authority and the mutated metadata. It shares RoundTripper's cache.
type GRPCClient struct {
	RT *RoundTripper
}

var _ grpcutil.Client = (*GRPCClient)(nil)

// Close releases nothing: every RPC uses its own connection.
func (c *GRPCClient) Close() {}

// SendRPC simulates one echo RPC to the gateway at address.
func (c *GRPCClient) SendRPC(t *testing.T, address string, expected grpcutil.ExpectedResponse, timeout time.Duration) (*grpcutil.Response, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var method string
	var in *pb.EchoRequest
	switch {
	case expected.EchoRequest != nil:
		method, in = pb.GrpcEcho_Echo_FullMethodName, expected.EchoRequest
	case expected.EchoTwoRequest != nil:
		method, in = pb.GrpcEcho_EchoTwo_FullMethodName, expected.EchoTwoRequest
	case expected.EchoThreeRequest != nil:
		method, in = pb.GrpcEcho_EchoThree_FullMethodName, expected.EchoThreeRequest
	default:
		return &grpcutil.Response{}, errors.New("no request specified")
	}
	host, portStr, err := net.SplitHostPort(address)
	if err != nil {
		return &grpcutil.Response{}, fmt.Errorf("gateway address %q: %w", address, err)
	}
	port, _ := strconv.Atoi(portStr)
	req := xdssim.Request{Port: uint32(port), DestinationIP: host, Protocol: xdssim.GRPC, Host: address,
		Method: http.MethodPost, Path: method, Headers: http.Header{}, Pick: c.RT.pick()}
	if md := expected.RequestMetadata; md != nil {
		if md.Authority != "" {
			req.Host = md.Authority
		}
		for k, v := range md.Metadata {
			req.Headers.Set(k, v)
		}
	}
	sim, err := c.RT.simulator(ctx, address)
	if err != nil {
		return &grpcutil.Response{}, err
	}
	resp := &grpcutil.Response{Headers: &metadata.MD{}, Trailers: &metadata.MD{}}
	res, err := sim.Simulate(req)
	if err != nil {
		r := xdssim.ErrorResponse(err)
		if r == nil {
			return resp, err // the connection fails
		}
		resp.Code = grpcCode(r.StatusCode)
		return resp, nil
	}
	switch res.Action {
	case xdssim.DirectResponse:
		resp.Code = grpcCode(res.Direct.Status)
		return resp, nil
	case xdssim.Redirect:
		resp.Code = grpcCode(res.Redirect.Status)
		return resp, nil
	}
	if res.Upstream == nil || res.Endpoint == "" {
		return resp, fmt.Errorf("gRPC request forwarded as %s: not an HTTP route", res.NetworkFilter)
	}
	if res.UpstreamTLS != nil {
		return resp, fmt.Errorf("%w: cluster %s", xdssim.ErrUpstreamTLS, res.Cluster)
	}
	target := res.Endpoint
	if c.RT.Forwarder.Dial != nil {
		target = c.RT.Forwarder.Dial(target)
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithAuthority(res.Upstream.Host))
	if err != nil {
		return resp, err
	}
	defer conn.Close()
	out := metadata.MD{}
	for k, vs := range res.Upstream.Headers {
		k = strings.ToLower(k)
		if k == "content-type" || k == "te" || strings.HasPrefix(k, "grpc-") {
			continue // gRPC sets these itself
		}
		out[k] = append(out[k], vs...)
	}
	ctx = metadata.NewOutgoingContext(ctx, out)
	stub := pb.NewGrpcEchoClient(conn)
	call := stub.Echo
	switch res.Upstream.Path {
	case pb.GrpcEcho_EchoTwo_FullMethodName:
		call = stub.EchoTwo
	case pb.GrpcEcho_EchoThree_FullMethodName:
		call = stub.EchoThree
	case pb.GrpcEcho_Echo_FullMethodName:
	default:
		// A rewritten method the echo server does not have: what it would answer.
		resp.Code = codes.Unimplemented
		return resp, nil
	}
	resp.Response, err = call(ctx, in, grpc.Header(resp.Headers), grpc.Trailer(resp.Trailers))
	resp.Code = status.Code(err)
	return resp, nil
}

// grpcCode maps Envoy's HTTP status to the gRPC status it answers a gRPC client with.
func grpcCode(httpStatus int) codes.Code {
	switch httpStatus {
	case http.StatusOK:
		return codes.OK
	case http.StatusBadRequest:
		return codes.Internal
	case http.StatusUnauthorized:
		return codes.Unauthenticated
	case http.StatusForbidden:
		return codes.PermissionDenied
	case http.StatusNotFound:
		return codes.Unimplemented
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return codes.Unavailable
	}
	return codes.Unknown
}
