package inject

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"sailplane.dev/shared/testlog"
	"sailplane.dev/shared/testwait"
	"sailplane.dev/tools/testenv"
)

const builtInAgentImage = "sailplane/agent"

// TestFolderReload: files mode. A missing folder means the built-in templates; files written
// later are picked up, each edit reloads; a bad edit is logged and the templates in use stay
// until the files are right again.
func TestFolderReload(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "injection")
	log, msgs := testlog.NewRecording(t, slog.LevelInfo)
	inj := runInjector(t, Config{}, Deps{Logger: log, Dir: dir})
	if got := agentImage(t, inj); got != builtInAgentImage {
		t.Fatalf("agent image %q with no folder, want the built-in %q", got, builtInAgentImage)
	}

	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "values"), valuesWithAgentImage(t, "sailplane/agent:v2"))
	eventually(t, "the new values file is used", func() bool { return agentImage(t, inj) == "sailplane/agent:v2" })

	write(t, filepath.Join(dir, "config"), "policy: [")
	eventually(t, "the bad config is reported", func() bool { return msgs.Count("injection templates not loaded") > 0 })
	write(t, filepath.Join(dir, "values"), valuesWithAgentImage(t, "sailplane/agent:v3"))
	eventually(t, "the values edit beside a bad config is reported", func() bool { return msgs.Count("injection templates not loaded") > 1 })
	if got := agentImage(t, inj); got != "sailplane/agent:v2" {
		t.Fatalf("agent image %q while the config is bad, want the last good one's", got)
	}

	write(t, filepath.Join(dir, "config"), string(DefaultConfig))
	eventually(t, "the fixed config is used", func() bool { return agentImage(t, inj) == "sailplane/agent:v3" })
}

// TestKube runs the tests that need a real API server on one.
func TestKube(t *testing.T) {
	k := testenv.KubeForTest(t)
	client, err := kubernetes.NewForConfig(k.RestConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Run("ConfigMapReload", func(t *testing.T) { testConfigMapReload(t, client) })
	t.Run("RestrictedPodSecurity", func(t *testing.T) { testRestrictedPodSecurity(t, client) })
}

// testConfigMapReload: Kubernetes mode. No ConfigMap means the built-in templates; creating,
// editing and deleting it takes effect at the next admission; a bad edit is logged and the
// templates in use stay.
func testConfigMapReload(t *testing.T, client kubernetes.Interface) {
	ctx := context.Background()
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "istio-system"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	log, msgs := testlog.NewRecording(t, slog.LevelInfo)
	inj := runInjector(t, Config{Revision: "canary", Namespace: "istio-system"}, Deps{Logger: log, Kube: client})
	if got := agentImage(t, inj); got != builtInAgentImage {
		t.Fatalf("agent image %q with no ConfigMap, want the built-in %q", got, builtInAgentImage)
	}

	cms := client.CoreV1().ConfigMaps("istio-system")
	// Another revision's ConfigMap is not this injector's.
	other := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: ConfigMapName("default")}, Data: map[string]string{"values": valuesWithAgentImage(t, "sailplane/agent:other")}}
	if _, err := cms.Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var err error
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "istio-sidecar-injector-canary"}, Data: map[string]string{"values": valuesWithAgentImage(t, "sailplane/agent:v2")}}
	if cm, err = cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the ConfigMap's values are used", func() bool { return agentImage(t, inj) == "sailplane/agent:v2" })

	cm.Data["config"] = "policy: ["
	cm.Data["values"] = valuesWithAgentImage(t, "sailplane/agent:v3")
	if cm, err = cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the bad edit is reported", func() bool { return msgs.Count("injection templates not loaded") > 0 })
	if got := agentImage(t, inj); got != "sailplane/agent:v2" {
		t.Fatalf("agent image %q after a bad edit, want the last good one's", got)
	}

	cm.Data["config"] = string(DefaultConfig)
	if _, err = cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the fixed ConfigMap is used", func() bool { return agentImage(t, inj) == "sailplane/agent:v3" })

	if err := cms.Delete(ctx, cm.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the built-in templates are used once the ConfigMap is deleted", func() bool { return agentImage(t, inj) == builtInAgentImage })
}

