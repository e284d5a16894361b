// Package testenv builds, caches and starts real etcd, kube-apiserver and
// consul processes on 127.0.0.1 for tests and for people, and builds kubectl
// and Istio's pilot-agent and istioctl as clients.
//
// The binaries are compiled from their Go modules (the only thing that can
// be fetched here is Go modules) in throwaway modules outside the repo, and
// cached under ${SAILPLANE_CACHE:-$HOME/.cache/sailplane}/bin with the
// version in the file name, so a build happens once per machine. A cold
// build takes several minutes; run `go run ./tools/cmd/testenv build` first
// (or give go test a -timeout well above its 10 minute default).
//
// In a test:
//
//	k := testenv.KubeForTest(t)       // etcd + kube-apiserver + Istio CRDs
//	cfg := k.RestConfig()             // or k.KubeconfigPath()
//	c := testenv.ConsulForTest(t)     // consul agent -dev; c.Addr() is its HTTP API
package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"text/template"
	"time"
)

// Versions of the components. The Kubernetes staging modules (client-go,
// apimachinery, ...) are released as v0.<minor>.<patch> for k8s v1.<minor>.<patch>.
const (
	EtcdVersion        = "v3.7.3"
	KubeVersion        = "v1.37.1"
	KubeStagingVersion = "v0.37.1"
	ConsulVersion      = "v1.13.9"
	// IstioAPIVersion is the istio.io/api module whose CRD file StartKube installs.
	IstioAPIVersion = "v1.31.1"
	// GatewayAPIVersion is the sigs.k8s.io/gateway-api module whose standard-channel CRDs
	// WithGatewayAPICRDs installs: the version shared/go.mod pins.
	GatewayAPIVersion = "v1.6.3"
	// IstioVersion is the istio.io/istio module pilot-agent is built from: the only master
	// pseudo-version the module proxy has (docs/ISTIO-COMPAT.md of the shared notes).
	IstioVersion = "v0.0.0-20260827124520-eed52ebb66ad"
)

// Binaries are absolute paths of cached binaries.
type Binaries struct {
	Etcd          string
	KubeAPIServer string
	Consul        string
	PilotAgent    string
	Istioctl      string
	// PilotDiscovery is istiod, the reference the differential tests compare xds-server with.
	PilotDiscovery string
	Kubectl        string
}

// BuildError is returned when compiling a component fails.
type BuildError struct {
	Component string
	Output    string // tail of the go command's output
	Err       error
}

func (e *BuildError) Error() string {
	return fmt.Sprintf("testenv: building %s: %v\n%s", e.Component, e.Err, e.Output)
}

func (e *BuildError) Unwrap() error { return e.Err }

// CacheDir is where binaries are kept: $SAILPLANE_CACHE/bin, or
// $HOME/.cache/sailplane/bin.
func CacheDir() (string, error) {
	root := os.Getenv("SAILPLANE_CACHE")
	if root == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("testenv: no SAILPLANE_CACHE and no home dir: %w", err)
		}
		root = filepath.Join(home, ".cache", "sailplane")
	}
	return filepath.Join(root, "bin"), nil
}

// EnsureBinaries returns the paths of all the binaries, building the
// missing ones.
func EnsureBinaries(ctx context.Context, log *slog.Logger) (Binaries, error) {
	var b Binaries
	var err error
	if b.Etcd, err = EnsureEtcd(ctx, log); err != nil {
		return b, err
	}
	if b.KubeAPIServer, err = EnsureKubeAPIServer(ctx, log); err != nil {
		return b, err
	}
	if b.Consul, err = EnsureConsul(ctx, log); err != nil {
		return b, err
	}
	if b.PilotAgent, err = EnsurePilotAgent(ctx, log); err != nil {
		return b, err
	}
	if b.Istioctl, err = EnsureIstioctl(ctx, log); err != nil {
		return b, err
	}
	if b.PilotDiscovery, err = EnsurePilotDiscovery(ctx, log); err != nil {
		return b, err
	}
	if b.Kubectl, err = EnsureKubectl(ctx, log); err != nil {
		return b, err
	}
	return b, nil
}

// EnsureEtcd returns the path of the cached etcd binary, building it if missing.
func EnsureEtcd(ctx context.Context, log *slog.Logger) (string, error) {
	return ensure(ctx, log, etcdSpec)
}

// EnsureKubeAPIServer returns the path of the cached kube-apiserver binary,
// building it if missing (minutes).
func EnsureKubeAPIServer(ctx context.Context, log *slog.Logger) (string, error) {
	return ensure(ctx, log, kubeSpec)
}

// EnsureKubectl returns the path of the cached kubectl binary, for people trying Sailplane
// against the test API server and for the quick start's test, building it if missing (from the
// same module set as kube-apiserver, so it mostly reuses that build's cache).
func EnsureKubectl(ctx context.Context, log *slog.Logger) (string, error) {
	return ensure(ctx, log, kubectlSpec)
}

