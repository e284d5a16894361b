package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/xds"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	configingest "sailplane.dev/services/config-ingest"
	endpointwatcher "sailplane.dev/services/endpoint-watcher"
	xdsserver "sailplane.dev/services/xds-server"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/component"
	"sailplane.dev/shared/grpctest"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/telemetry/telemetrytest"
	"sailplane.dev/shared/testlog"
	"sailplane.dev/shared/testwait"
)

const waitFor = time.Minute

// TestTracingInProcess follows one edit of a config file through hyper's in-process wiring
// (config-ingest, the in-memory bus, xds-server) to a real gRPC xDS client's ACK, and checks the
// trace's span tree: one trace from the file event to the ACK.
func TestTracingInProcess(t *testing.T) {
	exporter, _ := telemetrytest.RecordSpans(t)
	backend := grpctest.HealthBackend(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "echo.yaml"), virtualService(5))
	store, _, addr := startInProcess(t, dir, nil)
	publishRegistry(t, store, backend.Port)

	// A real gRPC xDS client, connected (listener, route, cluster, endpoints ACKed).
	client := dialXDS(t, addr, "xds:///echo.demo.svc.cluster.local:7070")
	client.Connect()
	testwait.Until(t, waitFor, "the xDS client to connect", func() bool {
		return client.GetState() == connectivity.Ready
	})

	// The edit: the route's weights change.
	writeFile(t, filepath.Join(dir, "echo.yaml"), virtualService(7))

	var push sdktrace.ReadOnlySpan
	testwait.For(t, waitFor, "the edit's trace to reach the client's ACK", func() error {
		spans := exporter.GetSpans().Snapshots()
		for _, s := range spans {
			if s.Name() == "xds.push" && rootOf(spans, s).Name() == "config.change" {
				push = s
				return nil
			}
		}
		return fmt.Errorf("no xds.push span under a config.change yet; spans: %s", names(spans))
	})
	spans := inTrace(exporter.GetSpans().Snapshots(), push.SpanContext().TraceID())
	tree := treeOf(spans)
	t.Logf("trace:\n%s", tree)

	// The path from the file event to the push, each span a child of the one before.
	root := rootOf(spans, push)
	if got := attr(root, "sailplane.trigger"); got != "file event" {
		t.Errorf("config.change trigger %q, want file event", got)
	}
	checkPath(t, spans, push, "config.change", "bus.publish", "bus.deliver", "xds.debounce", "xds.push")
	if len(childrenOf(spans, root, "config.scan")) != 1 {
		t.Errorf("config.change has no config.scan child (reading and validating)")
	}
	if len(childrenOf(spans, push, "xds.snapshot")) != 1 {
		t.Errorf("xds.push has no xds.snapshot child")
	}
	proxies := childrenOf(spans, push, "xds.proxy")
	if len(proxies) != 1 {
		t.Fatalf("xds.push has %d xds.proxy children, want 1 (one client)", len(proxies))
	}
	proxy := proxies[0]
	if len(childrenOf(spans, proxy, "xds.queue")) != 1 {
		t.Errorf("xds.proxy has no xds.queue child")
	}
	gens, sends, acks := childrenOf(spans, proxy, "xds.generate"), childrenOf(spans, proxy, "xds.send"), childrenOf(spans, proxy, "xds.ack")
	if len(sends) == 0 || len(sends) != len(acks) || len(sends) != len(gens) {
		t.Fatalf("xds.proxy has %d xds.generate, %d xds.send and %d xds.ack children, want as many, at least one",
			len(gens), len(sends), len(acks))
	}
	for _, send := range sends {
		typ := attr(send, "sailplane.type")
		var ack sdktrace.ReadOnlySpan
		for _, a := range acks {
			if attr(a, "sailplane.nonce") == attr(send, "sailplane.nonce") {
				ack = a
			}
		}
		switch {
		case ack == nil:
			t.Errorf("no xds.ack for the xds.send of %s", typ)
		case ack.EndTime().Before(send.EndTime()):
			t.Errorf("%s: ACK ends at %v, before the send at %v", typ, ack.EndTime(), send.EndTime())
		case ack.Status().Code == codes.Error:
			t.Errorf("%s: NACKed: %s", typ, ack.Status().Description)
		}
		if push.EndTime().Before(ack.EndTime()) {
			t.Errorf("xds.push ends before the %s ACK", typ)
		}
	}
	if !strings.Contains(tree, "RouteConfiguration") {
		t.Errorf("the route the edit changed was not sent in the trace")
	}
	if got := attr(push, "sailplane.acked"); got != "1" {
		t.Errorf("xds.push: %s proxies acked, want 1", got)
	}
}

