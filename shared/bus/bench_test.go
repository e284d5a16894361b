package bus_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/bus/bustest"
	"sailplane.dev/shared/schema"
)

var benchType = schema.VirtualService.TypeURL

func benchStore(n int) *bus.Store {
	s := bus.NewStore()
	rs := make([]*bus.Resource, n)
	for i := range rs {
		rs[i] = bustest.VirtualService(fmt.Sprintf("ns%d/vs-%d", i%50, i), "", fmt.Sprintf("h%d.example.com", i))
	}
	s.Upsert(benchType, rs...)
	return s
}

// benchServer serves s on 127.0.0.1 until the benchmark ends.
func benchServer(b *testing.B, s *bus.Store) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	gs := grpc.NewServer()
	bus.NewServer(s).Register(gs)
	go func() { _ = gs.Serve(lis) }()
	b.Cleanup(gs.Stop)
	return lis.Addr().String()
}

type benchTransport struct {
	name string
	src  func(b *testing.B, s *bus.Store) bus.Source
}

var benchTransports = []benchTransport{
	{"local", func(b *testing.B, s *bus.Store) bus.Source { return bus.Local(s) }},
	{"delta", func(b *testing.B, s *bus.Store) bus.Source { return bus.Dial(benchServer(b, s)) }},
}

// syncCounter is a Handler that counts resources and signals Synced.
type syncCounter struct {
	n      int
	synced chan struct{}
}

func (h *syncCounter) Apply(c bus.Change) error { h.n += len(c.Updated); return nil }
func (h *syncCounter) Synced()                  { close(h.synced) }

func BenchmarkInitialSync(b *testing.B) {
	const resources = 10000
	for _, tr := range benchTransports {
		for _, consumers := range []int{1, 100} {
			name := fmt.Sprintf("%s/%dconsumers", tr.name, consumers)
			if consumers == 1 {
				name = tr.name + "/1consumer"
			}
			b.Run(name, func(b *testing.B) {
				s := benchStore(resources)
				src := tr.src(b, s)
				b.ResetTimer()
				for b.Loop() {
					ctx, cancel := context.WithCancel(context.Background())
					var wg sync.WaitGroup
					hs := make([]*syncCounter, consumers)
					for i := range hs {
						hs[i] = &syncCounter{synced: make(chan struct{})}
						wg.Go(func() { _ = src.Subscribe(ctx, []string{benchType}, hs[i]) })
					}
					for _, h := range hs {
						<-h.synced
					}
					cancel()
					wg.Wait()
					for _, h := range hs {
						if h.n != resources {
							b.Fatalf("synced with %d resources", h.n)
						}
					}
				}
			})
		}
	}
}

// latencyHandler reports when each version of the watched resource arrives.
type latencyHandler struct {
	synced  chan struct{}
	arrived chan string
}

func (h *latencyHandler) Apply(c bus.Change) error {
	for _, r := range c.Updated {
		if r.Name == "ns/latency" {
			h.arrived <- r.Version
		}
	}
	return nil
}
func (h *latencyHandler) Synced() { close(h.synced) }

func BenchmarkUpdateLatency(b *testing.B) {
	const samplesPerIter = 200
	for _, tr := range benchTransports {
		b.Run(tr.name, func(b *testing.B) {
			s := benchStore(1000)
			s.Upsert(benchType, bustest.VirtualService("ns/latency", "v0", "x"))
			src := tr.src(b, s)
			h := &latencyHandler{synced: make(chan struct{}), arrived: make(chan string, 1)}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = src.Subscribe(ctx, []string{benchType}, h) }()
			<-h.synced
			<-h.arrived // v0
			var lat []time.Duration
			version := 0
			b.ResetTimer()
			for b.Loop() {
				for range samplesPerIter {
					version++
					v := fmt.Sprintf("v%d", version)
					start := time.Now()
					s.Upsert(benchType, bustest.VirtualService("ns/latency", v, "x"))
					for got := <-h.arrived; got != v; got = <-h.arrived {
					}
					lat = append(lat, time.Since(start))
				}
			}
			b.StopTimer()
			cancel()
			<-done
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
			b.ReportMetric(0, "ns/op")
		})
	}
}
