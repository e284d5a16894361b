package bus_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	networking "istio.io/api/networking/v1alpha3"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/bus/bustest"
	"sailplane.dev/shared/grpcserver"
	"sailplane.dev/shared/schema"
)

var (
	vsType = schema.VirtualService.TypeURL
	drType = schema.DestinationRule.TypeURL
)

// withAnnotation returns a VirtualService whose annotation makes it about size bytes.
func withAnnotation(name, host string, size int) *bus.Resource {
	r := bustest.VirtualService(name, "", host)
	r.Annotations = map[string]string{"note": strings.Repeat("x", size)}
	return r
}

func hostOf(t *testing.T, s *bus.Store, name string) string {
	t.Helper()
	r, ok := s.Get(vsType, name)
	if !ok {
		return ""
	}
	return r.Body.(*networking.VirtualService).GetHosts()[1]
}

func TestStoreRefusesOversizedResources(t *testing.T) {
	const limit = 4 << 10
	for _, tc := range []struct {
		name string
		// publish publishes "ns/big" over the limit and "ns/ok" (host "new") under it, on a
		// store holding both at host "old".
		publish func(s *bus.Store) error
	}{
		{"upsert", func(s *bus.Store) error {
			return s.Upsert(vsType, withAnnotation("ns/big", "new", 2*limit), bustest.VirtualService("ns/ok", "", "new"))
		}},
		{"replace", func(s *bus.Store) error {
			return s.Replace(vsType, []*bus.Resource{withAnnotation("ns/big", "new", 2*limit), bustest.VirtualService("ns/ok", "", "new")})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := bus.NewStore(bus.WithLogger(testLogger(t)), bus.WithMaxResourceBytes(limit))
			if err := s.Upsert(vsType, bustest.VirtualService("ns/big", "", "old"), bustest.VirtualService("ns/ok", "", "old")); err != nil {
				t.Fatal(err)
			}
			err := tc.publish(s)
			var tooLarge *bus.TooLargeError
			if !errors.As(err, &tooLarge) {
				t.Fatalf("publish: %v, want a *TooLargeError", err)
			}
			if tooLarge.TypeURL != vsType || tooLarge.Name != "ns/big" || tooLarge.Limit != limit || tooLarge.Size <= 2*limit {
				t.Errorf("error = %+v", tooLarge)
			}
			if !strings.Contains(err.Error(), vsType) || !strings.Contains(err.Error(), "ns/big") {
				t.Errorf("message %q names neither type nor resource", err)
			}
			if got := hostOf(t, s, "ns/big"); got != "old" {
				t.Errorf("ns/big = %q, want its previous version kept", got)
			}
			if got := hostOf(t, s, "ns/ok"); got != "new" {
				t.Errorf("ns/ok = %q, want the new version published", got)
			}
		})
	}

	t.Run("new resource refused", func(t *testing.T) {
		s := bus.NewStore(bus.WithMaxResourceBytes(limit))
		if err := s.Upsert(vsType, withAnnotation("ns/big", "new", 2*limit)); err == nil {
			t.Fatal("no error")
		}
		if _, ok := s.Get(vsType, "ns/big"); ok {
			t.Error("refused resource stored")
		}
	})

	t.Run("per-type limits", func(t *testing.T) {
		s := bus.NewStore(bus.WithMaxResourceBytes(limit), bus.WithMaxResourceBytes(4*limit, vsType))
		if err := s.Upsert(vsType, withAnnotation("ns/big", "new", 2*limit)); err != nil {
			t.Errorf("VirtualService under its own limit: %v", err)
		}
		if err := s.Upsert(drType, withAnnotation("ns/big", "new", 2*limit)); err == nil {
			t.Error("DestinationRule over the default limit accepted")
		}
	})

	t.Run("defaults", func(t *testing.T) {
		s := bus.NewStore()
		if err := s.Upsert(vsType, withAnnotation("ns/big", "new", bus.MaxResourceBytes)); err == nil {
			t.Error("VirtualService over MaxResourceBytes accepted")
		}
		if err := s.Upsert(vsType, withAnnotation("ns/fits", "new", bus.MaxResourceBytes-1024)); err != nil {
			t.Errorf("VirtualService just under MaxResourceBytes: %v", err)
		}
		// Endpoints gather a whole host: their limit is larger.
		eps := withAnnotation("ns/eps", "new", 2*bus.MaxResourceBytes)
		if err := s.Upsert(schema.Endpoints.TypeURL, eps); err != nil {
			t.Errorf("Endpoints of 3 MiB: %v", err)
		}
	})
}

