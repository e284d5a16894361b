package kube

import (
	"flag"
	"log/slog"

	"k8s.io/klog/v2"

	"sailplane.dev/shared/cli"
)

// client-go (reflectors, leader election, the rest of k8s.io) logs through klog: every binary
// that builds its clients here sends those lines to the process logger, in its format, as
// component "klog".
func init() { cli.RouteLibraryLogs("klog", routeKlog) }

func routeKlog(log *slog.Logger) {
	klog.SetSlogLogger(log)
	// klog drops its verbose lines (V(1), V(2), …) before they reach a logger unless its own
	// -v lets them through: let up to V(4) through (a V(n) line is slog level -n, so V(4) is
	// Debug), and the component's level decide.
	var fs flag.FlagSet
	klog.InitFlags(&fs)
	_ = fs.Set("v", "4")
}
