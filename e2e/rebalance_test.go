package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"

	"sailplane.dev/e2e/framework"
)

// TestRebalanceAcrossProcesses: two xds-server processes, each given both replicas'
// addresses in --xds-peers (as a headless Service's name gives every replica, itself
// included). Every proxy connects to the first while the second is not running; once the
// second is up, the first, reading the second's load report, closes its newest connections
// round by round, their proxies reconnect through the "Service" (a resolver spreading new
// connections over both), and both end up holding their share. Meanwhile every proxy keeps
// calling its backend with no RPC failing, and afterwards a config change reaches every proxy
// on whichever replica it landed.
func TestRebalanceAcrossProcesses(t *testing.T) {
	const proxies = 12
	backends := map[string]*framework.Echo{
		"a": framework.StartEcho(t, "a", "127.0.0.1:0"),
		"b": framework.StartEcho(t, "b", "127.0.0.1:0"),
	}
	dir := t.TempDir()
	framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", meshYAML)
	framework.WriteFile(t, dir, "etc/sailplane/conf/echo.yaml", echoConfig(backends["a"].Addr))

	configBus, registryBus := framework.FreeAddr(t), framework.FreeAddr(t)
	framework.Start(t, dir, framework.Binary(t, "config-ingest"), "--config-source", "files",
		"--mesh-config", "etc/sailplane/mesh.yaml", "--bus-listen", configBus)
	watcher := framework.Start(t, dir, framework.Binary(t, "endpoint-watcher"), "--kubernetes", "off",
		"--config-bus", configBus, "--bus-listen", registryBus)
	addrs := []string{framework.FreeAddr(t), framework.FreeAddr(t)}
	// No --pod-name: two processes on one host, each telling itself from its peers on its own.
	startReplica := func(addr string) *framework.Process {
		return framework.Start(t, dir, framework.Binary(t, "xds-server"), "--config-bus", configBus, "--registry-bus", registryBus,
			"--xds-listen", addr, "--xds-peers", strings.Join(addrs, ","), "--xds-rebalance-interval", "1s")
	}
	replicas := []*framework.Process{startReplica(addrs[0])}
	framework.WaitReady(t, replicas[0])
	// Subscribers stop before the buses they read: a bus server stopping waits for its streams.
	t.Cleanup(func() {
		for _, p := range append(replicas, watcher) {
			p.Stop()
		}
	})

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var clients []framework.EchoClient
	var loads []*callLoad
	for i := range proxies {
		nodeID := fmt.Sprintf("sidecar~127.0.0.1~proxy-%d.demo~demo.svc.cluster.local", i)
		c := framework.DialXDS(t, echoTarget, framework.GRPCBootstrap(spread(addrs...), nodeID),
			grpcInsecure)
		framework.WaitServing(ctx, t, c)
		clients = append(clients, c)
		loads = append(loads, startCallLoad(t, c, 100*time.Millisecond))
	}
	connected := func(p *framework.Process) (float64, error) {
		fams, err := scrapeMetrics(ctx, p.Monitoring)
		if err != nil {
			return 0, err
		}
		n, _ := fams.Value("pilot_xds", "type", "proxyless")
		return n, nil
	}
	framework.Eventually(t, time.Minute, func() error {
		if n, err := connected(replicas[0]); err != nil || n != proxies {
			return fmt.Errorf("the first replica holds %v proxies (%v), want all %d", n, err, proxies)
		}
		return nil
	})

	replicas = append(replicas, startReplica(addrs[1]))
	started := time.Now()
	// Balanced as the rebalancer means it: neither replica above the average by its margin (10 %).
	var counts [2]float64
	framework.Eventually(t, 2*time.Minute, func() error {
		for i, p := range replicas {
			n, err := connected(p)
			if err != nil {
				return err
			}
			counts[i] = n
		}
		if counts[0]+counts[1] != proxies || max(counts[0], counts[1]) > proxies/2*1.1 {
			return fmt.Errorf("the replicas hold %v and %v proxies, want %d each", counts[0], counts[1], proxies/2)
		}
		return nil
	})
	t.Logf("rebalanced %v after the second replica started: %v and %v proxies", time.Since(started).Round(time.Millisecond), counts[0], counts[1])
	fams, err := scrapeMetrics(ctx, replicas[0].Monitoring)
	if err != nil {
		t.Fatal(err)
	}
	if shed, _ := fams.Value("sailplane_xds_closed_connections", "reason", "rebalance"); shed < proxies/2 {
		t.Errorf("the first replica closed %v connections to rebalance, want at least %d", shed, proxies/2)
	}

	// Every proxy is still served: a change reaches each, wherever it reconnected.
	marks := make([]int, proxies)
	for i, l := range loads {
		marks[i] = l.mark()
	}
	framework.WriteFile(t, dir, "etc/sailplane/conf/echo.yaml", echoConfig(backends["b"].Addr))
	changed := time.Now()
	for i, l := range loads {
		l.waitBackend(t, marks[i], changed, "b", time.Minute)
	}
	for i, l := range loads {
		l.stop()
		if err := noFailures(l.since(0)); err != nil {
			t.Errorf("proxy-%d: %v", i, err)
		}
	}
}

var grpcInsecure = grpc.WithTransportCredentials(insecure.NewCredentials())

// spreadScheme is a resolver of "sailplane-spread:///addr1,addr2,...": a Kubernetes Service's
// name in front of several xds-server replicas, handing each new connection to any of them.
// It gives the addresses in a new random order at each resolution, which gRPC asks for when
// a connection is lost, so a proxy whose connection a replica closed reconnects to either.
const spreadScheme = "sailplane-spread"

func init() { resolver.Register(spreadBuilder{}) }

type spreadBuilder struct{}

func (spreadBuilder) Scheme() string { return spreadScheme }

func (spreadBuilder) Build(target resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	r := &spreadResolver{cc: cc, addrs: strings.Split(target.Endpoint(), ",")}
	return r, r.update()
}

type spreadResolver struct {
	cc    resolver.ClientConn
	addrs []string
}

func (r *spreadResolver) update() error {
	var state resolver.State
	for _, i := range rand.Perm(len(r.addrs)) {
		state.Addresses = append(state.Addresses, resolver.Address{Addr: r.addrs[i]})
	}
	return r.cc.UpdateState(state)
}

// ResolveNow answers from gRPC's own resolver goroutine, which allows updating the state.
func (r *spreadResolver) ResolveNow(resolver.ResolveNowOptions) { _ = r.update() }
func (*spreadResolver) Close()                                  {}

// spread is the server_uri of a client of several xds-servers behind one Service.
func spread(addrs ...string) string {
	return spreadScheme + ":///" + strings.Join(addrs, ",")
}
