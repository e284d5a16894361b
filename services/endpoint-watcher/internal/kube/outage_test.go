package kube

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/endpoint-watcher/internal/serviceentry"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/testlog"
	"sailplane.dev/shared/testwait"
	"sailplane.dev/tools/testenv"
)

// afterOutage bounds how long a change takes to be published once the API server answers
// again: the probe's backoff (1 s at most) and one list of everything, with room for a loaded
// machine. client-go's own backoff would take up to a minute.
const afterOutage = 10 * time.Second

// TestAPIServerOutage cuts the connections to the primary's and to a remote cluster's API
// servers (each through a proxy, so that the test can change the cluster meanwhile, as other
// clients could): nothing is withdrawn while the API server is unreachable, and once it
// answers again what changed meanwhile, deletions included, is published at once, and
// nothing that still exists is deleted.
func TestAPIServerOutage(t *testing.T) {
	primary, remote := sharedKube(t), testenv.KubeForTest(t)
	pcs, rcs := clientFor(t, primary.RestConfig()), clientFor(t, remote.RestConfig())
	pproxy, rproxy := newCutProxy(t, primary.Host()), newCutProxy(t, remote.Host())

	ctlNS := newNamespace(t, pcs, "cp")
	ns := newNamespace(t, pcs, "outage")
	createNamespace(t, rcs, ns)
	port := []corev1.ServicePort{{Name: "http", Port: 80}}
	sport := []discovery.EndpointPort{slicePort("http", 80)}
	for _, name := range []string{"api", "keep", "gone"} {
		createService(t, pcs, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: corev1.ServiceSpec{Ports: port}})
	}
	createService(t, rcs, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: ns}, Spec: corev1.ServiceSpec{Ports: port}})
	pslice := createSlice(t, pcs, newSlice(ns, "api-1", "api", sport, sliceEP("198.18.4.1", "a", "", true, true, false)))
	rslice := createSlice(t, rcs, newSlice(ns, "api-1", "api", sport, sliceEP("198.18.4.2", "r", "", true, true, false)))
	createPod(t, pcs, podSpec{ns: ns, name: "a", ip: "198.18.4.1", ready: true})
	createPod(t, pcs, podSpec{ns: ns, name: "b", ip: "198.18.4.9", ready: true})
	createPod(t, rcs, podSpec{ns: ns, name: "r", ip: "198.18.4.2", ready: true})

	kubeconfig := bytes.ReplaceAll(readFile(t, remote.KubeconfigPath()), []byte(remote.Host()), []byte(rproxy.url()))
	if _, err := pcs.CoreV1().Secrets(ctlNS).Create(ctxFor(t), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "remotes", Namespace: ctlNS, Labels: map[string]string{LabelMultiCluster: "true"}},
		Data:       map[string][]byte{"remote-1": kubeconfig},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := primary.RestConfig()
	cfg.Host = pproxy.url()
	log, logs := testlog.NewRecording(t, slog.LevelDebug)
	sink := &workloads{m: map[string]serviceentry.Workload{}}
	_, rec := startController(t, Config{ClusterID: "primary", Namespace: ctlNS}, Deps{Kube: cfg, Logger: log, Workloads: sink})

	name := func(svc string) string { return ns + "/" + svc + "." + ns + ".svc.cluster.local" }
	ep := func(addr, pod, cluster string) *discoveryv1.Endpoint {
		return &discoveryv1.Endpoint{Address: addr, ClusterId: cluster, Workload: pod, Ports: map[string]uint32{"http": 80},
			Health: discoveryv1.Health_HEALTHY}
	}
	endpoints := func(eps ...*discoveryv1.Endpoint) *discoveryv1.Endpoints {
		return &discoveryv1.Endpoints{Hostname: "api." + ns + ".svc.cluster.local", Namespace: ns, Endpoints: eps}
	}
	waitEndpoints(t, rec, name("api"), endpoints(ep("198.18.4.1", "a", "primary"), ep("198.18.4.2", "r", "remote-1")))
	waitUntil(t, timeout, "Pods handed to the ServiceEntry registry", func() bool {
		return sink.has("primary", ns, "a") && sink.has("primary", ns, "b") && sink.has("remote-1", ns, "r")
	})

	// outage cuts p, makes change while the API server is unreachable, restores p and waits
	// until published holds: within afterOutage, deleting nothing else than "gone".
	outage := func(t *testing.T, p *cutProxy, change func(), published func(st map[string]map[string]*bus.Resource) bool) {
		t.Helper()
		unreachable := logs.Count("kubernetes API server unreachable")
		recovered := logs.Count("API server reachable again, resynced in")
		p.cut()
		waitUntil(t, timeout, "the outage noticed", func() bool { return logs.Count("kubernetes API server unreachable") > unreachable })
		change()
		calls := len(rec.Calls())
		p.restore()
		restored := time.Now()
		rec.WaitForState(t, afterOutage, published)
		t.Logf("changes made during the outage published %v after the API server was reachable again", time.Since(restored).Round(time.Millisecond))
		waitUntil(t, afterOutage, "the recovery logged", func() bool { return logs.Count("API server reachable again, resynced in") > recovered })
		for _, c := range rec.Calls()[calls:] {
			if c.Op == "Delete" && slices.ContainsFunc(c.Names, func(n string) bool { return n != name("gone") }) {
				t.Errorf("deleted after the outage: %v", c)
			}
		}
		if n := logs.Count("API server reachable again, resynced in"); n != recovered+1 {
			t.Errorf("the recovery was logged %d times, want once", n-recovered)
		}
	}

	t.Run("primary", func(t *testing.T) {
		outage(t, pproxy, func() {
			ctx := ctxFor(t)
			if err := pcs.CoreV1().Services(ns).Delete(ctx, "gone", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := pcs.CoreV1().Pods(ns).Delete(ctx, "b", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			pslice.Endpoints = append(pslice.Endpoints, sliceEP("198.18.4.3", "", "", true, true, false))
			pslice = updateSlice(t, pcs, pslice)
		}, func(st map[string]map[string]*bus.Resource) bool {
			_, gone := st[schema.Service.TypeURL][name("gone")]
			eps, ok := st[schema.Endpoints.TypeURL][name("api")]
			return !gone && ok && proto.Equal(eps.Body, endpoints(ep("198.18.4.1", "a", "primary"), ep("198.18.4.3", "", "primary"), ep("198.18.4.2", "r", "remote-1")))
		})
		waitUntil(t, afterOutage, "the deleted Pod removed from the ServiceEntry registry", func() bool { return !sink.has("primary", ns, "b") })
		if !sink.has("primary", ns, "a") {
			t.Error("a Pod that still exists was removed from the ServiceEntry registry")
		}
	})
	t.Run("remote", func(t *testing.T) {
		want := endpoints(ep("198.18.4.1", "a", "primary"), ep("198.18.4.3", "", "primary"),
			ep("198.18.4.2", "r", "remote-1"), ep("198.18.4.4", "", "remote-1"))
		outage(t, rproxy, func() {
			rslice.Endpoints = append(rslice.Endpoints, sliceEP("198.18.4.4", "", "", true, true, false))
			rslice = updateSlice(t, rcs, rslice)
		}, func(st map[string]map[string]*bus.Resource) bool {
			eps, ok := st[schema.Endpoints.TypeURL][name("api")]
			return ok && proto.Equal(eps.Body, want)
		})
		if !sink.has("remote-1", ns, "r") {
			t.Error("a remote Pod that still exists was removed from the ServiceEntry registry")
		}
	})
}

func waitUntil(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	testwait.Until(t, d, what, cond)
}

// workloads is a WorkloadSink keeping what it was given.
type workloads struct {
	mu sync.Mutex
	m  map[string]serviceentry.Workload // by cluster/namespace/name
}

func (w *workloads) SetWorkload(_ context.Context, x serviceentry.Workload) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.m[x.ClusterID+"/"+x.Namespace+"/"+x.Name] = x
}

