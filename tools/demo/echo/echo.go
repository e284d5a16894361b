// Package echo is the demo's gRPC service, shared by the demo binary (tools/demo) and the
// end-to-end tests: a backend answering grpc.testing.TestService/UnaryCall with its own ID, so
// a client can tell which backend served each RPC and count a traffic split.
package echo

import (
	"context"
	"fmt"
	"io"
	"slices"

	"google.golang.org/grpc"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
)

// Server answers every UnaryCall with its ID.
type Server struct {
	testpb.UnimplementedTestServiceServer
	ID string
}

// UnaryCall answers with the server's ID.
func (s *Server) UnaryCall(context.Context, *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	return &testpb.SimpleResponse{ServerId: s.ID}, nil
}

// Client calls echo servers.
type Client = testpb.TestServiceClient

// Call sends one RPC, with optional header key/value pairs, and returns the ID of the server
// that answered.
func Call(ctx context.Context, c Client, headers ...string) (string, error) {
	if len(headers) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, headers...)
	}
	resp, err := c.UnaryCall(ctx, &testpb.SimpleRequest{})
	if err != nil {
		return "", err
	}
	return resp.GetServerId(), nil
}

// Counts is how many RPCs each server answered.
type Counts map[string]int

// Count sends n RPCs and counts the servers that answered; it stops at the first failure.
func Count(ctx context.Context, c Client, n int, headers ...string) (Counts, error) {
	counts := Counts{}
	for i := range n {
		id, err := Call(ctx, c, headers...)
		if err != nil {
			return counts, fmt.Errorf("RPC %d of %d: %w", i+1, n, err)
		}
		counts[id]++
	}
	return counts, nil
}

// Print writes one line per server, sorted by ID: its ID, its count and its share in percent.
func (c Counts) Print(w io.Writer) error {
	total := 0
	for _, n := range c {
		total += n
	}
	ids := make([]string, 0, len(c))
	for id := range c {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if _, err := fmt.Fprintf(w, "%-4s %5d  %3.0f%%\n", id, c[id], 100*float64(c[id])/float64(total)); err != nil {
			return err
		}
	}
	return nil
}

// Register serves impl (a Server, or a test's own TestService) on r, a grpc.Server or an
// xDS-enabled one.
func Register(r grpc.ServiceRegistrar, impl testpb.TestServiceServer) {
	testpb.RegisterTestServiceServer(r, impl)
}

// NewClient is a Client on conn.
func NewClient(conn grpc.ClientConnInterface) Client { return testpb.NewTestServiceClient(conn) }
