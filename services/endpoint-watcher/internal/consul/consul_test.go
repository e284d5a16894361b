package consul

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/telemetry/telemetrytest"
	"sailplane.dev/shared/testwait"
	"sailplane.dev/tools/testenv"
)

// sharedConsul serves the tests that do not stop their agent: a dev agent takes seconds to start.
var sharedConsul *testenv.Consul

func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	c, err := testenv.StartConsul(ctx, testenv.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, nil))))
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sharedConsul = c
	code := m.Run()
	if code != 0 {
		fmt.Fprintln(os.Stderr, c.Logs())
	}
	// Stopped before the leak check: the agent's process is watched by goroutines.
	c.Stop()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

const waitTimeout = 30 * time.Second

// eventually waits until cond holds, failing t at the deadline.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testwait.Until(t, waitTimeout, what, cond)
}

// recorder is a bus.Publisher that keeps every call and the resulting state.
type recorder struct {
	mu    sync.Mutex
	calls []call
	state map[string]map[string]*bus.Resource
}

type call struct {
	op, typeURL string
	names       []string
}

var _ bus.Publisher = (*recorder)(nil)

func newRecorder() *recorder { return &recorder{state: map[string]map[string]*bus.Resource{}} }

func (r *recorder) Upsert(typeURL string, resources ...*bus.Resource) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := call{op: "Upsert", typeURL: typeURL}
	if r.state[typeURL] == nil {
		r.state[typeURL] = map[string]*bus.Resource{}
	}
	for _, res := range resources {
		r.state[typeURL][res.Name] = res
		c.names = append(c.names, res.Name)
	}
	r.calls = append(r.calls, c)
	return nil
}

func (r *recorder) Delete(typeURL string, names ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range names {
		delete(r.state[typeURL], n)
	}
	r.calls = append(r.calls, call{op: "Delete", typeURL: typeURL, names: slices.Clone(names)})
}

func (r *recorder) Replace(typeURL string, resources []*bus.Resource) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.state[typeURL] = map[string]*bus.Resource{}
	c := call{op: "Replace", typeURL: typeURL}
	for _, res := range resources {
		r.state[typeURL][res.Name] = res
		c.names = append(c.names, res.Name)
	}
	r.calls = append(r.calls, c)
	return nil
}

// mark is a position in the call log, for callsSince.
func (r *recorder) mark() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.calls)
}

func (r *recorder) callsSince(mark int) []call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls[mark:])
}

func (r *recorder) service(name string) *discoveryv1.Service {
	r.mu.Lock()
	defer r.mu.Unlock()
	if res := r.state[schema.Service.TypeURL][name]; res != nil {
		return res.Body.(*discoveryv1.Service)
	}
	return nil
}

func (r *recorder) endpoints(name string) *discoveryv1.Endpoints {
	r.mu.Lock()
	defer r.mu.Unlock()
	if res := r.state[schema.Endpoints.TypeURL][name]; res != nil {
		return res.Body.(*discoveryv1.Endpoints)
	}
	return nil
}

// logCapture keeps the source's log lines and copies them to t.Log.
type logCapture struct {
	t   testing.TB
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logCapture) Write(p []byte) (int, error) {
	l.mu.Lock()
	l.buf.Write(p)
	l.mu.Unlock()
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func (l *logCapture) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// count is the number of lines holding every one of parts.
func (l *logCapture) count(parts ...string) int {
	n := 0
	for line := range strings.Lines(l.String()) {
		if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(line, p) }) {
			n++
		}
	}
	return n
}

func (l *logCapture) contains(parts ...string) bool { return l.count(parts...) > 0 }

// runSource starts a Source until the end of the test and checks that Run returns nil.
func runSource(t *testing.T, cfg Config, pub bus.Publisher) (*Source, *logCapture) {
	t.Helper()
	logs := &logCapture{t: t}
	s, err := New(cfg, pub, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
	})
	select {
	case <-s.Ready():
	case <-time.After(waitTimeout):
		t.Fatal("source not ready")
	}
	return s, logs
}

