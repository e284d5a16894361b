package cni

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"sailplane.dev/tools/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	pluginOnce sync.Once
	pluginBin  string
	pluginErr  error
	pluginOut  []byte
)

// pluginBinary builds sailplane-cni once per test process: the tests run it as a runtime does.
func pluginBinary(t testing.TB) string {
	t.Helper()
	pluginOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sailplane-cni-")
		if err != nil {
			pluginErr = err
			return
		}
		pluginBin = filepath.Join(dir, PluginType)
		pluginOut, pluginErr = exec.Command("go", "build", "-o", pluginBin, "sailplane.dev/services/agent/cmd/sailplane-cni").CombinedOutput()
	})
	if pluginErr != nil {
		t.Fatalf("go build sailplane-cni: %v\n%s", pluginErr, pluginOut)
	}
	return pluginBin
}

var (
	agentOnce sync.Once
	agentBin  string
	agentErr  error
	agentOut  []byte
)

// agentBinary builds the agent once: its `capture --validate` is what CNI mode's validation
// init container runs in the pod.
func agentBinary(t testing.TB) string {
	t.Helper()
	agentOnce.Do(func() {
		agentBin = filepath.Join(filepath.Dir(pluginBinary(t)), "agent")
		agentOut, agentErr = exec.Command("go", "build", "-o", agentBin, "sailplane.dev/services/agent/cmd").CombinedOutput()
	})
	if agentErr != nil {
		t.Fatalf("go build the agent: %v\n%s", agentErr, agentOut)
	}
	return agentBin
}

// validate runs the validation init container's command in netns, as the proxy's uid 1337
// without capabilities.
func validate(t testing.TB, netns string) (string, error) {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", netns, "setpriv", "--reuid=1337", "--regid=1337", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all",
		agentBinary(t), "capture", "--validate", "--validate-timeout=2s").CombinedOutput()
	return string(out), err
}

// needRoot fails (never skips) a test that needs root and the capture tools.
func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test creates network namespaces and installs rules: it needs root (CI runs as root)")
	}
	for _, tool := range []string{"ip", "nft", "iptables-restore", "iptables-save", "ip6tables-save", "setpriv"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed: apt-get install -y iproute2 iptables nftables (.ci/run does it): %v", tool, err)
		}
	}
}

var netnsSeq atomic.Int32

// newNetns is a network namespace the test creates, as the runtime does for a pod sandbox (the
// primary CNI having given it an address), deleted at the end. It returns its name.
func newNetns(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("spcni-%d-%d", os.Getpid(), netnsSeq.Add(1))
	run(t, "ip", "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	run(t, "ip", "-n", name, "link", "set", "lo", "up")
	run(t, "ip", "-n", name, "link", "add", "eth0", "type", "veth", "peer", "name", "peer0")
	run(t, "ip", "-n", name, "addr", "add", "198.18.0.5/24", "dev", "eth0")
	run(t, "ip", "-n", name, "link", "set", "eth0", "up")
	return name
}

func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// rules is everything capture may change in the namespace: nftables with handles (a table
// replaced by an identical one shows), iptables, ip6tables.
func rules(t testing.TB, netns string) string {
	t.Helper()
	ex := func(args ...string) string { return run(t, "ip", append([]string{"netns", "exec", netns}, args...)...) }
	var b strings.Builder
	b.WriteString("## nft\n" + ex("nft", "-a", "list", "ruleset"))
	for _, save := range []string{"iptables-save", "ip6tables-save"} {
		for line := range strings.Lines(ex(save)) {
			if !strings.HasPrefix(line, "#") {
				b.WriteString(line)
			}
		}
	}
	return b.String()
}

const prevResult = `{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","mac":"aa:bb:cc:dd:ee:ff","sandbox":"/var/run/netns/x"}],"ips":[{"address":"198.18.0.5/24","gateway":"198.18.0.1","interface":0}],"routes":[{"dst":"0.0.0.0/0"}],"dns":{"nameservers":["198.18.0.10"]}}`

// cniEnv is a runtime's call of the plugin.
type cniEnv struct {
	bin, command, netns, namespace, pod string
	conf                                map[string]any
}

// invoke runs the plugin as a container runtime does: CNI_* variables, the network
// configuration on stdin. It returns stdout and the exit error.
func (c cniEnv) invoke(t testing.TB) ([]byte, error) {
	t.Helper()
	conf, err := json.Marshal(c.conf)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(c.bin)
	cmd.Env = []string{
		"CNI_COMMAND=" + c.command,
		"CNI_CONTAINERID=c0ffee" + c.pod,
		"CNI_NETNS=/run/netns/" + c.netns,
		"CNI_IFNAME=eth0",
		"CNI_PATH=" + filepath.Dir(c.bin),
		"CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=" + c.namespace + ";K8S_POD_NAME=" + c.pod + ";K8S_POD_INFRA_CONTAINER_ID=c0ffee",
		"PATH=" + os.Getenv("PATH"),
	}
	cmd.Stdin = bytes.NewReader(conf)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	t.Logf("sailplane-cni %s %s/%s: %v; stderr:\n%s", c.command, c.namespace, c.pod, err, stderr.String())
	return stdout.Bytes(), err
}

// injectedPod is a pod as the webhook injects it in CNI mode: Envoy's istio-proxy (the native
// sidecar, uid 1337), the agent with PROXY_CONFIG and proxyMetadata variables, the status
// annotation, no istio-init.
func injectedPod(name string, annotations map[string]string, env ...corev1.EnvVar) *corev1.Pod {
	always := corev1.ContainerRestartPolicyAlways
	ann := map[string]string{"sidecar.istio.io/status": `{"initContainers":["sailplane-agent","istio-proxy"]}`}
	for k, v := range annotations {
		ann[k] = v
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{
				{Name: "sailplane-agent", Image: "sailplane/agent", RestartPolicy: &always, Env: append([]corev1.EnvVar{
					{Name: "PROXY_CONFIG", Value: `{"statusPort":15020}`},
				}, env...)},
				{Name: "istio-proxy", Image: "envoy", RestartPolicy: &always, SecurityContext: &corev1.SecurityContext{RunAsUser: new(int64(1337)), RunAsGroup: new(int64(1337))}},
			},
			Containers: []corev1.Container{{Name: "app", Image: "app"}},
		},
	}
}

