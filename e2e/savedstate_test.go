package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/shared/schema"
)

// startHyperFiles starts hyper in dir reading files, with free ports, and the extra args.
func startHyperFiles(t *testing.T, dir string, args ...string) (*framework.Process, string) {
	t.Helper()
	busAddr := framework.FreeAddr(t)
	hyper := framework.Start(t, dir, framework.Binary(t, "hyper"), append([]string{"--config-source", "files",
		"--xds-listen", framework.FreeAddr(t), "--xds-tls-listen", framework.FreeAddr(t), "--bus-listen", busAddr}, args...)...)
	return hyper, busAddr
}

// TestTwoConfigurationsInOneFolder: hyper run in a folder with one configuration, then in the
// same folder with --mesh-config naming another mesh file whose only config source cannot be
// read. The second serves none of the first's VirtualServices and DestinationRules: the state
// saved in the shared var/lib/sailplane belongs to the first's config source.
func TestTwoConfigurationsInOneFolder(t *testing.T) {
	dir := t.TempDir()
	framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", meshYAML)
	framework.WriteFile(t, dir, "etc/sailplane/conf/traffic.yaml", trafficYAML(80, 20))
	vs, dr := schema.VirtualService.TypeURL, schema.DestinationRule.TypeURL

	first, busAddr := startHyperFiles(t, dir)
	bus := framework.RecordBus(t, busAddr, vs, dr)
	framework.Eventually(t, 30*time.Second, func() error {
		if err := bus.HasAll(vs, "demo/echo"); err != nil {
			return err
		}
		return bus.HasAll(dr, "demo/echo")
	})
	first.Stop()
	if _, err := os.Stat(filepath.Join(dir, "var/lib/sailplane/config-ingest-files.json")); err != nil {
		t.Fatalf("the first configuration saved no state: %v", err)
	}

	framework.WriteFile(t, dir, "etc/sailplane/other.yaml", "configSources: [{address: fs://not-there-yet}]\n")
	second, busAddr := startHyperFiles(t, dir, "--mesh-config", "etc/sailplane/other.yaml")
	framework.WaitReady(t, second)
	bus = framework.RecordBus(t, busAddr, vs, dr, schema.MeshConfig.TypeURL)
	// The mesh config arrives with the same first full state as the config kinds.
	framework.Eventually(t, 30*time.Second, func() error { return bus.HasAll(schema.MeshConfig.TypeURL, "mesh") })
	if got := append(bus.Names(vs), bus.Names(dr)...); len(got) != 0 {
		t.Fatalf("the second configuration serves the first's VirtualService and DestinationRule: %v", got)
	}
	if log := second.Log(); !strings.Contains(log, "not-there-yet") || !strings.Contains(log, "no longer configured") {
		t.Fatalf("the log does not report the unreadable source and the state ignored:\n%s", log)
	}
}

// TestDefaultPathsFollowMeshConfig: hyper run from an empty folder with --mesh-config naming
// <root>/etc/sailplane/mesh.yaml keeps its CA root in <root>/etc/certs and its state in
// <root>/var/lib/sailplane, and writes nothing into the working folder; explicit flags win.
func TestDefaultPathsFollowMeshConfig(t *testing.T) {
	root, work := t.TempDir(), t.TempDir()
	framework.WriteFile(t, root, "etc/sailplane/mesh.yaml", meshYAML)
	framework.WriteFile(t, root, "etc/sailplane/conf/traffic.yaml", trafficYAML(80, 20))
	hyper, _ := startHyperFiles(t, work, "--mesh-config", filepath.Join(root, "etc/sailplane/mesh.yaml"))
	framework.WaitReady(t, hyper)
	hyper.Stop()
	for _, f := range []string{"etc/certs/root-cert.pem", "var/lib/sailplane/config-ingest-files.json", "var/lib/sailplane/config-ingest-mesh.json"} {
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			t.Errorf("not beside the mesh file's etc/sailplane: %v", err)
		}
	}
	if entries, _ := os.ReadDir(work); len(entries) != 0 {
		t.Errorf("files written into the working folder: %v", names(entries))
	}

	certs, state := filepath.Join(work, "certs"), filepath.Join(work, "state")
	hyper, _ = startHyperFiles(t, work, "--mesh-config", filepath.Join(root, "etc/sailplane/mesh.yaml"),
		"--ca-cert-dir", certs, "--state-dir", state)
	framework.WaitReady(t, hyper)
	hyper.Stop()
	for _, f := range []string{filepath.Join(certs, "root-cert.pem"), filepath.Join(state, "config-ingest-files.json")} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("explicit flag not followed: %v", err)
		}
	}
}

// TestMissingMeshConfig: hyper started in a folder without etc/sailplane/mesh.yaml exits with an
// error naming the file it looked for and the flags that are the way out, having written
// nothing (no CA root, no state folder).
func TestMissingMeshConfig(t *testing.T) {
	dir := t.TempDir()
	hyper, _ := startHyperFiles(t, dir)
	var err error
	framework.Eventually(t, 30*time.Second, func() error {
		var exited bool
		if exited, err = hyper.Exited(); !exited {
			return fmt.Errorf("hyper still running without a mesh file")
		}
		return nil
	})
	if err == nil {
		t.Fatal("hyper exited with status 0 without a mesh file")
	}
	log := hyper.Log()
	for _, want := range []string{filepath.Join(dir, "etc/sailplane/mesh.yaml"), "--mesh-config", "--config-source"} {
		if !strings.Contains(log, want) {
			t.Errorf("the error does not say %q:\n%s", want, log)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("files written without a mesh file: %v", names(entries))
	}
}

func names(entries []os.DirEntry) []string {
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return slices.Sorted(slices.Values(out))
}
