package e2e

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/shared/grpctest"
	"sailplane.dev/tools/testenv"
)

// TestTracing runs Sailplane with --tracing-endpoint pointing at an OTLP collector the test
// serves, edits one config file, and checks that the edit's trace arrives whole: from the file
// event to the gRPC xDS client's ACK, one tree; then the same for an instance registered in
// Consul, from the query's answer. In the microservices topology the trace crosses the bus
// between config-ingest (or endpoint-watcher) and xds-server.
func TestTracing(t *testing.T) {
	// The processes export spans every 100 ms instead of the SDK's 5 s: the test waits less.
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
	for _, tc := range []struct {
		name  string
		start func(t *testing.T, dir, collector, consul string) (xdsAddr string)
		// services, workloadServices and consulServices are the service.name of the processes
		// the trace of a route change, of a WorkloadEntry change and of a Consul instance's
		// registration must cross, in order.
		services, workloadServices, consulServices []string
	}{
		{"hyper", func(t *testing.T, dir, collector, consul string) string {
			xds := framework.FreeAddr(t)
			framework.Start(t, dir, framework.Binary(t, "hyper"), "--tracing-endpoint", collector, "--consul", consul,
				"--xds-listen", xds, "--bus-listen", framework.FreeAddr(t), "--xds-tls-listen", framework.FreeAddr(t))
			return xds
		}, []string{"hyper"}, []string{"hyper"}, []string{"hyper"}},
		{"microservices", func(t *testing.T, dir, collector, consul string) string {
			configBus, registryBus, xds := framework.FreeAddr(t), framework.FreeAddr(t), framework.FreeAddr(t)
			framework.Start(t, dir, framework.Binary(t, "config-ingest"), "--tracing-endpoint", collector,
				"--mesh-config", filepath.Join(dir, "etc/sailplane/mesh.yaml"), "--bus-listen", configBus)
			framework.Start(t, dir, framework.Binary(t, "endpoint-watcher"), "--tracing-endpoint", collector, "--consul", consul,
				"--config-bus", configBus, "--bus-listen", registryBus)
			framework.Start(t, dir, framework.Binary(t, "xds-server"), "--tracing-endpoint", collector,
				"--config-bus", configBus, "--registry-bus", registryBus, "--xds-listen", xds)
			return xds
		}, []string{"config-ingest", "xds-server"}, []string{"config-ingest", "endpoint-watcher", "xds-server"},
			[]string{"endpoint-watcher", "xds-server"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			collector := startCollector(t)
			consulAgent := testenv.ConsulForTest(t)
			consul := consulCLI(t, consulAgent.Addr())
			v1 := framework.StartEcho(t, "v1", "127.0.0.1:0")
			v2 := framework.StartEcho(t, "v2", "127.0.0.1:0")
			dir := t.TempDir()
			framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", meshYAML)
			framework.WriteFile(t, dir, "etc/sailplane/conf/echo/service.yaml", serviceYAML(v1, v2))
			framework.WriteFile(t, dir, "etc/sailplane/conf/echo/traffic.yaml", trafficYAML(80, 20))
			xdsAddr := tc.start(t, dir, "http://"+collector.addr, consulAgent.Addr())
			client := framework.XDSClient(t, xdsAddr, echoTarget)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			framework.WaitServing(ctx, t, client)

			want := []string{"config.change", "config.scan", "bus.publish", "bus.deliver", "xds.debounce", "xds.push",
				"xds.snapshot", "xds.proxy", "xds.queue", "xds.generate", "xds.send", "xds.ack"}
			t.Run("route change", func(t *testing.T) {
				framework.WriteFile(t, dir, "etc/sailplane/conf/echo/traffic.yaml", trafficYAML(0, 100))
				tree := collector.waitTrace(t, fileEdit("networking.istio.io/v1/VirtualService"), want)
				checkCrossing(t, tree, tc.services)
				if deliver, publish := find(tree, "bus.deliver"), find(tree, "bus.publish"); !bytes.Equal(deliver.ParentSpanId, publish.SpanId) {
					t.Errorf("bus.deliver's parent is %x, want bus.publish %x", deliver.ParentSpanId, publish.SpanId)
				}
			})
			// A WorkloadEntry's change reaches xds-server as endpoints endpoint-watcher derives.
			t.Run("workload change", func(t *testing.T) {
				// v2 (where the route sends everything) moves to v1's port.
				framework.WriteFile(t, dir, "etc/sailplane/conf/echo/service.yaml", serviceYAML(v1, v1))
				tree := collector.waitTrace(t, fileEdit("networking.istio.io/v1/WorkloadEntry"), want)
				checkCrossing(t, tree, tc.workloadServices)
				if s := find(tree, "xds.send"); s == nil || !hasAttr(s.Span, "sailplane.type", "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment") {
					t.Errorf("the workload change's trace sends no endpoints")
				}
			})
			// A second instance of a Consul service (at a loopback address where nothing
			// listens) reaches a client of that service as endpoints.
			t.Run("consul instance registered", func(t *testing.T) {
				_, port, err := net.SplitHostPort(v1.Addr)
				if err != nil {
					t.Fatal(err)
				}
				p, _ := strconv.Atoi(port)
				consul("services", "register", consulServiceFile(t, "echo-consul-1", "echo-consul", "127.0.0.1", p))
				client := framework.XDSClient(t, xdsAddr, fmt.Sprintf("xds:///echo-consul.service.consul:%d", p))
				framework.WaitServing(ctx, t, client)
				consul("services", "register", consulServiceFile(t, "echo-consul-2", "echo-consul", "127.0.0.2", p))
				want := []string{"endpoints.change", "endpoints.update", "bus.publish", "bus.deliver", "xds.debounce",
					"xds.push", "xds.snapshot", "xds.proxy", "xds.queue", "xds.generate", "xds.send", "xds.ack"}
				tree := collector.waitTrace(t, endpointsChange("consul", "echo-consul"), want)
				checkCrossing(t, tree, tc.consulServices)
			})
		})
	}
}