// startKube is a real API server with the namespaces demo and kube-system, and a kubeconfig
// for the plugin as the installer writes it.
func startKube(t testing.TB) (kubernetes.Interface, string) {
	t.Helper()
	k := testenv.KubeForTest(t)
	client, err := kubernetes.NewForConfig(k.RestConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"demo", "kube-system"} {
		if _, err := client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && ns == "demo" {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte(k.Token()), 0o600); err != nil {
		t.Fatal(err)
	}
	kc, err := Kubeconfig(k.Host(), token, k.CAData())
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	return client, kubeconfig
}

// netConf is the plugin's network configuration, with the previous plugin's result.
func netConf(t testing.TB, kubeconfig, backend string) map[string]any {
	var prev any
	if err := json.Unmarshal([]byte(prevResult), &prev); err != nil {
		t.Fatal(err)
	}
	return map[string]any{
		"cniVersion": "1.0.0", "name": "k8s-pod-network", "type": PluginType,
		"kubeconfig": kubeconfig, "exclude_namespaces": []string{"kube-system"}, "backend": backend,
		"log_level": "debug", "prevResult": prev,
	}
}

// TestPlugin runs the real sailplane-cni as a runtime would (CNI_* variables, a network
// configuration with a prevResult on stdin) on network namespaces the test creates, with a real
// API server holding the pods: an injected pod gets the rules `agent capture` installs (both
// backends), with its annotations; the previous result comes back unchanged; a second ADD
// changes nothing; pods not injected, or in an excluded namespace, are untouched; a bad
// annotation fails ADD naming it; DEL and CHECK succeed; VERSION answers. The validation init
// container's check (`agent capture --validate`, as uid 1337) passes on the plugin's rules and
// fails where the plugin passed the pod through.
func TestPlugin(t *testing.T) {
	needRoot(t)
	bin := pluginBinary(t)
	client, kubeconfig := startKube(t)
	ctx := context.Background()
	create := func(ns string, p *corev1.Pod) {
		t.Helper()
		if _, err := client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	create("demo", injectedPod("app", map[string]string{"traffic.sidecar.istio.io/excludeInboundPorts": "8081"}, corev1.EnvVar{Name: "ISTIO_META_DNS_CAPTURE", Value: "true"}))
	create("demo", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "plain"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app"}}}})
	create("demo", injectedPod("none", map[string]string{"sidecar.istio.io/interceptionMode": "NONE"}))
	create("demo", injectedPod("broken", map[string]string{"traffic.sidecar.istio.io/includeOutboundIPRanges": "10.0.0.0/8,10.1.2.3"}))
	create("kube-system", injectedPod("app", nil))
	conf := func(backend string) map[string]any { return netConf(t, kubeconfig, backend) }
	// checkEchoed: stdout is the prevResult, unchanged.
	checkEchoed := func(t *testing.T, out []byte) {
		t.Helper()
		var got, want any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("stdout %q: %v", out, err)
		}
		_ = json.Unmarshal([]byte(prevResult), &want)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("stdout %s, want the prevResult %s", out, prevResult)
		}
	}

	for _, tc := range []struct {
		backend string
		want    []string
	}{
		{"nftables", []string{"table inet sailplane-capture", "redirect to :15001", "redirect to :15006", "tcp dport 8081", "meta skuid 1337", "udp dport 53", "redirect to :15053"}},
		{"iptables", []string{"-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001", "-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006", "--dport 8081 -j RETURN", "--uid-owner 1337", "--dport 53 -j REDIRECT --to-ports 15053"}},
	} {
		t.Run("injected/"+tc.backend, func(t *testing.T) {
			netns := newNetns(t)
			before := rules(t, netns)
			call := cniEnv{bin: bin, command: "ADD", netns: netns, namespace: "demo", pod: "app", conf: conf(tc.backend)}
			out, err := call.invoke(t)
			if err != nil {
				t.Fatalf("ADD: %v: %s", err, out)
			}
			checkEchoed(t, out)
			installed := rules(t, netns)
			t.Logf("rules in the pod's namespace:\n%s", installed)
			if installed == before {
				t.Fatal("ADD installed nothing")
			}
			for _, w := range tc.want {
				if !strings.Contains(installed, w) {
					t.Errorf("the rules lack %q", w)
				}
			}
			// A second ADD (the runtime retries) changes nothing.
			out, err = call.invoke(t)
			if err != nil {
				t.Fatalf("second ADD: %v: %s", err, out)
			}
			checkEchoed(t, out)
			if again := rules(t, netns); again != installed {
				t.Errorf("a second ADD changed the rules:\n%s", again)
			}
			// The validation init container, which runs next in the pod, sees the capture.
			if out, err := validate(t, netns); err != nil {
				t.Errorf("the validation fails on the plugin's rules: %v\n%s", err, out)
			}
			for _, command := range []string{"CHECK", "DEL"} {
				call.command = command
				if out, err := call.invoke(t); err != nil {
					t.Errorf("%s: %v: %s", command, err, out)
				}
			}
		})
	}

	for _, tc := range []struct{ name, namespace, pod string }{
		{"not-injected", "demo", "plain"},
		{"interception-none", "demo", "none"},
		{"excluded-namespace", "kube-system", "app"},
		{"not-kubernetes", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			netns := newNetns(t)
			before := rules(t, netns)
			out, err := cniEnv{bin: bin, command: "ADD", netns: netns, namespace: tc.namespace, pod: tc.pod, conf: conf("nftables")}.invoke(t)
			if err != nil {
				t.Fatalf("ADD: %v: %s", err, out)
			}
			checkEchoed(t, out)
			if after := rules(t, netns); after != before {
				t.Errorf("ADD changed the namespace of a pod it should pass through:\n%s", after)
			}
			if tc.name == "excluded-namespace" {
				// Such a pod, had it been injected in CNI mode, fails its validation.
				if out, err := validate(t, netns); err == nil {
					t.Errorf("the validation passes in a namespace the plugin passed through:\n%s", out)
				}
			}
		})
	}

	t.Run("bad-annotation", func(t *testing.T) {
		netns := newNetns(t)
		before := rules(t, netns)
		out, err := cniEnv{bin: bin, command: "ADD", netns: netns, namespace: "demo", pod: "broken", conf: conf("nftables")}.invoke(t)
		if err == nil {
			t.Fatalf("ADD succeeded: %s", out)
		}
		var cniErr struct {
			Code int    `json:"code"`
			Msg  string `json:"msg"`
		}
		if jerr := json.Unmarshal(out, &cniErr); jerr != nil || !strings.Contains(cniErr.Msg, "traffic.sidecar.istio.io/includeOutboundIPRanges") || !strings.Contains(cniErr.Msg, "10.1.2.3") {
			t.Errorf("ADD answered %s (%v), want a CNI error naming the annotation and its value", out, jerr)
		}
		if after := rules(t, netns); after != before {
			t.Errorf("a failed ADD left rules:\n%s", after)
		}
	})

	t.Run("pod-not-found", func(t *testing.T) {
		// The API server's answer is final: ADD fails at once, naming the pod.
		out, err := cniEnv{bin: bin, command: "ADD", netns: newNetns(t), namespace: "demo", pod: "ghost", conf: conf("nftables")}.invoke(t)
		if err == nil || !strings.Contains(string(out), `pods \"ghost\" not found`) {
			t.Errorf("ADD for a pod the API server does not have: %v: %s", err, out)
		}
	})

	t.Run("version", func(t *testing.T) {
		out, err := cniEnv{bin: bin, command: "VERSION", netns: "x", conf: map[string]any{"cniVersion": "1.0.0"}}.invoke(t)
		if err != nil || !strings.Contains(string(out), `"1.0.0"`) {
			t.Errorf("VERSION: %v: %s", err, out)
		}
	})
}