// A type whose state is larger than gRPC's default 4 MiB receive limit reaches a consumer,
// which sees Synced only with the whole state and then keeps receiving edits. The delta
// consumer keeps gRPC's default limit: every response part must fit in it.
func TestLargeStateReachesConsumers(t *testing.T) {
	const (
		resources = 400
		each      = 16 << 10 // 400 × 16 KiB = 6.4 MiB
	)
	defaultLimit := grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(4 << 20))
	for _, tc := range []struct {
		name string
		dial func(addr string) bus.Source
	}{
		{"delta", func(addr string) bus.Source {
			return bus.Dial(addr, bus.WithDialLogger(testLogger(t)), bus.WithGRPCDialOptions(defaultLimit))
		}},
		{"sotw", func(addr string) bus.Source { return bus.DialSotW(addr, bus.WithDialLogger(testLogger(t))) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := bus.NewStore()
			rs := make([]*bus.Resource, resources)
			for i := range rs {
				rs[i] = withAnnotation(fmt.Sprintf("ns/vs-%03d", i), "v1", each)
			}
			if err := s.Replace(vsType, rs); err != nil {
				t.Fatal(err)
			}
			p := startPeer(t, s)
			h := bustest.NewRecorder()
			bustest.Subscribe(t, tc.dial(p.addr), []string{vsType}, h)
			bustest.WaitFor(t, "synced", func() bool { return h.SyncedCount() == 1 })
			if got := h.SizeAtSynced(); got != resources {
				t.Fatalf("Synced with %d resources, want all %d", got, resources)
			}

			// Later edits, large (more than one delta part) and small, still arrive.
			big := make([]*bus.Resource, 200)
			for i := range big {
				big[i] = withAnnotation(fmt.Sprintf("ns/vs-%03d", i), "v2", each)
			}
			if err := s.Upsert(vsType, big...); err != nil {
				t.Fatal(err)
			}
			if err := s.Upsert(vsType, bustest.VirtualService("ns/vs-399", "", "v3")); err != nil {
				t.Fatal(err)
			}
			s.Delete(vsType, "ns/vs-398")
			bustest.WaitConverged(t, s, h, vsType)
		})
	}
}

// A bus server refuses a request over its receive limit with ResourceExhausted and keeps
// serving its other consumers; what a consumer sends in a NACK is bounded before it is kept.
func TestBusServerLimits(t *testing.T) {
	s := bus.NewStore(bus.WithLogger(testLogger(t)))
	if err := s.Upsert(vsType, bustest.VirtualService("ns/vs", "", "a")); err != nil {
		t.Fatal(err)
	}
	addr := bustest.Serve(t, s, testLogger(t), bus.Security{})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	client := discoveryv3.NewAggregatedDiscoveryServiceClient(conn)
	sctx, scancel := context.WithTimeout(context.Background(), bustest.Timeout)
	defer scancel()

	t.Run("oversized request", func(t *testing.T) {
		stream, err := client.DeltaAggregatedResources(sctx)
		if err != nil {
			t.Fatal(err)
		}
		node := &corev3.Node{Id: "huge", Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			"JUNK": structpb.NewStringValue(strings.Repeat("x", grpcserver.MaxRecvMsgSize+1<<20)),
		}}}
		if err := stream.Send(&discoveryv3.DeltaDiscoveryRequest{Node: node, TypeUrl: vsType}); err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("oversized request: %v, want ResourceExhausted", err)
		}
	})

	t.Run("others still served, long NACK bounded", func(t *testing.T) {
		stream, err := client.DeltaAggregatedResources(sctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&discoveryv3.DeltaDiscoveryRequest{Node: &corev3.Node{Id: "nacker"}, TypeUrl: vsType}); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil || len(resp.GetResources()) != 1 {
			t.Fatalf("normal stream: %v, %d resources", err, len(resp.GetResources()))
		}
		if err := stream.Send(&discoveryv3.DeltaDiscoveryRequest{TypeUrl: vsType, ResponseNonce: resp.GetNonce(),
			ErrorDetail: &rpcstatus.Status{Message: "refused: " + strings.Repeat("y", 1<<20)}}); err != nil {
			t.Fatal(err)
		}
		deadline := time.After(bustest.Timeout)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for len(s.Rejections()) == 0 {
			select {
			case <-deadline:
				t.Fatal("NACK not recorded")
			case <-tick.C:
			}
		}
		if r := s.Rejections()[0]; len(r.Err) > 2048 || !strings.HasPrefix(r.Err, "refused: yyy") {
			t.Errorf("rejection kept %d bytes of error, want about 1 KiB: %.100s", len(r.Err), r.Err)
		}
	})
}