// startInProcess runs hyper's in-process wiring until the test ends: config-ingest of dir,
// the endpoint-watcher of watcher when it is set, and xds-server, on one store as in hyper's
// main. It returns the store, the xds-server, ready, and its plaintext xDS listener's address.
func startInProcess(t *testing.T, dir string, watcher *endpointwatcher.Config) (*bus.Store, *xdsserver.Server, net.Addr) {
	t.Helper()
	log := testlog.New(t, slog.LevelInfo)
	store := bus.NewStore(bus.WithLogger(log))
	local := func(consumer string) bus.Source { return bus.Local(store, bus.WithLocalConsumer(consumer)) }
	var m component.Manager
	ingest, err := configingest.New(configingest.Config{ConfigDirs: []string{dir}, Debounce: 20 * time.Millisecond},
		configingest.Deps{Logger: log.With("component", "config-ingest"), Publisher: store})
	if err != nil {
		t.Fatal(err)
	}
	store.SyncAfter(ingest.Ready(), configingest.PublishedTypes()...)
	m.Add("config-ingest", ingest)
	if watcher != nil {
		w, err := endpointwatcher.New(*watcher, endpointwatcher.Deps{Logger: log.With("component", "endpoint-watcher"),
			Config: local("endpoint-watcher"), Publisher: store})
		if err != nil {
			t.Fatal(err)
		}
		store.SyncAfter(w.Ready(), endpointwatcher.PublishedTypes()...)
		m.Add("endpoint-watcher", w)
	}
	srv, err := xdsserver.New(xdsserver.Config{Debounce: 20 * time.Millisecond},
		xdsserver.Deps{Logger: log.With("component", "xds-server"), Config: local("xds-server"), Registry: local("xds-server")})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m.Add("xds-server", component.Func(func(ctx context.Context) error { return srv.Serve(ctx, lis) }))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	select {
	case <-srv.Ready():
	case <-time.After(waitFor):
		t.Fatal("xds-server not ready")
	}
	return store, srv, lis.Addr()
}

func publishRegistry(t *testing.T, store *bus.Store, port int) {
	t.Helper()
	svc := &discoveryv1.Service{Hostname: "echo.demo.svc.cluster.local", Namespace: "demo",
		Ports: []*discoveryv1.Port{{Name: "grpc", Number: 7070, Protocol: "GRPC"}}}
	eps := &discoveryv1.Endpoints{Hostname: "echo.demo.svc.cluster.local", Namespace: "demo", Endpoints: []*discoveryv1.Endpoint{
		{Address: "127.0.0.1", Ports: map[string]uint32{"grpc": uint32(port)}, Labels: map[string]string{"version": "v1"}},
	}}
	if err := store.Upsert(schema.Service.TypeURL, &bus.Resource{Name: "demo/echo", Body: svc}); err != nil {
		t.Fatal(err)
	}
	if err := store.Upsert(schema.Endpoints.TypeURL, &bus.Resource{Name: "demo/echo", Body: eps}); err != nil {
		t.Fatal(err)
	}
}

