package xds

import (
	"context"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/shared/bus"
)

// BenchmarkPush times one config change (a DestinationRule: clusters and endpoints) from Push
// to its clusters reaching every one of 200 state-of-the-world proxies, each watching clusters,
// endpoints, listeners and routes of 100 services, over loopback gRPC. It also reports the
// process's CPU time per change (server and clients), steadier than wall time on a shared
// machine.
func BenchmarkPush(b *testing.B) {
	const proxies, svcs = 200, 100
	store, gen := model.NewStore(), &fakeGen{}
	h := store.Handler(nil)
	var hosts []string
	for i := range svcs {
		hosts = append(hosts, fmt.Sprintf("svc-%03d.demo", i))
	}
	apply := func(c bus.Change) {
		if err := h.Apply(c); err != nil {
			b.Fatal(err)
		}
	}
	apply(services("demo", hosts...))
	for _, host := range hosts {
		apply(endpoints("demo", host, "10.0.0.1", "10.0.0.2"))
	}
	srv := NewServer(Options{Generator: func(*model.Proxy) Generator { return gen }, Observers: append(benchObservers(b), NewPushTracer(), NewNackBackoff(0, 0))})
	snap, ch := store.Next()
	srv.Push(snap, ch, nil)

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	gs := grpc.NewServer(grpc.ForceServerCodecV2(Codec()))
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(gs, srv)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { _ = srv.Run(ctx); done <- struct{}{} }()
	go func() { _ = gs.Serve(lis); done <- struct{}{} }()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = cc.Close()
		cancel()
		gs.Stop()
		<-done
		<-done
	}()

	var clusterNames []string
	for _, host := range hosts {
		clusterNames = append(clusterNames, cluster(host))
	}
	clusters := make(chan struct{}, proxies)
	ready := make(chan struct{}, proxies)
	for i := range proxies {
		s, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
		if err != nil {
			b.Fatal(err)
		}
		subs := map[string][]string{cds: nil, eds: clusterNames, lds: nil, rds: clusterNames}
		first := true
		for _, t := range pushOrder {
			req := &discoverygrpc.DiscoveryRequest{TypeUrl: t, ResourceNames: subs[t]}
			if first {
				req.Node, first = node(fmt.Sprint("p", i), "demo", false), false
			}
			if err := s.Send(req); err != nil {
				b.Fatal(err)
			}
		}
		go func() {
			answered := map[string]bool{}
			for {
				resp, err := s.Recv()
				if err != nil {
					return
				}
				t := resp.GetTypeUrl()
				if err := s.Send(&discoverygrpc.DiscoveryRequest{TypeUrl: t, ResponseNonce: resp.GetNonce(),
					VersionInfo: resp.GetVersionInfo(), ResourceNames: subs[t]}); err != nil {
					return
				}
				if len(answered) < len(pushOrder) {
					if answered[t] = true; len(answered) == len(pushOrder) {
						ready <- struct{}{}
					}
					continue
				}
				if t == cds {
					clusters <- struct{}{}
				}
			}
		}()
	}
	for range proxies {
		<-ready
	}
	b.ResetTimer()
	cpu0 := cpuTime(b)
	for i := range b.N {
		apply(destinationRule("demo", "dr", hosts[i%svcs]))
		snap, ch := store.Next()
		srv.Push(snap, ch, nil)
		for range proxies {
			<-clusters
		}
	}
	b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
}

// cpuTime is the CPU time the process used so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
