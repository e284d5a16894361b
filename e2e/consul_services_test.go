package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
	"sailplane.dev/tools/testenv"
)

// consulSailplane is Sailplane with Consul discovery: its xDS address, and the bus carrying
// the registry with how a test consumes it.
type consulSailplane struct {
	xds, registryBus string
	busSec           bus.Security // zero: plaintext (hyper's bus, on loopback)
}

// consulTopologies start Sailplane with Consul discovery on an empty folder of Istio config.
var consulTopologies = []struct {
	name  string
	start func(t *testing.T, dir, consulAddr string) consulSailplane
}{
	{"hyper", func(t *testing.T, dir, consulAddr string) consulSailplane {
		xds, busAddr := framework.FreeAddr(t), framework.FreeAddr(t)
		hyper := framework.Start(t, dir, framework.Binary(t, "hyper"), "--config-source", "files",
			"--consul", consulAddr, "--xds-listen", xds, "--bus-listen", busAddr, "--xds-tls-listen", framework.FreeAddr(t))
		framework.WaitReady(t, hyper)
		return consulSailplane{xds: xds, registryBus: busAddr}
	}},
	// As the other microservices topologies: every bus over mTLS with the certificates the ca
	// signs, each service starting from the bootstrap folder the ca keeps for it.
	{"microservices", func(t *testing.T, dir, consulAddr string) consulSailplane {
		configBus, registryBus, caBus, xds, caAddr := framework.FreeAddr(t), framework.FreeAddr(t), framework.FreeAddr(t), framework.FreeAddr(t), framework.FreeAddr(t)
		ca := framework.Start(t, dir, framework.Binary(t, "ca"), "--kubernetes=false", "--ca-listen", caAddr,
			"--service-cert-dir", "var/service-certs", "--bus-listen", caBus)
		identity := waitServiceCerts(t, dir, caAddr)
		// --config-source files / --kubernetes off: never pick up a kubeconfig the machine has.
		services := []*framework.Process{
			ca,
			framework.Start(t, dir, framework.Binary(t, "config-ingest"), append(identity("config-ingest"), "--config-source", "files",
				"--mesh-config", "etc/sailplane/mesh.yaml", "--bus-listen", configBus)...),
			framework.Start(t, dir, framework.Binary(t, "endpoint-watcher"), append(identity("endpoint-watcher"), "--kubernetes", "off",
				"--consul", consulAddr, "--config-bus", configBus, "--bus-listen", registryBus)...),
			framework.Start(t, dir, framework.Binary(t, "xds-server"), append(identity("xds-server"),
				"--config-bus", configBus, "--registry-bus", registryBus, "--ca-bus", caBus, "--xds-listen", xds)...),
		}
		for _, p := range services {
			framework.WaitReady(t, p) // each service's monitoring port: ready once synced
		}
		// The test reads the registry bus as xds-server does, with its bootstrap certificate.
		return consulSailplane{xds: xds, registryBus: registryBus, busSec: bus.Security{
			Identity: framework.IdentityFromDir(t, filepath.Join(dir, "var/service-certs/xds-server")),
			Peers:    bus.SailplanePeers("cluster.local", "istio-system")}}
	}},
}

// TestConsulService registers a service with the real `consul services register`, pointing at
// an echo server in a test host, and expects a real gRPC xDS client to reach it through
// Sailplane; `consul services deregister` then takes it away.
func TestConsulService(t *testing.T) {
	for _, topo := range consulTopologies {
		t.Run(topo.name, func(t *testing.T) { testConsulService(t, topo.start) })
	}
}

func testConsulService(t *testing.T, start func(t *testing.T, dir, consulAddr string) consulSailplane) {
	c := testenv.ConsulForTest(t)
	consul := consulCLI(t, c.Addr())

	host := framework.NewTestHost(t, "consul-echo")
	framework.StartEchoOn(t, "consul-echo", host.Listen(t, echoPort))

	dir := t.TempDir()
	framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", meshYAML)
	framework.WriteFile(t, dir, "etc/sailplane/conf/empty.yaml", "# no Istio config: the services come from Consul\n")
	sp := start(t, dir, c.Addr())
	registry := framework.RecordSecureBus(t, sp.registryBus, sp.busSec, schema.Service.TypeURL, schema.Endpoints.TypeURL)

	const name, id = "echo-consul", "echo-consul-1"
	hostname := name + ".service.consul"
	consul("services", "register", consulServiceFile(t, id, name, host.IP(), echoPort))

	client := framework.XDSClient(t, sp.xds, fmt.Sprintf("xds:///%s:%d", hostname, echoPort))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t.Run("registered service is reachable", func(t *testing.T) {
		framework.Eventually(t, time.Minute, func() error {
			counts, err := reached(ctx, client, 10)
			if err != nil {
				return fmt.Errorf("%w (registry services: %v)", err, registry.Names(schema.Service.TypeURL))
			}
			return onlyFrom(counts, "consul-echo")
		})
		framework.Eventually(t, 30*time.Second, func() error {
			if names := registry.Names(schema.Service.TypeURL); !hasSuffix(names, "/"+hostname) {
				return fmt.Errorf("no Service */%s on the registry bus: %v", hostname, names)
			}
			return nil
		})
	})

	t.Run("deregistered service is removed", func(t *testing.T) {
		consul("services", "deregister", "-id", id)
		framework.Eventually(t, time.Minute, func() error {
			if names := registry.Names(schema.Service.TypeURL); hasSuffix(names, "/"+hostname) {
				return fmt.Errorf("Service */%s still on the registry bus: %v", hostname, names)
			}
			return nil
		})
		framework.Eventually(t, time.Minute, func() error {
			rpcCtx, rpcCancel := context.WithTimeout(ctx, 2*time.Second)
			defer rpcCancel()
			if got, err := framework.Call(rpcCtx, client); err == nil {
				return fmt.Errorf("RPC still reaches %s after deregistration", got)
			}
			return nil
		})
	})
}

// consulServiceFile writes the definition of a gRPC service instance for `consul services
// register` and returns its path.
func consulServiceFile(t *testing.T, id, name, addr string, port int) string {
	t.Helper()
	dir := t.TempDir()
	framework.WriteFile(t, dir, id+".json", fmt.Sprintf(`{
  "service": {
    "id": %q,
    "name": %q,
    "address": %q,
    "port": %d,
    "meta": {"protocol": "grpc"}
  }
}
`, id, name, addr, port))
	return filepath.Join(dir, id+".json")
}

// consulCLI returns a runner of the real consul binary against the agent at addr.
func consulCLI(t *testing.T, addr string) func(args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	bin, err := testenv.EnsureConsul(ctx, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("consul binary: %v", err)
	}
	return func(args ...string) {
		t.Helper()
		// The subcommand's flags go after its name: `consul services register -http-addr=... file`.
		n := 2
		if len(args) < n {
			n = len(args)
		}
		full := append(append(append([]string{}, args[:n]...), "-http-addr=http://"+addr), args[n:]...)
		out, err := exec.Command(bin, full...).CombinedOutput()
		if err != nil {
			t.Fatalf("consul %s: %v\n%s", strings.Join(full, " "), err, out)
		}
		t.Logf("consul %s: %s", strings.Join(full, " "), strings.TrimSpace(string(out)))
	}
}

func hasSuffix(names []string, suffix string) bool {
	for _, n := range names {
		if strings.HasSuffix(n, suffix) {
			return true
		}
	}
	return false
}
