package xdsserver

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"sailplane.dev/services/xds-server/internal/fakebus"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/grpcserver"
)

// serve runs srv on a loopback port until the test ends, without waiting for it to be ready.
func serve(t *testing.T, srv *Server) net.Addr {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return lis.Addr()
}

func healthOf(t *testing.T, addr net.Addr) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	conn, err := grpc.NewClient(addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(streamContext(t), &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("health check: %v", err)
	}
	return resp.GetStatus()
}

// listenerRequest opens an ADS stream on client and asks for the echo listener; it returns the
// stream's first answer.
func listenerRequest(t *testing.T, client discoverygrpc.AggregatedDiscoveryServiceClient, node string) (*discoverygrpc.DiscoveryResponse, error) {
	t.Helper()
	stream, err := client.StreamAggregatedResources(streamContext(t), grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	// Send reports io.EOF when the server already ended the stream; Recv says why.
	if err := stream.Send(&discoverygrpc.DiscoveryRequest{Node: testNode(node), TypeUrl: resource.ListenerType, ResourceNames: []string{echoListener}}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	return stream.Recv()
}

// An xds-server started while its bus peer is down refuses proxies at once (Unavailable, and
// NOT_SERVING on the health service), so they fail over instead of hanging; once the peer
// appears, it syncs within the reconnection backoff and serves.
func TestRefusesProxiesUntilBusesSynced(t *testing.T) {
	// An address with nothing listening: the bus peer is absent.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	busAddr := lis.Addr().String()
	_ = lis.Close()
	// The peer stops after the xds-server (cleanups run last first), so its graceful stop does
	// not wait for the server's bus streams.
	peerCtx, stopPeer := context.WithCancel(context.Background())
	var peerDone chan error
	t.Cleanup(func() {
		stopPeer()
		if peerDone != nil {
			if err := <-peerDone; err != nil {
				t.Errorf("bus peer: %v", err)
			}
		}
	})

	log := testLogger(t)
	src := bus.Dial(busAddr, bus.WithDialLogger(log), bus.WithNodeID("xds-server-test"))
	srv, err := New(Config{Debounce: 10 * time.Millisecond}, Deps{Logger: log, Config: src, Registry: src})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, srv)
	client := adsClient(t, addr)

	if _, err := listenerRequest(t, client, "early"); status.Code(err) != codes.Unavailable {
		t.Fatalf("stream before the first sync: %v, want Unavailable", err)
	}
	if got := healthOf(t, addr); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health before the first sync: %v, want NOT_SERVING", got)
	}

	// The bus peer appears on its address.
	store := bus.NewStore()
	for _, c := range append(changes(t, registry(10001, 10002)), changes(t, virtualService(80, 20))...) {
		if err := store.Upsert(c.TypeURL, c.Updated...); err != nil {
			t.Fatal(err)
		}
	}
	peer, err := bus.ServeGRPC(store, busAddr, log, bus.Security{})
	if err != nil {
		t.Fatal(err)
	}
	peerDone = make(chan error, 1)
	go func() { peerDone <- peer.Run(peerCtx) }()

	select {
	case <-srv.Ready():
	case <-time.After(waitFor):
		t.Fatal("xds-server did not sync after its bus peer appeared")
	}
	resp, err := listenerRequest(t, client, "late")
	if err != nil {
		t.Fatalf("stream after the sync: %v", err)
	}
	if len(resp.GetResources()) != 1 {
		t.Errorf("got %d listeners, want the echo listener", len(resp.GetResources()))
	}
	if got := healthOf(t, addr); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health after the sync: %v, want SERVING", got)
	}
}

// A request over the receive limit (node metadata of 5 MiB) ends its stream with
// ResourceExhausted; the server keeps serving the other streams of the same connection.
func TestOversizedRequestRefused(t *testing.T) {
	srv := startServer(t, fakebus.New(changes(t, registry(10001, 10002))...))
	client := adsClient(t, srv.Addr())

	stream, err := client.StreamAggregatedResources(streamContext(t))
	if err != nil {
		t.Fatal(err)
	}
	node := testNode("huge")
	node.Metadata.Fields["JUNK"] = structpb.NewStringValue(strings.Repeat("x", grpcserver.MaxRecvMsgSize+1<<20))
	if err := stream.Send(&discoverygrpc.DiscoveryRequest{Node: node, TypeUrl: resource.ListenerType}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("oversized request: %v, want ResourceExhausted", err)
	}

	if resp, err := listenerRequest(t, client, "normal"); err != nil || len(resp.GetResources()) != 1 {
		t.Fatalf("a normal stream after the oversized one: %v, %d listeners", err, len(resp.GetResources()))
	}
}

// lockedBuffer collects log output from several goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A NACK's error_detail is cut before it is logged: a client cannot flood the logs.
func TestLongNACKTruncatedInLog(t *testing.T) {
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	src := fakebus.New(changes(t, registry(10001, 10002))...)
	srv, err := New(Config{Debounce: 10 * time.Millisecond}, Deps{Logger: log, Config: src, Registry: src})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, srv)
	select {
	case <-srv.Ready():
	case <-time.After(waitFor):
		t.Fatal("server not ready")
	}

	stream, err := adsClient(t, addr).StreamAggregatedResources(streamContext(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discoverygrpc.DiscoveryRequest{Node: testNode("nacker"), TypeUrl: resource.ListenerType, ResourceNames: []string{echoListener}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	const long = 1 << 20
	if err := stream.Send(&discoverygrpc.DiscoveryRequest{
		TypeUrl: resource.ListenerType, ResourceNames: []string{echoListener}, VersionInfo: "",
		ResponseNonce: resp.GetNonce(),
		ErrorDetail:   &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: "bad listener: " + strings.Repeat("y", long)},
	}); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(waitFor)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !strings.Contains(logs.String(), "proxy rejected configuration") {
		select {
		case <-deadline:
			t.Fatal("the NACK was not logged")
		case <-tick.C:
		}
	}
	line := logs.String()[strings.Index(logs.String(), "proxy rejected configuration"):]
	line, _, _ = strings.Cut(line, "\n")
	if len(line) > 4096 || !strings.Contains(line, "bad listener: yyy") || !strings.Contains(line, "more bytes") {
		t.Errorf("NACK logged in %d bytes, want it cut to about 1 KiB and saying so: %.300s…", len(line), line)
	}
}
