package kube

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
)

// signalPublisher signals the first Endpoints upsert of a name someone waits for; it keeps no
// resources, so that the heap measured is the controller's.
type signalPublisher struct {
	mu      sync.Mutex
	waiting map[string]chan struct{}
}

var _ bus.Publisher = (*signalPublisher)(nil)

func (p *signalPublisher) expect(name string) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	ch := make(chan struct{})
	p.waiting[name] = ch
	return ch
}

func (p *signalPublisher) Upsert(typeURL string, rs ...*bus.Resource) error {
	if typeURL != schema.Endpoints.TypeURL {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range rs {
		if ch, ok := p.waiting[r.Name]; ok {
			close(ch)
			delete(p.waiting, r.Name)
		}
	}
	return nil
}

func (p *signalPublisher) Delete(string, ...string)              {}
func (p *signalPublisher) Replace(string, []*bus.Resource) error { return nil }

func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// parallel runs f(i) for i in [0,n) on a few workers, failing b on the first error.
func parallel(b *testing.B, n int, f func(i int) error) {
	b.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	next := make(chan int)
	for range 32 {
		wg.Go(func() {
			for i := range next {
				if err := f(i); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
}

// BenchmarkEndpointSliceUpdate measures the time from an EndpointSlice update sent to a real
// API server to the Endpoints upsert, with SAILPLANE_BENCH_SERVICES Services and
// SAILPLANE_BENCH_PODS Pods (spread over the Services' EndpointSlices) in the cluster, and the
// controller's heap once synced. `make bench` sets the sizes (5,000 and 20,000).
func BenchmarkEndpointSliceUpdate(b *testing.B) {
	nSvc := envInt(b, "SAILPLANE_BENCH_SERVICES", 20)
	nPod := envInt(b, "SAILPLANE_BENCH_PODS", 80)
	const updates = 200
	k := sharedKube(b)
	cfg := k.RestConfig()
	cfg.QPS, cfg.Burst = 5000, 10000
	cs := clientFor(b, cfg)
	ns := newNamespace(b, cs, "bench")
	ctx := context.Background()

	parallel(b, nPod, func(i int) error {
		_, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%d", i), Namespace: ns,
				Labels: map[string]string{"app": fmt.Sprintf("svc-%d", i%nSvc), "version": "v1"}},
			Spec: corev1.PodSpec{ServiceAccountName: "sa", Containers: []corev1.Container{{Name: "app", Image: "app"}}},
		}, metav1.CreateOptions{})
		return err
	})
	sl := make([]*discovery.EndpointSlice, nSvc)
	parallel(b, nSvc, func(i int) error {
		name := fmt.Sprintf("svc-%d", i)
		if _, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name},
				Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
		}, metav1.CreateOptions{}); err != nil {
			return err
		}
		var eps []discovery.Endpoint
		for p := i; p < nPod; p += nSvc {
			eps = append(eps, sliceEP(fmt.Sprintf("198.18.%d.%d", p/250, p%250+1), fmt.Sprintf("pod-%d", p), "", true, true, false))
		}
		s, err := cs.DiscoveryV1().EndpointSlices(ns).Create(ctx,
			newSlice(ns, name+"-1", name, []discovery.EndpointPort{slicePort("http", 8080)}, eps...), metav1.CreateOptions{})
		sl[i] = s
		return err
	})

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	pub := &signalPublisher{waiting: map[string]chan struct{}{}}
	start := time.Now()
	startController(b, Config{ClusterID: "bench"}, Deps{Kube: k.RestConfig(), Publisher: pub,
		Logger: slogDiscard})
	syncTime := time.Since(start)
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)

	var lat []time.Duration
	b.ResetTimer()
	for b.Loop() {
		for u := range updates {
			i := u % nSvc
			s := sl[i]
			if len(s.Endpoints) == 0 {
				continue
			}
			ready := !*s.Endpoints[0].Conditions.Ready
			s.Endpoints[0].Conditions.Ready = &ready
			name := ns + "/" + Hostname(fmt.Sprintf("svc-%d", i), ns, DefaultClusterLocal)
			done := pub.expect(name)
			t0 := time.Now()
			updated, err := cs.DiscoveryV1().EndpointSlices(ns).Update(ctx, s, metav1.UpdateOptions{})
			if err != nil {
				b.Fatal(err)
			}
			sl[i] = updated
			select {
			case <-done:
				lat = append(lat, time.Since(t0))
			case <-time.After(timeout):
				b.Fatalf("no Endpoints upsert for %s", name)
			}
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	}
	b.ReportMetric(float64(after.HeapInuse)/(1<<20), "heap-inuse-MiB")
	b.ReportMetric((float64(after.HeapInuse)-float64(before.HeapInuse))/(1<<20), "watcher-heap-MiB")
	b.ReportMetric(syncTime.Seconds(), "initial-sync-s")
	b.ReportMetric(0, "ns/op") // per-op time is meaningless here: the metrics above are what counts
}
