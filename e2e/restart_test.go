package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sailplane.dev/e2e/framework"
)

// TestRestartAfterInvalidEdit: traffic split 80/20 by a VirtualService whose file then becomes
// invalid. The running control plane keeps the last valid version; after a restart it must
// still serve it (from its state folder, by default var/lib/sailplane beside the mesh file's
// etc/sailplane), not drop the VirtualService and split 50/50.
func TestRestartAfterInvalidEdit(t *testing.T) {
	for _, tc := range []struct {
		name string
		// start starts the control plane and returns its xDS address, the process reading the
		// files, and restart, which stops that process and starts it again, returning the xDS
		// address to use from then on.
		start func(t *testing.T, dir string) (xds string, ingest *framework.Process, restart func() string)
	}{
		{"hyper", func(t *testing.T, dir string) (string, *framework.Process, func() string) {
			start := func() (string, *framework.Process) {
				xds := framework.FreeAddr(t)
				return xds, framework.Start(t, dir, framework.Binary(t, "hyper"), "--xds-listen", xds, "--bus-listen", framework.FreeAddr(t),
					"--xds-tls-listen", framework.FreeAddr(t))
			}
			xds, hyper := start()
			return xds, hyper, func() string {
				hyper.Stop()
				xds, hyper = start()
				return xds
			}
		}},
		{"microservices", func(t *testing.T, dir string) (string, *framework.Process, func() string) {
			configBus, registryBus := framework.FreeAddr(t), framework.FreeAddr(t)
			startIngest := func() *framework.Process {
				return framework.Start(t, dir, framework.Binary(t, "config-ingest"),
					"--mesh-config", filepath.Join(dir, "etc/sailplane/mesh.yaml"), "--bus-listen", configBus)
			}
			startXDS := func() (string, *framework.Process) {
				xds := framework.FreeAddr(t)
				return xds, framework.Start(t, dir, framework.Binary(t, "xds-server"),
					"--config-bus", configBus, "--registry-bus", registryBus, "--xds-listen", xds)
			}
			ingest := startIngest()
			framework.Start(t, dir, framework.Binary(t, "endpoint-watcher"), "--config-bus", configBus, "--bus-listen", registryBus)
			xds, xdsServer := startXDS()
			return xds, ingest, func() string {
				// xds-server keeps what it had while config-ingest is away: start a new one
				// after config-ingest, so that what it serves comes from the restarted one only.
				ingest.Stop()
				xdsServer.Stop()
				ingest = startIngest()
				xds, xdsServer = startXDS()
				return xds
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v1 := framework.StartEcho(t, "v1", "127.0.0.1:0")
			v2 := framework.StartEcho(t, "v2", "127.0.0.1:0")
			dir := t.TempDir()
			framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", meshYAML)
			framework.WriteFile(t, dir, "etc/sailplane/conf/service.yaml", serviceYAML(v1, v2))
			framework.WriteFile(t, dir, "etc/sailplane/conf/traffic.yaml", trafficYAML(80, 20))
			xds, ingest, restart := tc.start(t, dir)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			split8020 := func(xds, when string) {
				t.Helper()
				client := framework.XDSClient(t, xds, echoTarget)
				framework.WaitServing(ctx, t, client)
				if counts := countBackends(ctx, t, client, 1000); counts["v1"] < 750 || counts["v1"] > 850 {
					t.Fatalf("%s: want v1 80±5%% of 1000 RPCs, got %v", when, counts)
				}
			}
			split8020(xds, "before")

			// A negative weight: invalid, the last valid version stays.
			framework.WriteFile(t, dir, "etc/sailplane/conf/traffic.yaml", trafficYAML(-180, 20))
			framework.Eventually(t, 30*time.Second, func() error {
				for _, line := range strings.Split(ingest.Log(), "\n") {
					if strings.Contains(line, "traffic.yaml") && strings.Contains(line, "weight") && strings.Contains(line, "level=WARN") {
						return nil
					}
				}
				return fmt.Errorf("the invalid file is not reported in the log")
			})
			xds = restart()
			split8020(xds, "after the restart")
		})
	}
}
