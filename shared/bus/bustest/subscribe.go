package bustest

import (
	"context"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// SubscribeOnce opens one delta stream of typeURL on the bus at addr with creds and returns the
// error of its first response (nil when the bus answered): how a test sees a bus refuse it.
func SubscribeOnce(ctx context.Context, addr string, creds credentials.TransportCredentials, typeURL string) error {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer conn.Close()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		return err
	}
	// A stream the server ended at once fails Send with io.EOF; Recv has its status.
	_ = stream.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: typeURL})
	_, err = stream.Recv()
	return err
}
