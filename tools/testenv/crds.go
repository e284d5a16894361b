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
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("testenv: istio CRDs: %w", err)
	}
	cmd := exec.CommandContext(ctx, goBin, "mod", "download", "-json", "istio.io/api@"+IstioAPIVersion)
	// Outside any module so that neither go.work nor a go.mod interferes.
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=", "GOTOOLCHAIN=local")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("testenv: go mod download istio.io/api: %w: %s%s", err, stderr.String(), out)
	}
	var info struct{ Dir, Error string }
	if err := json.Unmarshal(out, &info); err != nil {
		return "", fmt.Errorf("testenv: go mod download istio.io/api: %w", err)
	}
	if info.Error != "" || info.Dir == "" {
		return "", fmt.Errorf("testenv: go mod download istio.io/api: %s", info.Error)
	}
	return filepath.Join(info.Dir, "kubernetes", "customresourcedefinitions.gen.yaml"), nil
}

func (k *Kube) installIstioCRDs(ctx context.Context) error {
	path, err := IstioCRDFile(ctx)
	if err != nil {
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("testenv: istio CRDs: %w", err)
	}
	defer f.Close()
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
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 64<<10)
	var names []string
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return fmt.Errorf("testenv: decoding %s: %w", path, err)
		}
		if len(obj) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: obj}
		if u.GetKind() != "CustomResourceDefinition" {
			continue
		}
		if _, err := crds.Create(ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("testenv: creating CRD %s: %w", u.GetName(), err)
		}
		names = append(names, u.GetName())
	}
	if len(names) == 0 {
		return fmt.Errorf("testenv: no CRDs in %s", path)
	}
	k.opts.log.Info("testenv: installed Istio CRDs, waiting for Established", "count", len(names))
	return waitEstablished(ctx, crds, names)
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
