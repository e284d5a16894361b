package grpcserver

import (
	"context"
	"log/slog"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"

	"sailplane.dev/shared/telemetry"
)

// echoADS answers each request of a stream with one response.
type echoADS struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
}

func (echoADS) StreamAggregatedResources(stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	for {
		req, err := stream.Recv()
		if err != nil {
			return nil
		}
		if err := stream.Send(&discoveryv3.DiscoveryResponse{TypeUrl: req.GetTypeUrl(), Nonce: "1"}); err != nil {
			return err
		}
	}
}

// BenchmarkStreamRoundTrip is one request and its response on a long-lived xDS stream, through
// a server New built (call log, metrics on a Prometheus pipeline, recovery, headers) and through
// a bare grpc.Server: the difference is what the interceptors and the stats handler cost.
func BenchmarkStreamRoundTrip(b *testing.B) {
	for _, bc := range []struct {
		name string
		gs   func() *grpc.Server
	}{
		{"bare", func() *grpc.Server { return grpc.NewServer() }},
		{"New", func() *grpc.Server {
			m, err := telemetry.NewMetrics() // metrics as in production, exported to Prometheus
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = m.Shutdown(context.Background()) })
			return New(slog.New(slog.DiscardHandler), WithMeterProvider(m.MeterProvider()))
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			gs := bc.gs()
			discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, echoADS{})
			conn := dial(b, serve(b, gs))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
			if err != nil {
				b.Fatal(err)
			}
			req := &discoveryv3.DiscoveryRequest{TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster"}
			b.ReportAllocs()
			for b.Loop() {
				if err := stream.Send(req); err != nil {
					b.Fatal(err)
				}
				if _, err := stream.Recv(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
