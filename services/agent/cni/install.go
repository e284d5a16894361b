package cni

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Installer puts the plugin on the node, as Istio's install-cni: the binary in the CNI bin
// folder, a kubeconfig (the DaemonSet's service account token, which may only get pods) and
// the plugin appended to the node's primary network configuration list — the file the
// runtime reads first — converted from a single-plugin .conf if need be. It keeps them so
// while it runs (the primary CNI may rewrite its file; the token is rotated), and leaves them
// in place when it stops, so that no injected pod starts uncaptured while it is restarted.
type Installer struct {
	Binary      string // this plugin binary, copied to BinDir
	BinDir      string // the node's CNI bin folder, as mounted (/host/opt/cni/bin)
	ConfDir     string // the node's CNI configuration folder, as mounted (/host/etc/cni/net.d)
	HostConfDir string // the same folder as the node sees it (/etc/cni/net.d), written in the config
	// The API server and the credentials the plugin uses.
	Server, TokenFile, CAFile string
	ExcludeNamespaces         []string
	Backend, LogLevel         string
	Interval                  time.Duration // how often the files are checked (default 5 s)
	ReadyAddress              string        // /readyz answers 200 once installed ("" none)
	// Repair, when set, runs once the plugin is first installed (before, a pod it deleted
	// would come back uncaptured again), until Run returns.
	Repair *Repairer
	Log    *slog.Logger
}

const (
	kubeconfigName = "sailplane-cni.kubeconfig"
	tokenName      = "sailplane-cni.token"
)

