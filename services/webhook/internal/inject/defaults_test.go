package inject

import (
	"path/filepath"
	"testing"

	"sailplane.dev/shared/golden"
)

// TestShippedDefaults keeps the injection files shipped for Kubernetes (deploy/base/injection/,
// the istio-sidecar-injector ConfigMap) and for files mode (examples/etc/sailplane/injection/)
// equal to the built-in ones, their single source: UPDATE_GOLDEN=1 rewrites them.
func TestShippedDefaults(t *testing.T) {
	root := filepath.Join("..", "..", "..", "..")
	for _, dir := range []string{
		filepath.Join(root, "deploy", "base", "injection"),
		filepath.Join(root, "examples", "etc", "sailplane", "injection"),
	} {
		golden.Compare(t, filepath.Join(dir, "config"), DefaultConfig)
		golden.Compare(t, filepath.Join(dir, "values"), DefaultValues)
	}
}
