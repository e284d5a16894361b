package main

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestLeanDependencies: sailplanectl reads Gateway API objects (gatewayapi.Decode, Translate) but
// must not link the CRD validators, which bring the API server's CEL and OpenAPI machinery.
func TestLeanDependencies(t *testing.T) {
	out, err := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, banned := range []string{"sailplane.dev/shared/gatewayapi/validation", "k8s.io/apiextensions-apiserver/", "k8s.io/apiserver/", "github.com/google/cel-go/"} {
			if pkg == banned || strings.HasPrefix(pkg, banned) {
				t.Errorf("sailplanectl links %s", pkg)
			}
		}
	}
}
