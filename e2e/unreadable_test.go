package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/shared/schema"
)

// nobody is the user config-ingest runs as in TestUnreadableSubfolder: as root, it would read
// through chmod 000.
const nobody = 65534

func simpleVS(name string) string {
	return fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: %s, namespace: demo}
spec:
  hosts: [%s.demo.svc.cluster.local]
  http:
  - route: [{destination: {host: %s.demo.svc.cluster.local}}]
`, name, name, name)
}

// TestUnreadableSubfolder runs config-ingest as an ordinary user and makes one of its config
// subfolders unreadable: what the subfolder held stays on the bus, the log names it, and
// config-ingest reads it again once it can.
func TestUnreadableSubfolder(t *testing.T) {
	var user *syscall.Credential
	if os.Geteuid() == 0 {
		user = &syscall.Credential{Uid: nobody, Gid: nobody}
	}
	dir, err := os.MkdirTemp("", "e2e-unreadable-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", "")
	framework.WriteFile(t, dir, "etc/sailplane/conf/top.yaml", simpleVS("top"))
	framework.WriteFile(t, dir, "etc/sailplane/conf/team/team.yaml", simpleVS("team"))
	if user != nil {
		// The user owns its working folder, as a deployment would arrange.
		err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(p, nobody, nobody)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	team := filepath.Join(dir, "etc/sailplane/conf/team")
	busAddr := framework.FreeAddr(t)
	ingest := framework.StartAs(t, user, dir, framework.Binary(t, "config-ingest"),
		"--config-source", "files", "--mesh-config", "etc/sailplane/mesh.yaml", "--bus-listen", busAddr)
	bus := framework.RecordBus(t, busAddr, schema.VirtualService.TypeURL)
	vs := schema.VirtualService.TypeURL
	framework.Eventually(t, 30*time.Second, func() error { return bus.HasAll(vs, "demo/top", "demo/team") })

	if err := os.Chmod(team, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(team, 0o755) })
	framework.Eventually(t, 30*time.Second, func() error {
		for _, line := range strings.Split(ingest.Log(), "\n") {
			if strings.Contains(line, "cannot read config folder") && strings.Contains(line, "conf/team") {
				return nil
			}
		}
		return fmt.Errorf("the unreadable subfolder is not reported in the log")
	})
	// A later change arrives after anything the unreadable scan published.
	framework.WriteFile(t, dir, "etc/sailplane/conf/later.yaml", simpleVS("later"))
	framework.Eventually(t, 30*time.Second, func() error { return bus.HasAll(vs, "demo/later") })
	if err := bus.HasAll(vs, "demo/top", "demo/team"); err != nil {
		t.Fatalf("an unreadable subfolder lost its resources: %v", err)
	}

	if err := os.Chmod(team, 0o755); err != nil {
		t.Fatal(err)
	}
	framework.WriteFile(t, dir, "etc/sailplane/conf/team/team.yaml", simpleVS("team2"))
	framework.Eventually(t, 30*time.Second, func() error {
		if err := bus.HasAll(vs, "demo/team2"); err != nil {
			return err
		}
		if _, ok := bus.Get(vs, "demo/team"); ok {
			return fmt.Errorf("demo/team still published after its file changed")
		}
		return nil
	})
}