// EnsurePilotAgent returns the path of the cached pilot-agent binary (Istio's own sidecar
// agent, a test client of the ca and xds-server), building it if missing: several minutes cold.
func EnsurePilotAgent(ctx context.Context, log *slog.Logger) (string, error) {
	return ensure(ctx, log, pilotAgentSpec)
}

// EnsureIstioctl returns the path of the cached istioctl binary (Istio's CLI, a test client of
// xds-server's debug types), building it if missing: minutes cold, like pilot-agent, with which
// it shares the module and most packages.
func EnsureIstioctl(ctx context.Context, log *slog.Logger) (string, error) {
	return ensure(ctx, log, istioctlSpec)
}

// EnsurePilotDiscovery returns the path of the cached pilot-discovery binary (istiod, the
// reference of the differential tests), building it if missing: minutes cold, sharing the
// module and most packages with pilot-agent.
func EnsurePilotDiscovery(ctx context.Context, log *slog.Logger) (string, error) {
	return ensure(ctx, log, pilotDiscoverySpec)
}

// EnsureConsul returns the path of the cached consul binary, building it if missing.
func EnsureConsul(ctx context.Context, log *slog.Logger) (string, error) {
	return ensure(ctx, log, consulSpec)
}

type buildSpec struct {
	name    string
	version string
	gomod   string // go.mod of the throwaway module, as a text/template
	pkg     string // package holding main
	ldflags string
}

var etcdSpec = buildSpec{
	name:    "etcd",
	version: EtcdVersion,
	gomod:   etcdGoMod,
	// etcd 3.7 keeps its main in the server module's root package.
	pkg: "go.etcd.io/etcd/server/v3",
}

var kubeSpec = buildSpec{
	name:    "kube-apiserver",
	version: KubeVersion,
	gomod:   kubeGoMod,
	pkg:     "k8s.io/kubernetes/cmd/kube-apiserver",
	// Without these /version reports v0.0.0-master.
	ldflags: kubeVersionLDFlags("k8s.io/component-base/version"),
}

var kubectlSpec = buildSpec{
	name:    "kubectl",
	version: KubeVersion,
	gomod:   kubeGoMod,
	pkg:     "k8s.io/kubernetes/cmd/kubectl",
	// kubectl reports its version from client-go's copy; both are set, as Kubernetes' build does.
	ldflags: kubeVersionLDFlags("k8s.io/component-base/version") + " " + kubeVersionLDFlags("k8s.io/client-go/pkg/version"),
}

// kubeVersionLDFlags stamps KubeVersion into a Kubernetes version package (pkg); without it
// binaries report v0.0.0-master.
func kubeVersionLDFlags(pkg string) string {
	return "-X " + pkg + ".gitVersion=" + KubeVersion +
		" -X " + pkg + ".gitMajor=1" +
		" -X " + pkg + ".gitMinor=" + strings.Split(KubeVersion, ".")[1] +
		" -X " + pkg + ".gitTreeState=clean"
}

var consulSpec = buildSpec{
	name:    "consul",
	version: ConsulVersion,
	gomod:   consulGoMod,
	pkg:     "github.com/hashicorp/consul",
}

var pilotAgentSpec = buildSpec{
	name:    "pilot-agent",
	version: IstioVersion,
	gomod:   istioGoMod,
	pkg:     "istio.io/istio/pilot/cmd/pilot-agent",
	// The version the agent reports in its node metadata (ISTIO_VERSION), "unknown" without it.
	ldflags: "-X istio.io/istio/pkg/version.buildVersion=" + IstioVersion,
}

var istioctlSpec = buildSpec{
	name:    "istioctl",
	version: IstioVersion,
	gomod:   istioGoMod,
	pkg:     "istio.io/istio/istioctl/cmd/istioctl",
	ldflags: "-X istio.io/istio/pkg/version.buildVersion=" + IstioVersion,
}

var pilotDiscoverySpec = buildSpec{
	name:    "pilot-discovery",
	version: IstioVersion,
	gomod:   istioGoMod,
	pkg:     "istio.io/istio/pilot/cmd/pilot-discovery",
	ldflags: "-X istio.io/istio/pkg/version.buildVersion=" + IstioVersion,
}

const etcdGoMod = `module sailplane.dev/throwaway/etcd

go 1.26.0

require go.etcd.io/etcd/server/v3 {{.Version}}
`

// kubeStaging are the modules k8s.io/kubernetes requires as v0.0.0 and
// replaces by its staging directories; outside its repo each must be
// replaced by its published v0.X.Y release.
var kubeStaging = []string{
	"api", "apiextensions-apiserver", "apimachinery", "apiserver", "cli-runtime",
	"client-go", "cloud-provider", "cluster-bootstrap", "code-generator",
	"component-base", "component-helpers", "controller-manager", "cri-api",
	"cri-client", "cri-streaming", "csi-translation-lib",
	"dynamic-resource-allocation", "endpointslice", "externaljwt", "kms",
	"kube-aggregator", "kube-controller-manager", "kube-proxy", "kube-scheduler",
	"kubectl", "kubelet", "metrics", "mount-utils", "pod-security-admission",
	"sample-apiserver", "streaming",
}