// Run installs, then keeps the installation until ctx ends.
func (in *Installer) Run(ctx context.Context) error {
	var ready atomic.Bool
	if in.ReadyAddress != "" {
		lis, err := net.Listen("tcp", in.ReadyAddress)
		if err != nil {
			return fmt.Errorf("readiness: %w", err)
		}
		srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			if !ready.Load() {
				http.Error(w, "not installed yet", http.StatusServiceUnavailable)
				return
			}
			_, _ = io.WriteString(w, "ok\n")
		})}
		go func() { _ = srv.Serve(lis) }()
		defer srv.Close()
	}
	interval := in.Interval
	if interval == 0 {
		interval = 5 * time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	ctx, cancel := context.WithCancel(ctx)
	var repairs sync.WaitGroup
	defer repairs.Wait()
	defer cancel()
	repairing := false
	for {
		changed, err := in.Once()
		switch {
		case err != nil:
			ready.Store(false)
			in.Log.Error("CNI plugin not installed", "error", err)
		case changed:
			ready.Store(true)
			in.Log.Info("CNI plugin installed", "bin", filepath.Join(in.BinDir, PluginType), "conf_dir", in.ConfDir)
		default:
			ready.Store(true)
		}
		if in.Repair != nil && ready.Load() && !repairing {
			repairing = true
			repairs.Go(func() { _ = in.Repair.Run(ctx) })
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Once brings the node's files to what they should be; changed says whether it wrote any.
func (in *Installer) Once() (changed bool, err error) {
	bin, err := os.ReadFile(in.Binary)
	if err != nil {
		return false, fmt.Errorf("the plugin binary: %w", err)
	}
	c, err := writeIfChanged(filepath.Join(in.BinDir, PluginType), bin, 0o755)
	if err != nil {
		return false, err
	}
	changed = c
	token, err := os.ReadFile(in.TokenFile)
	if err != nil {
		return changed, fmt.Errorf("the service account token: %w", err)
	}
	if c, err = writeIfChanged(filepath.Join(in.ConfDir, tokenName), token, 0o600); err != nil {
		return changed, err
	}
	changed = changed || c
	ca, err := os.ReadFile(in.CAFile)
	if err != nil {
		return changed, fmt.Errorf("the API server's CA: %w", err)
	}
	kc, err := Kubeconfig(in.Server, filepath.Join(in.HostConfDir, tokenName), ca)
	if err != nil {
		return changed, err
	}
	if c, err = writeIfChanged(filepath.Join(in.ConfDir, kubeconfigName), kc, 0o600); err != nil {
		return changed, err
	}
	changed = changed || c
	c, err = in.chain()
	return changed || c, err
}

// Kubeconfig is the plugin's kubeconfig: server, CA, and the token read from tokenFile at each
// use.
func Kubeconfig(server, tokenFile string, caPEM []byte) ([]byte, error) {
	kc := map[string]any{
		"apiVersion": "v1", "kind": "Config", "current-context": PluginType,
		"clusters": []any{map[string]any{"name": PluginType, "cluster": map[string]any{
			"server": server, "certificate-authority-data": base64.StdEncoding.EncodeToString(caPEM),
		}}},
		"users":    []any{map[string]any{"name": PluginType, "user": map[string]any{"tokenFile": tokenFile}}},
		"contexts": []any{map[string]any{"name": PluginType, "context": map[string]any{"cluster": PluginType, "user": PluginType}}},
	}
	return json.MarshalIndent(kc, "", "  ")
}

// pluginEntry is the plugin's entry in the list.
func (in *Installer) pluginEntry() map[string]any {
	e := map[string]any{"type": PluginType, "kubeconfig": filepath.Join(in.HostConfDir, kubeconfigName)}
	if len(in.ExcludeNamespaces) > 0 {
		e["exclude_namespaces"] = in.ExcludeNamespaces
	}
	if in.Backend != "" {
		e["backend"] = in.Backend
	}
	if in.LogLevel != "" {
		e["log_level"] = in.LogLevel
	}
	return e
}

// primaryConf is the network configuration the runtime uses: the first .conflist, .conf or
// .json file of the folder in name order (as libcni picks it).
func primaryConf(dir string) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("the CNI configuration folder: %w", err)
	}
	for _, e := range entries { // ReadDir sorts by name
		switch filepath.Ext(e.Name()) {
		case ".conflist", ".conf", ".json":
			if !e.IsDir() {
				return filepath.Join(dir, e.Name()), nil
			}
		}
	}
	return "", fmt.Errorf("the CNI configuration folder %s has no network configuration yet (the cluster's CNI writes it)", dir)
}

// chain appends the plugin to the primary configuration, or updates its entry there.
func (in *Installer) chain() (bool, error) {
	path, err := primaryConf(in.ConfDir)
	if err != nil {
		return false, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return false, err
	}
	var conf map[string]any
	if err := json.Unmarshal(data, &conf); err != nil {
		return false, fmt.Errorf("%s: %w", path, err)
	}
	plugins, isList := conf["plugins"].([]any)
	if !isList {
		// A single plugin (.conf): the list holds it first.
		single := conf
		conf = map[string]any{"cniVersion": single["cniVersion"], "name": single["name"]}
		delete(single, "cniVersion")
		delete(single, "name")
		plugins = []any{single}
	}
	entry := in.pluginEntry()
	i := slices.IndexFunc(plugins, func(p any) bool { m, _ := p.(map[string]any); return m["type"] == PluginType })
	if i >= 0 {
		plugins[i] = entry
	} else {
		plugins = append(plugins, entry)
	}
	conf["plugins"] = plugins
	out, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return false, err
	}
	target := path
	if !isList {
		// Written as a list beside it; the .conf goes, so the runtime reads the list.
		target = strings.TrimSuffix(path, filepath.Ext(path)) + ".conflist"
	}
	changed, err := writeIfChanged(target, append(out, '\n'), 0o644)
	if err != nil {
		return false, err
	}
	if !isList {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return changed, err
		}
	}
	return changed, nil
}

// writeIfChanged writes data at path (through a temporary file and a rename, so a reader never
// sees half of it) unless the file already holds it.
func writeIfChanged(path string, data []byte, mode os.FileMode) (bool, error) {
	if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, data) {
		return false, nil
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return false, err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return false, err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return false, err
	}
	if err := tmp.Close(); err != nil {
		return false, err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return false, err
	}
	return true, nil
}
