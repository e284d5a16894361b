package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// IstioCRDFile returns the path of customresourcedefinitions.gen.yaml in the
// istio.io/api module, downloading the module into the module cache if
// needed. The file is read from there, not copied into the repo.
func IstioCRDFile(ctx context.Context) (string, error) {
	dir, err := moduleDir(ctx, "istio.io/api@"+IstioAPIVersion)
	if err != nil {
		return "", fmt.Errorf("testenv: istio CRDs: %w", err)
	}
	return filepath.Join(dir, "kubernetes", "customresourcedefinitions.gen.yaml"), nil
}

// GatewayAPICRDFiles returns the paths of the Gateway API's standard-channel CRD files
// (config/crd/standard of sigs.k8s.io/gateway-api@GatewayAPIVersion, the version Sailplane
// pins), downloading the module into the module cache if needed; `make crds` copies them into
// deploy/crds/gateway-api.
func GatewayAPICRDFiles(ctx context.Context) ([]string, error) {
	dir, err := moduleDir(ctx, "sigs.k8s.io/gateway-api@"+GatewayAPIVersion)
	if err != nil {
		return nil, fmt.Errorf("testenv: Gateway API CRDs: %w", err)
	}
	files, err := filepath.Glob(filepath.Join(dir, "config", "crd", "standard", "gateway.networking.k8s.io_*.yaml"))
	if err == nil && len(files) == 0 {
		err = fmt.Errorf("no CRD files in %s", dir)
	}
	if err != nil {
		return nil, fmt.Errorf("testenv: Gateway API CRDs: %w", err)
	}
	return files, nil
}

// moduleDir downloads module@version into the module cache if needed and returns its folder.
func moduleDir(ctx context.Context, module string) (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, goBin, "mod", "download", "-json", module)
	// Outside any module so that neither go.work nor a go.mod interferes.
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=", "GOTOOLCHAIN=local")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s: %w: %s%s", module, err, stderr.String(), out)
	}
	var info struct{ Dir, Error string }
	if err := json.Unmarshal(out, &info); err != nil {
		return "", fmt.Errorf("go mod download %s: %w", module, err)
	}
	if info.Error != "" || info.Dir == "" {
		return "", fmt.Errorf("go mod download %s: %s", module, info.Error)
	}
	return info.Dir, nil
}

func (k *Kube) installIstioCRDs(ctx context.Context) error {
	path, err := IstioCRDFile(ctx)
	if err != nil {
		return err
	}
	return k.installCRDs(ctx, "Istio", path)
}

// InstallGatewayAPICRDs installs the Gateway API CRDs (see GatewayAPICRDFiles) and waits until
// they are Established: what WithGatewayAPICRDs does at start, for a test that installs them
// later.
func (k *Kube) InstallGatewayAPICRDs(ctx context.Context) error {
	files, err := GatewayAPICRDFiles(ctx)
	if err != nil {
		return err
	}
	return k.installCRDs(ctx, "Gateway API", files...)
}

// installCRDs creates every CustomResourceDefinition of the files (other documents are
// skipped) and waits until they are Established.
func (k *Kube) installCRDs(ctx context.Context, what string, files ...string) error {
	cfg := k.RestConfig()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return err
	}
	// client-go caches transports process-wide; closing idle connections
	// keeps goleak quiet in callers' tests.
	defer hc.CloseIdleConnections()
	dc, err := dynamic.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return err
	}
	crds := dc.Resource(crdGVR)
	var names []string
	for _, path := range files {
		created, err := createCRDs(ctx, crds, path)
		if err != nil {
			return err
		}
		names = append(names, created...)
	}
	if len(names) == 0 {
		return fmt.Errorf("testenv: no CRDs in %v", files)
	}
	k.opts.log.Info("testenv: installed "+what+" CRDs, waiting for Established", "count", len(names))
	return waitEstablished(ctx, crds, names)
}

func createCRDs(ctx context.Context, crds dynamic.NamespaceableResourceInterface, path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("testenv: CRDs: %w", err)
	}
	defer f.Close()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 64<<10)
	var names []string
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fmt.Errorf("testenv: decoding %s: %w", path, err)
		}
		if len(obj) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: obj}
		if u.GetKind() != "CustomResourceDefinition" {
			continue
		}
		if _, err := crds.Create(ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("testenv: creating CRD %s: %w", u.GetName(), err)
		}
		names = append(names, u.GetName())
	}
	return names, nil
}

func waitEstablished(ctx context.Context, crds dynamic.NamespaceableResourceInterface, names []string) error {
	pending := map[string]bool{}
	for _, n := range names {
		pending[n] = true
	}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		list, err := crds.List(ctx, metav1.ListOptions{})
		if err == nil {
			for _, item := range list.Items {
				if pending[item.GetName()] && established(&item) {
					delete(pending, item.GetName())
				}
			}
			if len(pending) == 0 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("testenv: CRDs not Established (%d left): %w", len(pending), ctx.Err())
		case <-t.C:
		}
	}
}

func established(u *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, ok := c.(map[string]any)
		if ok && m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}
