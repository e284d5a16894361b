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
	"sailplane.dev/shared/schema"
	"sailplane.dev/tools/testenv"
)

// consulAddressFlag is endpoint-watcher's flag naming Consul's HTTP address.
const consulAddressFlag = "consul"

const waitsForConsulSource = "the Consul source of endpoint-watcher (--" + consulAddressFlag + "), issue 3"

// TestConsulService registers a service with the real `consul services register`, pointing at
// an echo server in a test host, and expects a real gRPC xDS client to reach it through
// endpoint-watcher and xds-server; `consul services deregister` then takes it away.
func TestConsulService(t *testing.T) {
	watcherBin := framework.Binary(t, "endpoint-watcher")
	framework.RequireFlags(t, watcherBin, waitsForConsulSource, consulAddressFlag)
	c := testenv.ConsulForTest(t)
	consul := consulCLI(t, c.Addr())

	host := framework.NewTestHost(t, "consul-echo")
	framework.StartEchoOn(t, "consul-echo", host.Listen(t, echoPort))

	// Microservices: endpoint-watcher is where the Consul source lives; config-ingest serves an
	// empty folder of Istio config.
	dir := t.TempDir()
	framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", meshYAML)
	framework.WriteFile(t, dir, "etc/sailplane/conf/empty.yaml", "# no Istio config: the services come from Consul\n")
	configBus, registryBus, xds := framework.FreeAddr(t), framework.FreeAddr(t), framework.FreeAddr(t)
	ingestBin := framework.Binary(t, "config-ingest")
	ingestArgs := []string{"--mesh-config", filepath.Join(dir, "etc/sailplane/mesh.yaml"), "--bus-listen", configBus}
	if len(framework.MissingFlags(ingestBin, "config-source")) == 0 {
		// Never pick up a kubeconfig the machine happens to have.
		ingestArgs = append(ingestArgs, "--config-source", "files")
	}
	framework.Start(t, dir, ingestBin, ingestArgs...)
	watcherArgs := []string{"--config-bus", configBus, "--bus-listen", registryBus,
		"--" + consulAddressFlag, c.Addr(), "--log-level", "debug"}
	if len(framework.MissingFlags(watcherBin, "kubernetes")) == 0 {
		watcherArgs = append(watcherArgs, "--kubernetes", "off")
	}
	framework.Start(t, dir, watcherBin, watcherArgs...)
	framework.Start(t, dir, framework.Binary(t, "xds-server"),
		"--config-bus", configBus, "--registry-bus", registryBus, "--xds-listen", xds)
	registry := framework.RecordBus(t, registryBus, schema.Service.TypeURL, schema.Endpoints.TypeURL)

	const name, id = "echo-consul", "echo-consul-1"
	hostname := name + ".service.consul"
	def := filepath.Join(t.TempDir(), "echo-consul.json")
	framework.WriteFile(t, filepath.Dir(def), filepath.Base(def), fmt.Sprintf(`{
  "service": {
    "id": %q,
    "name": %q,
    "address": %q,
    "port": %d,
    "meta": {"protocol": "grpc"}
  }
}
`, id, name, host.IP(), echoPort))
	consul("services", "register", def)

	client := framework.XDSClient(t, xds, fmt.Sprintf("xds:///%s:%d", hostname, echoPort))
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
				return fmt.Errorf("no Service */%s on endpoint-watcher's bus: %v", hostname, names)
			}
			return nil
		})
	})

	t.Run("deregistered service is removed", func(t *testing.T) {
		consul("services", "deregister", "-id", id)
		framework.Eventually(t, time.Minute, func() error {
			if names := registry.Names(schema.Service.TypeURL); hasSuffix(names, "/"+hostname) {
				return fmt.Errorf("Service */%s still on endpoint-watcher's bus: %v", hostname, names)
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
