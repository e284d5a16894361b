// Command sailplane-cni is Sailplane's chained CNI plugin (see sailplane.dev/services/agent/cni).
// The container runtime runs it with CNI_COMMAND set, from the node's CNI bin folder; the
// DaemonSet of deploy/cni runs `sailplane-cni install`, which puts it there. It is its own
// small binary rather than an agent subcommand: it is copied to every node and started for
// every pod, so it links only the capture code and a minimal API client.
package main

import (
	ctxpkg "context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"sailplane.dev/services/agent/cni"
	sversion "sailplane.dev/shared/version"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "install" {
		os.Exit(install(os.Args[2:]))
	}
	p := &cni.Plugin{Stdout: os.Stdout, Stderr: os.Stderr}
	skel.PluginMainFuncs(p.Funcs(), version.All, "Sailplane's CNI plugin "+sversion.Version+": the traffic capture of injected pods")
}

func install(args []string) int {
	fs := flag.NewFlagSet("install", flag.ContinueOnError)
	exe, _ := os.Executable()
	in := &cni.Installer{}
	var (
		exclude, level, node string
		repair               bool
		repairQPS            float64
	)
	fs.StringVar(&in.Binary, "binary", exe, "the plugin binary to copy")
	fs.StringVar(&in.BinDir, "cni-bin-dir", "/host/opt/cni/bin", "the node's CNI bin folder, as mounted")
	fs.StringVar(&in.ConfDir, "cni-conf-dir", "/host/etc/cni/net.d", "the node's CNI configuration folder, as mounted")
	fs.StringVar(&in.HostConfDir, "host-cni-conf-dir", "/etc/cni/net.d", "the same folder as the node sees it")
	fs.StringVar(&in.TokenFile, "token-file", "/var/run/secrets/kubernetes.io/serviceaccount/token", "the service account token the plugin uses (it may get pods)")
	fs.StringVar(&in.CAFile, "ca-file", "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt", "the API server's CA")
	fs.StringVar(&in.Server, "server", "", "the API server's URL (default: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)")
	fs.StringVar(&exclude, "exclude-namespaces", "kube-system", "comma-separated namespaces whose pods are never captured")
	fs.StringVar(&in.Backend, "backend", "auto", "the plugin's capture backend: nftables, iptables, or auto (nftables when the node has nft)")
	fs.StringVar(&in.LogLevel, "plugin-log-level", "info", "the plugin's log level (its stderr goes to the runtime's log)")
	fs.StringVar(&in.ReadyAddress, "ready-address", ":8000", "where /readyz answers once the plugin is installed")
	fs.StringVar(&level, "log-level", "info", "the installer's log level")
	fs.BoolVar(&repair, "repair", true, "delete this node's pods whose istio-validation init container failed (they started before the plugin was in place), so that their controller creates them again")
	fs.StringVar(&node, "node-name", os.Getenv("NODE_NAME"), "this node's name, whose pods the repair loop watches (default $NODE_NAME)")
	fs.Float64Var(&repairQPS, "repair-qps", 1, "at most this many pod deletions a second by the repair loop (burst 5)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		fmt.Fprintf(os.Stderr, "flag --log-level: %v\n", err)
		return 2
	}
	in.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})).With("component", "cni-install")
	if in.Server == "" {
		host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
		if host == "" || port == "" {
			fmt.Fprintln(os.Stderr, "flag --server is empty and KUBERNETES_SERVICE_HOST/PORT are not set")
			return 2
		}
		if strings.Contains(host, ":") {
			host = "[" + host + "]"
		}
		in.Server = "https://" + host + ":" + port
	}
	for _, ns := range strings.Split(exclude, ",") {
		if ns = strings.TrimSpace(ns); ns != "" {
			in.ExcludeNamespaces = append(in.ExcludeNamespaces, ns)
		}
	}
	if repair {
		r, err := cni.NewRepairer(in.Server, in.TokenFile, in.CAFile, node, in.Log.With("component", "cni-repair"))
		if err != nil {
			fmt.Fprintf(os.Stderr, "flag --repair: %v\n", err)
			return 2
		}
		r.QPS = repairQPS
		in.Repair = r
	}
	ctx, stop := signal.NotifyContext(ctxpkg.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := in.Run(ctx); err != nil {
		in.Log.Error("install", "error", err)
		return 1
	}
	return 0
}