// virtualService routes echo with a timeout of the given seconds.
func virtualService(timeout int) string {
	return fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: echo, namespace: demo}
spec:
  hosts: [echo.demo.svc.cluster.local]
  http:
  - timeout: %ds
    route:
    - destination: {host: echo.demo.svc.cluster.local}
`, timeout)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// dialXDS returns a client whose xDS client belongs to this test only.
func dialXDS(t *testing.T, server net.Addr, target string) *grpc.ClientConn {
	t.Helper()
	bootstrap := fmt.Sprintf(`{
  "xds_servers": [{"server_uri": %q, "channel_creds": [{"type": "insecure"}], "server_features": ["xds_v3"]}],
  "node": {"id": "sidecar~127.0.0.1~client.demo~demo.svc.cluster.local", "metadata": {"GENERATOR": "grpc", "NAMESPACE": "demo"}, "locality": {}}
}`, server.String())
	builder, err := xds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(builder),
		grpc.WithContextDialer(loopbackOnly))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// loopbackOnly dials loopback addresses only. Tests whose endpoints come from a real API server
// (which refuses loopback endpoints) only need their client to receive them: it never sends a
// packet to them.
func loopbackOnly(ctx context.Context, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("test dialer: %s is not a loopback address", addr)
	}
	return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
}

// Span tree helpers.

// checkPath checks the path from the root of s's trace down to s, span names in order.
func checkPath(t *testing.T, spans []sdktrace.ReadOnlySpan, s sdktrace.ReadOnlySpan, want ...string) {
	t.Helper()
	var path []string
	for ; s != nil; s = parentOf(spans, s) {
		path = append([]string{s.Name()}, path...)
	}
	if !slices.Equal(path, want) {
		t.Errorf("path to %s: %s, want %s", want[len(want)-1], strings.Join(path, " > "), strings.Join(want, " > "))
	}
}

func inTrace(spans []sdktrace.ReadOnlySpan, id trace.TraceID) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.SpanContext().TraceID() == id {
			out = append(out, s)
		}
	}
	return out
}

func parentOf(spans []sdktrace.ReadOnlySpan, s sdktrace.ReadOnlySpan) sdktrace.ReadOnlySpan {
	for _, p := range spans {
		if p.SpanContext().SpanID() == s.Parent().SpanID() && p.SpanContext().TraceID() == s.SpanContext().TraceID() {
			return p
		}
	}
	return nil
}

func rootOf(spans []sdktrace.ReadOnlySpan, s sdktrace.ReadOnlySpan) sdktrace.ReadOnlySpan {
	for p := parentOf(spans, s); p != nil; p = parentOf(spans, s) {
		s = p
	}
	return s
}

func childrenOf(spans []sdktrace.ReadOnlySpan, parent sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name && s.Parent().SpanID() == parent.SpanContext().SpanID() {
			out = append(out, s)
		}
	}
	return out
}

func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, a := range s.Attributes() {
		if string(a.Key) == key {
			return a.Value.Emit()
		}
	}
	return ""
}

func names(spans []sdktrace.ReadOnlySpan) string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name())
	}
	return strings.Join(out, ", ")
}

// treeOf renders spans as an indented tree with their types, for logs and failures.
func treeOf(spans []sdktrace.ReadOnlySpan) string {
	var b strings.Builder
	var walk func(s sdktrace.ReadOnlySpan, depth int)
	walk = func(s sdktrace.ReadOnlySpan, depth int) {
		fmt.Fprintf(&b, "%s%s %s %v\n", strings.Repeat("  ", depth), s.Name(), attr(s, "sailplane.type"), s.EndTime().Sub(s.StartTime()))
		for _, c := range spans {
			if c.Parent().SpanID() == s.SpanContext().SpanID() {
				walk(c, depth+1)
			}
		}
	}
	for _, s := range spans {
		if parentOf(spans, s) == nil {
			walk(s, 0)
		}
	}
	return b.String()
}