// fileEdit matches the trace of a file event that published typeURL.
func fileEdit(typeURL string) func(spans []*span) bool {
	return func(spans []*span) bool {
		root := find(spans, "config.change")
		return root != nil && hasAttr(root.Span, "sailplane.trigger", "file event") && publishes(spans, typeURL)
	}
}

// endpointsChange matches the trace of a change of the named service that registry observed.
func endpointsChange(registry, name string) func(spans []*span) bool {
	return func(spans []*span) bool {
		root := find(spans, "endpoints.change")
		return root != nil && hasAttr(root.Span, "sailplane.registry", registry) && hasAttr(root.Span, "sailplane.name", name)
	}
}

// checkCrossing checks that the trace's path from its root to the ACK (from the xds.ack
// span up, parent by parent) crosses services, in order.
func checkCrossing(t *testing.T, tree []*span, services []string) {
	t.Helper()
	byID := map[string]*span{}
	for _, s := range tree {
		byID[string(s.SpanId)] = s
		t.Logf("%s: %s %x (parent %x)", s.service, s.Name, s.SpanId, s.ParentSpanId)
	}
	var crossed []string
	for s := find(tree, "xds.ack"); s != nil; s = byID[string(s.ParentSpanId)] {
		if len(crossed) == 0 || crossed[0] != s.service {
			crossed = append([]string{s.service}, crossed...)
		}
	}
	if !slices.Equal(crossed, services) {
		t.Errorf("the path to the ACK crosses %v, want %v", crossed, services)
	}
}

// span is an exported span with the service that sent it.
type span struct {
	*tracepb.Span
	service string
}

func find(spans []*span, name string) *span {
	for _, s := range spans {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// collector is an OTLP/gRPC trace collector on 127.0.0.1 keeping every span it receives.
type collector struct {
	collectortrace.UnimplementedTraceServiceServer
	addr  string
	mu    sync.Mutex
	spans []*span
}

func startCollector(t *testing.T) *collector {
	t.Helper()
	c := &collector{}
	c.addr = grpctest.Serve(t, func(gs *grpc.Server) { collectortrace.RegisterTraceServiceServer(gs, c) }).String()
	return c
}

func (c *collector) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, a := range rs.GetResource().GetAttributes() {
			if a.GetKey() == "service.name" {
				service = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				c.spans = append(c.spans, &span{Span: s, service: service})
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// waitTrace waits for a trace that match accepts, holds a span of every one of names, and is
// whole: every span but the root has its parent in the trace.
func (c *collector) waitTrace(t *testing.T, match func(spans []*span) bool, names []string) []*span {
	t.Helper()
	var tree []*span
	framework.Eventually(t, time.Minute, func() error {
		var err error
		tree, err = c.trace(match, names)
		return err
	})
	return tree
}

func (c *collector) trace(match func(spans []*span) bool, names []string) ([]*span, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	byTrace := map[string][]*span{}
	for _, s := range c.spans {
		id := hex.EncodeToString(s.TraceId)
		byTrace[id] = append(byTrace[id], s)
	}
	var problems []string
	for id, spans := range byTrace {
		if !match(spans) {
			continue
		}
		var missing []string
		for _, n := range names {
			if find(spans, n) == nil {
				missing = append(missing, n)
			}
		}
		ids := map[string]bool{}
		for _, s := range spans {
			ids[string(s.SpanId)] = true
		}
		var orphans []string
		for _, s := range spans {
			if len(s.ParentSpanId) > 0 && !ids[string(s.ParentSpanId)] {
				orphans = append(orphans, s.Name)
			}
		}
		if len(missing) == 0 && len(orphans) == 0 {
			return spans, nil
		}
		var got []string
		for _, s := range spans {
			got = append(got, s.service+":"+s.Name)
		}
		problems = append(problems, fmt.Sprintf("trace %s: missing %v, parents not received of %v; has %v", id, missing, orphans, got))
	}
	return nil, fmt.Errorf("no whole trace of the change yet (%d spans received): %s", len(c.spans), strings.Join(problems, "; "))
}

func hasAttr(s *tracepb.Span, key, value string) bool {
	for _, a := range s.GetAttributes() {
		if a.GetKey() == key && a.GetValue().GetStringValue() == value {
			return true
		}
	}
	return false
}

func publishes(spans []*span, typeURL string) bool {
	for _, s := range spans {
		if s.Name == "bus.publish" && hasAttr(s.Span, "sailplane.type", typeURL) {
			return true
		}
	}
	return false
}