// consulClient is a client for the test's own registrations.
func consulClient(t *testing.T, addr string) *api.Client {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c, err := api.NewClient(&api.Config{Address: addr, Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

type instance struct {
	id, name, addr string
	port           int
	meta           map[string]string
	tags           []string
}

// register adds an instance with a passing TTL check "ttl-<id>".
func register(t *testing.T, c *api.Client, in instance) {
	t.Helper()
	err := c.Agent().ServiceRegister(&api.AgentServiceRegistration{
		ID: in.id, Name: in.name, Address: in.addr, Port: in.port, Meta: in.meta, Tags: in.tags,
		Check: &api.AgentServiceCheck{CheckID: "ttl-" + in.id, TTL: "10m", Status: api.HealthPassing},
	})
	if err != nil {
		t.Fatal(err)
	}
}

func deregister(t *testing.T, c *api.Client, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if err := c.Agent().ServiceDeregister(id); err != nil {
			t.Fatal(err)
		}
	}
}

const node = "sailplane-testenv" // testenv's agent node name

func wantEndpoint(id, addr string, ports map[string]uint32, labels map[string]string, h discoveryv1.Health) *discoveryv1.Endpoint {
	return &discoveryv1.Endpoint{Address: addr, Ports: ports, Labels: labels, Health: h, ClusterId: "test-cluster",
		Workload: node + "/" + id, Locality: &discoveryv1.Locality{Region: "dc1"}}
}

// waitEqual waits until get returns want (a nil want: the resource is absent).
func waitEqual[M proto.Message](t *testing.T, what string, get func() M, want M) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for got := get(); !proto.Equal(got, want); got = get() {
		if time.Now().After(deadline) {
			t.Fatalf("%s:\n got %v\nwant %v", what, prototext.Format(got), prototext.Format(want))
		}
		<-tick.C
	}
}

func waitEndpoints(t *testing.T, pub *recorder, name string, want *discoveryv1.Endpoints) {
	t.Helper()
	waitEqual(t, "Endpoints "+name, func() *discoveryv1.Endpoints { return pub.endpoints(name) }, want)
}

func waitService(t *testing.T, pub *recorder, name string, want *discoveryv1.Service) {
	t.Helper()
	waitEqual(t, "Service "+name, func() *discoveryv1.Service { return pub.service(name) }, want)
}

func wantService(host string, ports ...*discoveryv1.Port) *discoveryv1.Service {
	return &discoveryv1.Service{Hostname: host, Namespace: "consul", Ports: ports,
		Resolution: discoveryv1.Resolution_STATIC, Registry: "consul", ClusterId: "test-cluster"}
}

// TestCatalog follows one Source through registrations, health changes and removals on a real
// agent. The steps build on each other.
func TestCatalog(t *testing.T) {
	c := consulClient(t, sharedConsul.Addr())
	register(t, c, instance{id: "pre-1", name: "pre", addr: "198.18.0.9", port: 9000})
	t.Cleanup(func() { _ = c.Agent().ServiceDeregister("pre-1") })

	pub := newRecorder()
	runSource(t, Config{Address: sharedConsul.Addr(), ClusterID: "test-cluster", MinWait: 10 * time.Millisecond}, pub)

	const web = "consul/web.service.consul"
	web1 := wantEndpoint("web-1", "198.18.0.1", map[string]uint32{"http": 8080},
		map[string]string{"protocol": "http", "team": "a", "version": "v1", "canary": ""}, discoveryv1.Health_HEALTHY)
	web2 := wantEndpoint("web-2", "198.18.0.2", map[string]uint32{"http": 8080},
		map[string]string{"protocol": "http"}, discoveryv1.Health_HEALTHY)
	webEndpoints := func(eps ...*discoveryv1.Endpoint) *discoveryv1.Endpoints {
		return &discoveryv1.Endpoints{Hostname: "web.service.consul", Namespace: "consul", Endpoints: eps}
	}

	t.Run("state before Ready", func(t *testing.T) {
		// Checked without waiting: Ready promises the first full state is already published.
		name := "consul/pre.service.consul"
		if got, want := pub.service(name), wantService("pre.service.consul", &discoveryv1.Port{Name: "tcp", Number: 9000, Protocol: "TCP"}); !proto.Equal(got, want) {
			t.Errorf("Service at Ready:\n got %v\nwant %v", prototext.Format(got), prototext.Format(want))
		}
		want := &discoveryv1.Endpoints{Hostname: "pre.service.consul", Namespace: "consul", Endpoints: []*discoveryv1.Endpoint{
			wantEndpoint("pre-1", "198.18.0.9", map[string]uint32{"tcp": 9000}, nil, discoveryv1.Health_HEALTHY)}}
		if got := pub.endpoints(name); !proto.Equal(got, want) {
			t.Errorf("Endpoints at Ready:\n got %v\nwant %v", prototext.Format(got), prototext.Format(want))
		}
	})

	t.Run("first instance", func(t *testing.T) {
		register(t, c, instance{id: "web-1", name: "web", addr: "198.18.0.1", port: 8080,
			meta: map[string]string{"protocol": "http", "team": "a"}, tags: []string{"version=v1", "canary"}})
		waitService(t, pub, web, wantService("web.service.consul", &discoveryv1.Port{Name: "http", Number: 8080, Protocol: "HTTP"}))
		waitEndpoints(t, pub, web, webEndpoints(web1))
	})

	t.Run("second instance sends one Endpoints resource", func(t *testing.T) {
		mark := pub.mark()
		register(t, c, instance{id: "web-2", name: "web", addr: "198.18.0.2", port: 8080, meta: map[string]string{"protocol": "http"}})
		waitEndpoints(t, pub, web, webEndpoints(web1, web2))
		calls := pub.callsSince(mark)
		if len(calls) == 0 {
			t.Fatal("no call published")
		}
		for _, c := range calls {
			if c.op != "Upsert" || c.typeURL != schema.Endpoints.TypeURL || !slices.Equal(c.names, []string{web}) {
				t.Errorf("unexpected call %+v: only the Endpoints of %s changed", c, web)
			}
		}
	})

	t.Run("critical check makes the endpoint unhealthy, warning does not", func(t *testing.T) {
		if err := c.Agent().UpdateTTL("ttl-web-2", "down", api.HealthCritical); err != nil {
			t.Fatal(err)
		}
		sick := proto.CloneOf(web2)
		sick.Health = discoveryv1.Health_UNHEALTHY
		waitEndpoints(t, pub, web, webEndpoints(web1, sick))
		if err := c.Agent().UpdateTTL("ttl-web-2", "slow", api.HealthWarning); err != nil {
			t.Fatal(err)
		}
		waitEndpoints(t, pub, web, webEndpoints(web1, web2))
	})

	t.Run("protocols", func(t *testing.T) {
		for _, tc := range []struct {
			name, meta string
			want       *discoveryv1.Port
		}{
			{"proto-grpc", "grpc", &discoveryv1.Port{Name: "grpc", Number: 7001, Protocol: "GRPC"}},
			{"proto-http2", "HTTP2", &discoveryv1.Port{Name: "http2", Number: 7002, Protocol: "HTTP2"}},
			{"proto-tcp", "tcp", &discoveryv1.Port{Name: "tcp", Number: 7003, Protocol: "TCP"}},
			{"proto-none", "", &discoveryv1.Port{Name: "tcp", Number: 7004, Protocol: "TCP"}},
			{"proto-unknown", "mongo", &discoveryv1.Port{Name: "tcp", Number: 7005, Protocol: "TCP"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				var meta map[string]string
				if tc.meta != "" {
					meta = map[string]string{"protocol": tc.meta}
				}
				name := "consul/" + tc.name + ".service.consul"
				register(t, c, instance{id: tc.name + "-1", name: tc.name, addr: "198.18.1.1", port: int(tc.want.Number), meta: meta})
				waitService(t, pub, name, wantService(tc.name+".service.consul", tc.want))
				// Removed and waited for here, so that later steps see only their own changes.
				deregister(t, c, tc.name+"-1")
				eventually(t, name+" deleted", func() bool { return pub.service(name) == nil && pub.endpoints(name) == nil })
			})
		}
	})

	t.Run("deregistration deletes both resources", func(t *testing.T) {
		mark := pub.mark()
		deregister(t, c, "web-1", "web-2")
		eventually(t, "web deleted", func() bool { return pub.service(web) == nil && pub.endpoints(web) == nil })
		var deleted []string
		for _, c := range pub.callsSince(mark) {
			if c.op == "Delete" {
				deleted = append(deleted, c.typeURL+" "+strings.Join(c.names, ","))
			}
		}
		want := []string{schema.Endpoints.TypeURL + " " + web, schema.Service.TypeURL + " " + web}
		if !slices.Equal(deleted, want) {
			t.Errorf("deletes = %q, want %q", deleted, want)
		}
		if pub.service("consul/pre.service.consul") == nil {
			t.Error("an unrelated service was deleted")
		}
	})
}

// proxy forwards TCP to a target and can be cut, which looks to the Source like Consul being
// unreachable while the test still reaches the agent directly.
type proxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]struct{}
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = ln.Close()
		p.setDown(true)
		p.wg.Wait()
	})
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			continue
		}
		p.wg.Go(func() { p.serve(c) })
	}
}

