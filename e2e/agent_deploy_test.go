package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/spiffe"
	"sailplane.dev/tools/testenv"
)

// TestAgentSidecarManifest builds deploy/agent-example (an application with the deploy/agent
// component) with kustomize and applies it to a real API server, which accepts it. Then it
// plays the kubelet for the agent's container: each volume it mounts is filled as Kubernetes
// would (the projected token by TokenRequest with the volume's audience for the pod's service
// account, the ConfigMap from the API server, where the ca wrote it), the container's own
// arguments and environment are used, only its absolute paths moved under a test folder and
// the ca's address replaced. The agent becomes ready at the startup probe's path with the
// certificate of the pod's service account, and the application container mounts what its
// gRPC bootstrap names at the same paths.
func TestAgentSidecarManifest(t *testing.T) {
	built, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), "../deploy/agent-example")
	if err != nil {
		t.Fatalf("kustomize build deploy/agent-example: %v", err)
	}
	manifest, err := built.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	k := testenv.KubeForTest(t)
	kube := framework.NewKube(t, k.RestConfig())
	var dep appsv1.Deployment
	for _, obj := range kube.Apply(t, string(manifest)) {
		if obj.GetKind() == "Deployment" {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &dep); err != nil {
				t.Fatal(err)
			}
		}
	}
	pod := dep.Spec.Template.Spec
	agent, ok := containerNamed(pod.InitContainers, "sailplane-agent")
	if !ok {
		t.Fatalf("Deployment %s/%s has no sailplane-agent init container: %+v", dep.Namespace, dep.Name, pod.InitContainers)
	}
	if agent.RestartPolicy == nil || *agent.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("the agent is not a native sidecar (restartPolicy Always): %v", agent.RestartPolicy)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("want the application's one container, got %d", len(pod.Containers))
	}
	app := pod.Containers[0]

	kube.EnsureNamespace(t, "istio-system")
	caAddr := framework.FreeAddr(t)
	framework.Start(t, t.TempDir(), framework.Binary(t, "ca"), "--kubernetes=true", "--kubeconfig", k.KubeconfigPath(),
		"--ca-listen", caAddr, "--bus-listen", framework.FreeAddr(t))

	// The kubelet's part: the agent's volumes under root.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	root := t.TempDir()
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}
	for _, m := range agent.VolumeMounts {
		v, ok := volumes[m.Name]
		if !ok {
			t.Fatalf("the agent mounts volume %q, which the pod does not define", m.Name)
		}
		dir := filepath.Join(root, m.MountPath)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		switch {
		case v.Projected != nil:
			for _, src := range v.Projected.Sources {
				sat := src.ServiceAccountToken
				if sat == nil {
					continue
				}
				tr, err := kube.Clientset.CoreV1().ServiceAccounts(dep.Namespace).CreateToken(ctx, pod.ServiceAccountName, &authnv1.TokenRequest{
					Spec: authnv1.TokenRequestSpec{Audiences: []string{sat.Audience}, ExpirationSeconds: sat.ExpirationSeconds},
				}, metav1.CreateOptions{})
				if err != nil {
					t.Fatalf("token for volume %s: %v", v.Name, err)
				}
				framework.WriteFile(t, dir, sat.Path, tr.Status.Token)
			}
		case v.ConfigMap != nil:
			framework.Eventually(t, time.Minute, func() error {
				cm, err := kube.Clientset.CoreV1().ConfigMaps(dep.Namespace).Get(ctx, v.ConfigMap.Name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				for key, value := range cm.Data {
					framework.WriteFile(t, dir, key, value)
				}
				return nil
			})
		case v.EmptyDir != nil:
		default:
			t.Fatalf("volume %s: a kind this test does not fill", v.Name)
		}
	}

	// The container's arguments, its paths under root, the ca here.
	ready := framework.FreeAddr(t)
	var args []string
	flags := map[string]string{}
	for _, a := range agent.Args {
		name, value, _ := strings.Cut(a, "=")
		flags[name] = value
		switch {
		case name == "--ca-address":
			value = caAddr
		case name == "--xds-address":
			value = framework.FreeAddr(t) // not dialled until a proxy connects
		case name == "--readiness-address":
			value = ready
		case strings.HasPrefix(value, "/"):
			value = filepath.Join(root, value)
		}
		if value == "" {
			args = append(args, name)
		} else {
			args = append(args, name+"="+value)
		}
	}
	fieldValues := map[string]string{"metadata.name": dep.Name + "-0", "metadata.namespace": dep.Namespace, "status.podIP": "127.0.0.1"}
	var env []string
	for _, e := range agent.Env {
		value := e.Value
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			v, ok := fieldValues[e.ValueFrom.FieldRef.FieldPath]
			if !ok {
				t.Fatalf("env %s: field %s", e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
			value = v
		}
		env = append(env, e.Name+"="+value)
	}
	framework.StartEnv(t, env, root, framework.Binary(t, "agent"), args...)

	probe := agent.StartupProbe
	if probe == nil || probe.HTTPGet == nil {
		t.Fatal("the agent has no HTTP startup probe: the application would start before its certificate")
	}
	if _, port, _ := strings.Cut(flags["--readiness-address"], ":"); port != probe.HTTPGet.Port.String() {
		t.Errorf("the startup probe asks port %s, the agent serves readiness on %q", probe.HTTPGet.Port.String(), flags["--readiness-address"])
	}
	framework.Eventually(t, time.Minute, func() error {
		resp, err := http.Get("http://" + ready + probe.HTTPGet.Path)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %d", probe.HTTPGet.Path, resp.StatusCode)
		}
		return nil
	})
	data, err := os.ReadFile(filepath.Join(root, flags["--output-dir"], pki.CertChainFile))
	if err != nil {
		t.Fatal(err)
	}
	chain, err := pki.ParseCerts(data)
	if err != nil {
		t.Fatal(err)
	}
	_, roots := meshRoot(ctx, t, kube, dep.Namespace)
	if err := checkWorkloadCert(chain, roots, spiffe.ID{TrustDomain: "cluster.local", Namespace: dep.Namespace, ServiceAccount: pod.ServiceAccountName}); err != nil {
		t.Error(err)
	}

	// The application reads the bootstrap at GRPC_XDS_BOOTSTRAP and the files it names, each
	// from a volume the agent writes, mounted at the same path.
	var bootstrapPath string
	for _, e := range app.Env {
		if e.Name == "GRPC_XDS_BOOTSTRAP" {
			bootstrapPath = e.Value
		}
	}
	if bootstrapPath != flags["--grpc-bootstrap"] {
		t.Errorf("the application's GRPC_XDS_BOOTSTRAP %q, the agent writes %q", bootstrapPath, flags["--grpc-bootstrap"])
	}
	bootstrap, err := os.ReadFile(filepath.Join(root, flags["--grpc-bootstrap"]))
	if err != nil {
		t.Fatal(err)
	}
	var b struct {
		CertificateProviders map[string]struct {
			Config map[string]any `json:"config"`
		} `json:"certificate_providers"`
	}
	if err := json.Unmarshal(bootstrap, &b); err != nil {
		t.Fatal(err)
	}
	paths := []string{bootstrapPath}
	for _, p := range b.CertificateProviders {
		for _, key := range []string{"certificate_file", "private_key_file", "ca_certificate_file"} {
			if f, ok := p.Config[key].(string); ok {
				paths = append(paths, strings.TrimPrefix(f, root))
			}
		}
	}
	if len(paths) < 4 {
		t.Fatalf("the bootstrap names no certificate files:\n%s", bootstrap)
	}
	for _, p := range paths {
		if !sharedMount(agent, app, p) {
			t.Errorf("%s: the application does not mount the agent's volume holding it at the same path", p)
		}
	}
}

func containerNamed(cs []corev1.Container, name string) (corev1.Container, bool) {
	for _, c := range cs {
		if c.Name == name {
			return c, true
		}
	}
	return corev1.Container{}, false
}

// sharedMount reports whether path lies in a volume both containers mount at the same place.
func sharedMount(a, b corev1.Container, path string) bool {
	for _, ma := range a.VolumeMounts {
		if !strings.HasPrefix(path, ma.MountPath+"/") {
			continue
		}
		for _, mb := range b.VolumeMounts {
			if mb.Name == ma.Name && mb.MountPath == ma.MountPath {
				return true
			}
		}
	}
	return false
}
