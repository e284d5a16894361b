package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/tools/testenv"
)

// TestCNIMode runs CNI mode end to end on a real API server: hyper's webhook with deploy/cni's
// injection values injects a pod in a namespace enforcing Pod Security "restricted" (the API
// server admits it: istio-validation, no istio-init); the real sailplane-cni, invoked as a
// runtime would for that pod on a network namespace the test creates, with deploy/cni's service
// account (get pods only), installs the capture there and echoes the previous result; then the
// pod's istio-validation command, run as its user without capabilities, passes.
func TestCNIMode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test creates a network namespace and installs rules in it: it needs root (CI runs as root)")
	}
	for _, tool := range []string{"ip", "nft", "iptables-restore", "setpriv"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed: apt-get install -y iproute2 iptables nftables (.ci/run does it): %v", tool, err)
		}
	}
	k := testenv.KubeForTest(t)
	kube := framework.NewKube(t, k.RestConfig())
	kube.EnsureNamespace(t, "istio-system")
	kube.Apply(t, meshConfigMap)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, o := range kustomizeBuild(t, "cni") {
		// deploy/cni's injection templates and the plugin's account, as shipped.
		if o.GetKind() == "ConfigMap" && o.GetName() == "istio-sidecar-injector" || o.GetName() == "sailplane-cni" {
			if err := serverSideApply(ctx, kube, o, false); err != nil {
				t.Fatalf("deploy/cni: %s: %v", ref(o), err)
			}
		}
	}
	webhookAddr := framework.FreeAddr(t)
	webhookTopologies[0].start(t, k, kube, webhookAddr) // hyper
	shipped, err := os.ReadFile("../deploy/base/webhooks.yaml")
	if err != nil {
		t.Fatal(err)
	}
	kube.Apply(t, strings.ReplaceAll(string(shipped), "service: {name: sailplane-webhook, namespace: istio-system, path: /inject, port: 443}", "url: https://"+webhookAddr+"/inject"))
	kube.Apply(t, "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop, labels: {istio-injection: enabled, pod-security.kubernetes.io/enforce: restricted}}\n")

	app := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: "shop"},
		Spec: corev1.PodSpec{
			ServiceAccountName: "default",
			SecurityContext:    &corev1.PodSecurityContext{RunAsNonRoot: new(true), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Containers: []corev1.Container{{Name: "app", Image: "example/app", SecurityContext: &corev1.SecurityContext{
				RunAsUser: new(int64(1000)), AllowPrivilegeEscalation: new(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			}}},
		},
	}
	var pod *corev1.Pod
	// The API server picks up the injector's caBundle a moment after the configuration.
	framework.Eventually(t, time.Minute, func() error {
		pod, err = kube.Clientset.CoreV1().Pods("shop").Create(ctx, app, metav1.CreateOptions{})
		if err == nil && pod.Annotations["sidecar.istio.io/status"] == "" {
			_ = kube.Clientset.CoreV1().Pods("shop").Delete(ctx, "app", metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))})
			return fmt.Errorf("created, not injected yet")
		}
		return err
	})
	names := []string{}
	for _, c := range pod.Spec.InitContainers {
		names = append(names, c.Name)
	}
	if !slices.Equal(names, []string{"istio-validation", "sailplane-agent", "istio-proxy"}) {
		t.Fatalf("the injected pod's init containers %v, want istio-validation, sailplane-agent, istio-proxy", names)
	}
	validation := pod.Spec.InitContainers[0]

	// The runtime sets up the pod's network: the primary CNI gave it an address, then ours.
	netns := fmt.Sprintf("spcnimode-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", netns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", netns).Run() })
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", "eth0", "type", "veth", "peer", "name", "peer0"},
		{"addr", "add", "198.18.0.7/24", "dev", "eth0"},
		{"link", "set", "eth0", "up"},
	} {
		if out, err := exec.Command("ip", append([]string{"-n", netns}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	// A kubeconfig as client-go writes it, with deploy/cni's account's token.
	dir := t.TempDir()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["k"] = &clientcmdapi.Cluster{Server: k.Host(), CertificateAuthorityData: k.CAData()}
	kc.AuthInfos["cni"] = &clientcmdapi.AuthInfo{Token: kube.ServiceAccountToken(t, "istio-system", "sailplane-cni")}
	kc.Contexts["cni"] = &clientcmdapi.Context{Cluster: "k", AuthInfo: "cni"}
	kc.CurrentContext = "cni"
	if err := clientcmd.WriteToFile(*kc, filepath.Join(dir, "kubeconfig")); err != nil {
		t.Fatal(err)
	}
	plugin := filepath.Join(dir, "sailplane-cni")
	if out, err := exec.Command("go", "build", "-o", plugin, "sailplane.dev/services/agent/cmd/sailplane-cni").CombinedOutput(); err != nil {
		t.Fatalf("go build sailplane-cni: %v\n%s", err, out)
	}
	prev := `{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/run/netns/` + netns + `"}],"ips":[{"address":"198.18.0.7/24","interface":0}]}`
	conf := `{"cniVersion":"1.0.0","name":"k8s-pod-network","type":"sailplane-cni","kubeconfig":"` + filepath.Join(dir, "kubeconfig") +
		`","exclude_namespaces":["kube-system","istio-system"],"prevResult":` + prev + `}`
	cmd := exec.Command(plugin)
	cmd.Env = []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=sandbox1", "CNI_NETNS=/run/netns/" + netns, "CNI_IFNAME=eth0", "CNI_PATH=" + dir,
		"CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=app;K8S_POD_INFRA_CONTAINER_ID=sandbox1", "PATH=" + os.Getenv("PATH")}
	cmd.Stdin = strings.NewReader(conf)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("sailplane-cni ADD: %v: %s\n%s", err, stdout.String(), stderr.String())
	}
	t.Logf("sailplane-cni ADD: %s", stderr.String())
	var got, want any
	_ = json.Unmarshal([]byte(prev), &want)
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("ADD printed %s, want the prevResult %s", stdout.String(), prev)
	}
	out, err := exec.Command("ip", "netns", "exec", netns, "nft", "list", "table", "inet", "sailplane-capture").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "redirect to :15001") {
		t.Fatalf("no capture in the pod's namespace after ADD: %v\n%s", err, out)
	}

	// istio-validation, as the kubelet would run it: its args, its user, no capabilities.
	uid := strconv.FormatInt(*validation.SecurityContext.RunAsUser, 10)
	args := append([]string{"netns", "exec", netns, "setpriv", "--reuid=" + uid, "--regid=" + uid, "--clear-groups", "--inh-caps=-all", "--bounding-set=-all",
		framework.Binary(t, "agent")}, validation.Args...)
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("the pod's istio-validation (%q as %s) fails on the plugin's rules: %v\n%s", validation.Args, uid, err, out)
	}
}
