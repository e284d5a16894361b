package configingest

import (
	"errors"
	"fmt"

	"k8s.io/client-go/rest"

	"sailplane.dev/shared/kube"
)

// Config source modes, the values of the mains' --config-source flag.
const (
	// SourceAuto uses Kubernetes when a cluster is found (in-cluster, an explicit kubeconfig,
	// $KUBECONFIG, ~/.kube/config), else files.
	SourceAuto       = "auto"
	SourceKubernetes = "kubernetes"
	SourceFiles      = "files"
)

// ErrSourceMode is returned by ResolveSource for an unknown mode.
var ErrSourceMode = errors.New("config source must be auto, kubernetes or files")

// ResolveSource decides where config comes from, for the mains: mode is SourceAuto,
// SourceKubernetes or SourceFiles, kubeconfig an explicit kubeconfig path (may be empty). It
// returns the cluster's rest config (nil for files) and a description of the choice to log. In
// auto mode only "no cluster found" falls back to files: an explicit or discovered kubeconfig
// that cannot be loaded is an error, not a silent switch of source.
func ResolveSource(mode, kubeconfig string) (*rest.Config, string, error) {
	switch mode {
	case SourceFiles:
		return nil, "files (--config-source=files)", nil
	case SourceKubernetes, SourceAuto, "":
	default:
		return nil, "", fmt.Errorf("%w, not %q", ErrSourceMode, mode)
	}
	found, err := kube.Discover(kubeconfig)
	switch {
	case err == nil:
		return found.Config, "kubernetes (" + found.Source + ")", nil
	case errors.Is(err, kube.ErrNoCluster) && mode != SourceKubernetes:
		return nil, "files (no Kubernetes cluster found)", nil
	default:
		return nil, "", fmt.Errorf("config source %s: %w", mode, err)
	}
}
