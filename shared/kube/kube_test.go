package kube

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if addr := os.Getenv(libraryLogsChild); addr != "" {
		libraryLogs(addr)
		return
	}
	goleak.VerifyTestMain(m)
}

const kubeconfig = `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: secret}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`

// Discovery order: explicit path, in-cluster, $KUBECONFIG, ~/.kube/config. In-cluster config is
// absent here (no KUBERNETES_SERVICE_HOST), so the others are exercised.
func TestDiscover(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	dir := t.TempDir()
	file := filepath.Join(dir, "config")
	if err := os.WriteFile(file, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	t.Setenv("HOME", home)

	t.Setenv("KUBECONFIG", "")
	if _, err := Discover(""); !errors.Is(err, ErrNoCluster) {
		t.Fatalf("no config anywhere: got %v, want ErrNoCluster", err)
	}

	if err := os.MkdirAll(filepath.Join(home, ".kube"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, ".kube", "config"), []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	found, err := Discover("")
	if err != nil || found.Source != filepath.Join(home, ".kube", "config") || found.Config.Host != "https://127.0.0.1:6443" {
		t.Fatalf("~/.kube/config: got %+v, %v", found, err)
	}

	t.Setenv("KUBECONFIG", file)
	if found, err := Discover(""); err != nil || found.Source != file {
		t.Fatalf("$KUBECONFIG: got %+v, %v", found, err)
	}

	if _, err := Discover(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("an explicit kubeconfig that does not exist must be an error, not a fallback")
	}
}

func TestFromKubeconfig(t *testing.T) {
	cfg, err := FromKubeconfig([]byte(kubeconfig))
	if err != nil || cfg.BearerToken != "secret" {
		t.Fatalf("got %+v, %v", cfg, err)
	}
	if _, err := FromKubeconfig([]byte("not: [a kubeconfig")); err == nil {
		t.Fatal("want an error for a broken kubeconfig")
	}
}