const kubeGoMod = `module sailplane.dev/throwaway/kubernetes

go 1.26.0

require k8s.io/kubernetes {{.Version}}
{{range .Staging}}
replace k8s.io/{{.}} => k8s.io/{{.}} {{$.StagingVersion}}
{{- end}}
`

// consul's own go.mod replaces its api/sdk/proto-public submodules by
// directories, which is ignored for a dependency; the versions it requires
// (api v1.15.2, sdk v0.11.0, proto-public v0.1.0) are published and build.
// The gocheck replace is copied from consul's go.mod: launchpad.net is not
// a Go module host.
const consulGoMod = `module sailplane.dev/throwaway/consul

go 1.26.0

require github.com/hashicorp/consul {{.Version}}

replace launchpad.net/gocheck => github.com/go-check/check v0.0.0-20140225173054-eb6ee6f84d0a
`

// Istio's master pseudo-version pins sibling modules at versions the module proxy does not
// have; their nearest releases build.
const istioGoMod = `module sailplane.dev/throwaway/istio

go 1.26.0

require istio.io/istio {{.Version}}

replace (
	istio.io/api => istio.io/api v1.31.1
	istio.io/client-go => istio.io/client-go v1.31.1
	github.com/envoyproxy/go-control-plane/envoy => github.com/envoyproxy/go-control-plane/envoy v1.40.0
	github.com/envoyproxy/go-control-plane/contrib => github.com/envoyproxy/go-control-plane/contrib v1.36.1-0.20260729145720-a2d8c7492908
)
`

func (s buildSpec) renderGoMod() (string, error) {
	t, err := template.New(s.name).Parse(s.gomod)
	if err != nil {
		return "", err
	}
	var buf bytes.Buffer
	err = t.Execute(&buf, map[string]any{
		"Version":        s.version,
		"Staging":        kubeStaging,
		"StagingVersion": KubeStagingVersion,
	})
	return buf.String(), err
}

func ensure(ctx context.Context, log *slog.Logger, s buildSpec) (string, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	dir, err := CacheDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, s.name+"-"+s.version)
	if isExecutable(bin) {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("testenv: %w", err)
	}
	unlock, err := lockFile(ctx, filepath.Join(dir, "."+s.name+"-"+s.version+".lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	// Another process may have built it while we waited for the lock.
	if isExecutable(bin) {
		return bin, nil
	}
	log.Info("testenv: building (cached afterwards)", "component", s.name, "version", s.version, "dest", bin)
	start := time.Now()
	if err := build(ctx, s, bin); err != nil {
		return "", err
	}
	log.Info("testenv: built", "component", s.name, "took", time.Since(start).Round(time.Second))
	return bin, nil
}

func build(ctx context.Context, s buildSpec, bin string) error {
	gomod, err := s.renderGoMod()
	if err != nil {
		return &BuildError{Component: s.name, Err: err}
	}
	tmp, err := os.MkdirTemp("", "sailplane-build-"+s.name+"-")
	if err != nil {
		return &BuildError{Component: s.name, Err: err}
	}
	defer os.RemoveAll(tmp)
	if err := os.WriteFile(filepath.Join(tmp, "go.mod"), []byte(gomod), 0o644); err != nil {
		return &BuildError{Component: s.name, Err: err}
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return &BuildError{Component: s.name, Err: err}
	}
	// Written next to the destination and renamed, so a reader never sees a
	// half-written binary.
	out := bin + ".tmp"
	args := []string{"build", "-trimpath", "-o", out}
	ldflags := strings.TrimSpace("-s -w " + s.ldflags)
	args = append(args, "-ldflags", ldflags, s.pkg)
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = tmp
	cmd.Env = append(os.Environ(),
		"GOWORK=off",
		// -mod=mod lets go build fill in go.sum for the throwaway module.
		"GOFLAGS=-mod=mod -buildvcs=false",
		"GOTOOLCHAIN=local",
	)
	var output tailBuffer
	cmd.Stdout = &output
	cmd.Stderr = &output
	if err := cmd.Run(); err != nil {
		os.Remove(out)
		return &BuildError{Component: s.name, Output: output.String(), Err: err}
	}
	if err := os.Rename(out, bin); err != nil {
		return &BuildError{Component: s.name, Err: err}
	}
	return nil
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// lockFile takes an exclusive flock, polling so that ctx can cancel the wait.
func lockFile(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("testenv: lock: %w", err)
	}
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("testenv: lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("testenv: waiting for build lock %s: %w", path, ctx.Err())
		case <-t.C:
		}
	}
}

// tailBuffer keeps the last 16 KiB written to it.
type tailBuffer struct{ b []byte }

const tailMax = 16 << 10

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > tailMax {
		t.b = append(t.b[:0], t.b[len(t.b)-tailMax:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return string(t.b) }

var _ io.Writer = (*tailBuffer)(nil)