// track remembers c so setDown can cut it; it closes c and returns false while down.
func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *proxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
		_ = c.Close()
	}
}

func (p *proxy) serve(c net.Conn) {
	u, err := net.Dial("tcp", p.target)
	if err != nil {
		p.untrack(c)
		return
	}
	if !p.track(u) {
		p.untrack(c)
		return
	}
	var up sync.WaitGroup
	up.Go(func() {
		_, _ = io.Copy(u, c)
		p.untrack(c, u)
	})
	_, _ = io.Copy(c, u)
	p.untrack(c, u)
	up.Wait()
}

func (p *proxy) setDown(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
	if down {
		for c := range p.conns {
			_ = c.Close()
		}
	}
}

// TestUnreachable checks that an unreachable Consul never deletes anything, that retries are
// logged, that the resync after the outage deletes what went away meanwhile, and that the ACL
// token never shows in the logs.
func TestUnreachable(t *testing.T) {
	agent := testenv.ConsulForTest(t)
	c := consulClient(t, agent.Addr())
	p := newProxy(t, agent.Addr())
	register(t, c, instance{id: "keep-1", name: "keep", addr: "198.18.2.1", port: 80})
	register(t, c, instance{id: "gone-1", name: "gone", addr: "198.18.2.2", port: 80})

	const token = "s3cr3t-test-token-4f1c"
	pub := newRecorder()
	metrics := telemetrytest.New(t)
	_, logs := runSource(t, Config{
		Address: p.addr(), Token: token, ClusterID: "test-cluster",
		Backoff:  Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond},
		WaitTime: 2 * time.Second, MinWait: 10 * time.Millisecond,
		MeterProvider: metrics.Provider(),
	}, pub)
	// A second Source talks to the agent directly, to see what a stopped agent looks like
	// without the proxy in between (connection refused rather than a closed connection).
	direct := newRecorder()
	_, directLogs := runSource(t, Config{
		Address: agent.Addr(), Token: token, ClusterID: "test-cluster",
		Backoff:  Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond},
		WaitTime: 2 * time.Second, MinWait: 10 * time.Millisecond,
	}, direct)
	const keep, gone = "consul/keep.service.consul", "consul/gone.service.consul"
	for _, n := range []string{keep, gone} {
		if pub.service(n) == nil || pub.endpoints(n) == nil {
			t.Fatalf("%s not published at Ready", n)
		}
	}
	failed := func() int { return logs.count("level=WARN", "consul query failed", `query="service list"`) }

	t.Run("outage keeps the state and retries", func(t *testing.T) {
		mark, before := pub.mark(), failed()
		if n := metrics.Value("sailplane_consul_watch_errors_total"); n != 0 {
			t.Errorf("%v watch errors counted before the outage", n)
		}
		p.setDown(true)
		eventually(t, "two logged retries", func() bool { return failed() >= before+2 })
		eventually(t, "the failed queries counted", func() bool {
			return metrics.Value("sailplane_consul_watch_errors_total", "query", "services") >= 2 &&
				metrics.Value("sailplane_consul_watch_errors_total", "query", "service") >= 2
		})
		// Deregistered behind the Source's back: it must not learn of it until Consul is back.
		deregister(t, c, "gone-1")
		eventually(t, "more logged retries", func() bool { return failed() >= before+4 })
		if calls := pub.callsSince(mark); len(calls) != 0 {
			t.Errorf("published during the outage: %+v", calls)
		}
	})

	t.Run("resync deletes what went away meanwhile", func(t *testing.T) {
		mark := pub.mark()
		p.setDown(false)
		eventually(t, "gone deleted", func() bool { return pub.service(gone) == nil && pub.endpoints(gone) == nil })
		for _, c := range pub.callsSince(mark) {
			if c.op != "Delete" || !slices.Equal(c.names, []string{gone}) {
				t.Errorf("unexpected call %+v after the resync", c)
			}
		}
		if pub.service(keep) == nil || pub.endpoints(keep) == nil {
			t.Error("keep was deleted")
		}
		if !logs.contains("consul query succeeded again") {
			t.Error("the recovery was not logged")
		}
	})

	t.Run("stopped agent keeps the state", func(t *testing.T) {
		refused := func() int {
			return directLogs.count("level=WARN", "consul query failed", `query="service list"`, "connection refused")
		}
		mark, directMark, before := pub.mark(), direct.mark(), failed()
		agent.Stop()
		eventually(t, "two logged retries", func() bool { return failed() >= before+2 && refused() >= 2 })
		if calls := pub.callsSince(mark); len(calls) != 0 {
			t.Errorf("published after the agent stopped: %+v", calls)
		}
		if calls := direct.callsSince(directMark); len(calls) != 0 {
			t.Errorf("published after the agent stopped (direct): %+v", calls)
		}
		if pub.service(keep) == nil || pub.endpoints(keep) == nil || direct.service(keep) == nil || direct.endpoints(keep) == nil {
			t.Error("keep was deleted")
		}
	})

	if strings.Contains(logs.String()+directLogs.String(), token) {
		t.Error("the ACL token appears in the logs")
	}
}