func (w *workloads) DeleteWorkload(_ context.Context, cluster, ns, name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.m, cluster+"/"+ns+"/"+name)
}

func (w *workloads) has(cluster, ns, name string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.m[cluster+"/"+ns+"/"+name]
	return ok
}

// cutProxy forwards TCP connections on 127.0.0.1 to an API server until cut, which closes them
// all and refuses new ones, as a stopped API server does, until restore.
type cutProxy struct {
	t      testing.TB
	target string // host:port
	addr   string

	mu    sync.Mutex
	ln    net.Listener // nil while cut
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func newCutProxy(t testing.TB, targetURL string) *cutProxy {
	t.Helper()
	p := &cutProxy{t: t, target: strings.TrimPrefix(targetURL, "https://"), conns: map[net.Conn]struct{}{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(func() {
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *cutProxy) url() string { return "https://" + p.addr }

func (p *cutProxy) serve(ln net.Listener) {
	p.ln = ln
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Go(func() { p.forward(c) })
		}
	})
}

func (p *cutProxy) forward(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	if p.ln == nil { // cut meanwhile
		p.mu.Unlock()
		c.Close()
		up.Close()
		return
	}
	p.conns[c], p.conns[up] = struct{}{}, struct{}{}
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	c.Close()
	up.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
}

func (p *cutProxy) restore() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatal(errors.Join(errors.New("restoring the proxy"), err))
	}
	p.serve(ln)
}