// testRestrictedPodSecurity: pods injected with each built-in template are stored by the API
// server in a namespace enforcing Pod Security "restricted", so the injected containers are
// valid and restricted-friendly (the application's own containers being so too) — except the
// sidecar's capture init container (NET_ADMIN, NET_RAW, root), which "restricted" refuses, as
// it refuses Istio's istio-init: there CNI mode (values pilot.cni.enabled) is the way, its pod
// having no such container.
func testRestrictedPodSecurity(t *testing.T, client kubernetes.Interface) {
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "restricted", Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}}}
	if _, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The API server enforces it: a pod that is not restricted is refused.
	plain := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "plain"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app"}}}}
	if _, err := client.CoreV1().Pods("restricted").Create(ctx, plain, metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "violates PodSecurity") {
		t.Fatalf("creating a pod that is not restricted: %v, want a PodSecurity refusal", err)
	}
	initMode := builtIn(t)
	cniMode := withValues(t, strings.Replace(string(DefaultValues), `"cni": {"enabled": false}`, `"cni": {"enabled": true}`, 1))
	for _, tc := range []struct {
		name, templates string
		inj             *Injector
		refused         string // what Pod Security names, when it refuses the pod
	}{
		{name: "sidecar", templates: "sidecar", inj: initMode, refused: `container "istio-init" must not include "NET_ADMIN", "NET_RAW" in securityContext.capabilities.add`},
		{name: "sidecar-cni", templates: "sidecar", inj: cniMode},
		{name: "grpc-agent", templates: "grpc-agent", inj: initMode},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// serviceAccountName set, as the API server's ServiceAccount admission does before
			// calling webhooks.
			pod := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"` + tc.name + `","namespace":"restricted","annotations":{"inject.istio.io/templates":"` + tc.templates + `"}},
				"spec":{"serviceAccountName":"default","securityContext":{"runAsNonRoot":true,"runAsUser":65532,"seccompProfile":{"type":"RuntimeDefault"}},
				"containers":[{"name":"app","image":"app","resources":{},"securityContext":{"allowPrivilegeEscalation":false,"capabilities":{"drop":["ALL"]}}}]}}`)
			resp := tc.inj.Admit(podRequest(pod))
			if !resp.Allowed || resp.Patch == nil {
				t.Fatalf("allowed %v, patch %s: %+v", resp.Allowed, resp.Patch, resp.Result)
			}
			var injected corev1.Pod
			if err := json.Unmarshal(applyPatch(t, pod, resp.Patch), &injected); err != nil {
				t.Fatal(err)
			}
			if tc.inj == cniMode {
				// No istio-init: the validation container, first, as the proxy's user (the pod's
				// runAsUser), the one the rules return.
				v := injected.Spec.InitContainers[0]
				if v.Name != "istio-validation" || !slices.Contains(v.Args, "--validate") || v.SecurityContext == nil || v.SecurityContext.RunAsUser == nil || *v.SecurityContext.RunAsUser != 65532 || !slices.Contains(v.Args, "65532") {
					t.Errorf("CNI mode: first init container %s %q, want istio-validation running --validate as the proxy's uid 65532", v.Name, v.Args)
				}
			}
			_, err := client.CoreV1().Pods("restricted").Create(ctx, &injected, metav1.CreateOptions{})
			switch {
			case tc.refused == "" && err != nil:
				t.Fatalf("the API server refuses the injected pod: %v", err)
			case tc.refused != "" && (err == nil || !strings.Contains(err.Error(), tc.refused)):
				t.Fatalf("the API server's answer %v, want a refusal naming %s", err, tc.refused)
			}
		})
	}
}

// withValues is a running Injector with the built-in config and these values, from a folder.
func withValues(t *testing.T, values string) *Injector {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config"), DefaultConfig, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "values"), []byte(values), 0o644); err != nil {
		t.Fatal(err)
	}
	return runInjector(t, Config{}, Deps{Logger: testlog.New(t, slog.LevelInfo), Dir: dir})
}

// agentImage admits a plain pod and returns the image of the injected agent.
func agentImage(t *testing.T, inj *Injector) string {
	t.Helper()
	pod := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"demo"},"spec":{"containers":[{"name":"app","image":"app","resources":{}}]}}`)
	resp := inj.Admit(podRequest(pod))
	if !resp.Allowed || resp.Patch == nil {
		t.Fatalf("plain pod: allowed %v, patch %s: %+v", resp.Allowed, resp.Patch, resp.Result)
	}
	var injected corev1.Pod
	if err := json.Unmarshal(applyPatch(t, pod, resp.Patch), &injected); err != nil {
		t.Fatal(err)
	}
	for _, c := range injected.Spec.InitContainers {
		if c.Name == "sailplane-agent" {
			return c.Image
		}
	}
	t.Fatal("no sailplane-agent in the injected pod")
	return ""
}

// valuesWithAgentImage is the built-in values with another agent image.
func valuesWithAgentImage(t *testing.T, image string) string {
	t.Helper()
	out := strings.Replace(string(DefaultValues), `"image": "sailplane/agent"`, `"image": "`+image+`"`, 1)
	if out == string(DefaultValues) {
		t.Fatal("the built-in values name no agent image")
	}
	return out
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// eventually waits until cond holds, failing after a deadline generous for a loaded machine.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testwait.Until(t, time.Minute, what, cond)
}
