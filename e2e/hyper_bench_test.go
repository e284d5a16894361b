package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/shared/testwait"
)

const listenerTypeURL = "type.googleapis.com/envoy.config.listener.v3.Listener"

// echoListener is the listener a proxyless client of the example's echo service asks for.
const echoListener = "echo.demo.svc.cluster.local:7070"

// BenchmarkHyperStartToServing times hyper in files mode on the example config (examples/etc),
// from starting the process to the first xDS response holding the echo service's listener, as
// a proxyless client polling for it sees it: the root generated on a first start, reused on a
// restart. Figures in docs/benchmarks.md.
func BenchmarkHyperStartToServing(b *testing.B) {
	hyper := framework.Binary(b, "hyper")
	b.Run("first start", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			dir := exampleCopy(b)
			b.StartTimer()
			startToServing(b, hyper, dir)
		}
	})
	b.Run("restart", func(b *testing.B) {
		dir := exampleCopy(b)
		startToServing(b, hyper, dir) // generates the root, before b.Loop starts the timer
		for b.Loop() {
			startToServing(b, hyper, dir)
		}
	})
}

// exampleCopy is a new folder holding a copy of examples/etc/sailplane.
func exampleCopy(b *testing.B) string {
	b.Helper()
	dir := b.TempDir()
	if err := os.CopyFS(filepath.Join(dir, "etc/sailplane"), os.DirFS(filepath.Join(repoRoot(b), "examples/etc/sailplane"))); err != nil {
		b.Fatal(err)
	}
	return dir
}

// startToServing starts hyper in dir and returns once it served the echo listener; the process
// is stopped with the timer paused.
func startToServing(b *testing.B, bin, dir string) {
	b.Helper()
	xds := framework.FreeAddr(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := framework.Start(b, dir, bin, "--config-source", "files",
		"--xds-listen", xds, "--xds-tls-listen", framework.FreeAddr(b), "--bus-listen", framework.FreeAddr(b), "--log-level", "warn")
	// gRPC's default reconnect backoff (1 s) would be the figure; retry as often as the poll.
	conn, err := grpc.NewClient(xds, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 5 * time.Millisecond, Multiplier: 1, MaxDelay: 5 * time.Millisecond}}))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	// Polled as a client retrying would: refused until the port is open, Unavailable until the
	// first full state, then the answer. On failure the framework shows hyper's log.
	testwait.For(b, time.Minute, "hyper serving "+echoListener, func() error {
		return fetchListener(ctx, conn, echoListener)
	})
	b.StopTimer()
	p.Stop()
	b.StartTimer()
}

// fetchListener asks for one listener over ADS, as a proxyless gRPC client in namespace demo, and
// returns nil once the answer holds it.
func fetchListener(ctx context.Context, conn *grpc.ClientConn, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	md, _ := structpb.NewStruct(map[string]any{"GENERATOR": "grpc", "NAMESPACE": "demo", "CLUSTER_ID": "Kubernetes"})
	err = stream.Send(&discoveryv3.DiscoveryRequest{
		Node:          &corev3.Node{Id: "sidecar~127.0.0.1~bench.demo~demo.svc.cluster.local", Metadata: md},
		TypeUrl:       listenerTypeURL,
		ResourceNames: []string{name},
	})
	if err != nil {
		return err
	}
	resp, err := stream.Recv()
	if err != nil {
		return err
	}
	for _, r := range resp.GetResources() {
		var l listenerv3.Listener
		if err := r.UnmarshalTo(&l); err != nil {
			return err
		}
		if l.GetName() == name {
			return nil
		}
	}
	return fmt.Errorf("an answer without %s", name)
}
