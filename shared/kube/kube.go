// Package kube finds the Kubernetes cluster a service should use and builds its clients.
package kube

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	istioclient "istio.io/client-go/pkg/clientset/versioned"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// ErrNoCluster means no in-cluster config, $KUBECONFIG or ~/.kube/config was found.
var ErrNoCluster = errors.New("no Kubernetes cluster found (no in-cluster config, $KUBECONFIG or ~/.kube/config)")

// Found says where a cluster's config came from.
type Found struct {
	Config *rest.Config
	// Source is "in-cluster" or the kubeconfig file's path.
	Source string
}

// Discover finds the cluster as istiod does: an explicit kubeconfig path if given, else the
// in-cluster service account, else $KUBECONFIG, else ~/.kube/config. It returns ErrNoCluster
// when there is none, so a caller can fall back to files.
func Discover(kubeconfig string) (Found, error) {
	if kubeconfig != "" {
		return load(&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig}, kubeconfig)
	}
	if cfg, err := rest.InClusterConfig(); err == nil {
		return Found{Config: cfg, Source: "in-cluster"}, nil
	}
	if env := os.Getenv("KUBECONFIG"); env != "" {
		// Like kubectl, $KUBECONFIG may list several files to merge.
		return load(&clientcmd.ClientConfigLoadingRules{Precedence: filepath.SplitList(env)}, env)
	}
	if home, err := os.UserHomeDir(); err == nil {
		p := filepath.Join(home, ".kube", "config")
		if _, err := os.Stat(p); err == nil {
			return load(&clientcmd.ClientConfigLoadingRules{ExplicitPath: p}, p)
		}
	}
	return Found{}, ErrNoCluster
}

func load(rules *clientcmd.ClientConfigLoadingRules, path string) (Found, error) {
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	if err != nil {
		return Found{}, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return Found{Config: cfg, Source: path}, nil
}

// FromKubeconfig builds a rest config from a kubeconfig's bytes, as remote-cluster Secrets carry.
func FromKubeconfig(data []byte) (*rest.Config, error) {
	cfg, err := clientcmd.RESTConfigFromKubeConfig(data)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return cfg, nil
}

// WithRateLimits returns a copy of cfg whose client-side rate limit, unless cfg sets one, is
// raised from client-go's default (5 QPS, burst 10) to what a control plane needs: a cluster's
// watches, or the ca's TokenReviews when many workloads start at once.
func WithRateLimits(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 100, 200
	}
	return cfg
}

// Clients are the typed clients Sailplane's services use.
type Clients struct {
	Kube  kubernetes.Interface
	Istio istioclient.Interface
}

// NewClients builds the clients for one cluster, with client-side rate limits raised
// (WithRateLimits).
func NewClients(cfg *rest.Config) (Clients, error) {
	cfg = WithRateLimits(cfg)
	k, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return Clients{}, fmt.Errorf("kubernetes client: %w", err)
	}
	i, err := istioclient.NewForConfig(cfg)
	if err != nil {
		return Clients{}, fmt.Errorf("istio client: %w", err)
	}
	return Clients{Kube: k, Istio: i}, nil
}
