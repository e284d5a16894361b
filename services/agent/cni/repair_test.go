package cni

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"sailplane.dev/shared/testwait"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"sailplane.dev/tools/testenv"
)

// syncBuffer is a log sink the test reads while the repair loop writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// repairKube is a real API server with the namespace demo, and the token and CA files of the
// node agent's account, as the DaemonSet mounts them.
func repairKube(t *testing.T) (client kubernetes.Interface, host, token, ca string) {
	t.Helper()
	k := testenv.KubeForTest(t)
	client, err := kubernetes.NewForConfig(k.RestConfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "demo"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	token, ca = filepath.Join(dir, "token"), filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(token, []byte(k.Token()), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ca, k.CAData(), 0o600); err != nil {
		t.Fatal(err)
	}
	return client, k.Host(), token, ca
}

// runUntilCleanup runs run until the test ends, logging logs when it failed.
func runUntilCleanup(t *testing.T, logs *syncBuffer, run func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		if t.Failed() {
			t.Logf("log:\n%s", logs)
		}
	})
}

// startRepair runs a Repairer for node-a against a real API server, as the DaemonSet's process
// does (its own token and CA files); the returned buffer holds its log.
func startRepair(t *testing.T, qps float64, burst int) (kubernetes.Interface, *syncBuffer) {
	t.Helper()
	client, host, token, ca := repairKube(t)
	logs := &syncBuffer{}
	r, err := NewRepairer(host, token, ca, "node-a", slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	r.QPS, r.Burst = qps, burst
	runUntilCleanup(t, logs, r.Run)
	return client, logs
}

// validationState is an istio-validation status as the kubelet writes it.
type validationState string

const (
	stateFailed    validationState = "failed"    // terminated, exit code 1 (restartPolicy Never)
	stateCrashLoop validationState = "crashloop" // waiting in CrashLoopBackOff after exiting 1
	stateRestarted validationState = "restarted" // running again after exiting 1
	statePassed    validationState = "passed"    // terminated, exit code 0
	stateRunning   validationState = "running"   // first run, not finished
)

func (s validationState) status() corev1.ContainerStatus {
	failed := &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", Message: "the pod's traffic is not captured"}
	cs := corev1.ContainerStatus{Name: ValidationContainer, Image: "sailplane/agent"}
	switch s {
	case stateFailed:
		cs.State.Terminated = failed
	case stateCrashLoop:
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}
		cs.LastTerminationState.Terminated, cs.RestartCount = failed, 3
	case stateRestarted:
		cs.State.Running = &corev1.ContainerStateRunning{}
		cs.LastTerminationState.Terminated, cs.RestartCount = failed, 1
	case statePassed:
		cs.State.Terminated = &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"}
	case stateRunning:
		cs.State.Running = &corev1.ContainerStateRunning{}
	}
	return cs
}

// createWithStatus creates an injected CNI-mode pod on node and writes its validation status
// through the status subresource, as the kubelet would.
func createWithStatus(t *testing.T, client kubernetes.Interface, name, node string, injected bool, s validationState) {
	t.Helper()
	ctx := context.Background()
	p := injectedPod(name, nil)
	if !injected {
		delete(p.Annotations, statusAnnotation)
	}
	p.Spec.NodeName = node
	p.Spec.InitContainers = append([]corev1.Container{{Name: ValidationContainer, Image: "sailplane/agent"}}, p.Spec.InitContainers...)
	created, err := client.CoreV1().Pods("demo").Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status.Phase = corev1.PodPending
	created.Status.InitContainerStatuses = []corev1.ContainerStatus{s.status()}
	if _, err := client.CoreV1().Pods("demo").UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitDeleted waits for the pod's deletion: its deletionTimestamp set (it is on a node, so the
// API server waits for the kubelet, which these tests have not, to stop it) or gone.
func waitDeleted(t *testing.T, client kubernetes.Interface, name string) {
	t.Helper()
	testwait.For(t, 30*time.Second, "pod demo/"+name+" deleted", func() error {
		p, err := client.CoreV1().Pods("demo").Get(context.Background(), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || err == nil && p.DeletionTimestamp != nil {
			return nil
		}
		return fmt.Errorf("still there (err %v)", err)
	})
}

// TestRepair: with a real API server, the repair loop of node-a deletes its pods whose
// istio-validation failed (terminated non-zero, in CrashLoopBackOff, or restarted after a
// failure), those present when it starts (list) and those that fail later (watch), and records
// a DeleteBrokenPod event naming each; it leaves alone a pod whose validation passed, one whose
// validation is still running, a failed pod on another node, and a pod the webhook did not inject.
func TestRepair(t *testing.T) {
	client, _ := startRepair(t, 100, 100)
	ctx := context.Background()
	// Before the loop lists: already broken, and left alone.
	createWithStatus(t, client, "failed", "node-a", true, stateFailed)
	createWithStatus(t, client, "passed", "node-a", true, statePassed)
	createWithStatus(t, client, "running", "node-a", true, stateRunning)
	createWithStatus(t, client, "other-node", "node-b", true, stateFailed)
	createWithStatus(t, client, "not-injected", "node-a", false, stateFailed)
	waitDeleted(t, client, "failed")
	// Through the watch.
	createWithStatus(t, client, "crashloop", "node-a", true, stateCrashLoop)
	createWithStatus(t, client, "restarted", "node-a", true, stateRestarted)
	waitDeleted(t, client, "crashloop")
	waitDeleted(t, client, "restarted")
	// A last broken pod, written after every other: once it is gone, the loop has seen all of
	// the above (a watch delivers changes in order).
	createWithStatus(t, client, "sentinel", "node-a", true, stateFailed)
	waitDeleted(t, client, "sentinel")
	for _, name := range []string{"passed", "running", "other-node", "not-injected"} {
		if p, err := client.CoreV1().Pods("demo").Get(ctx, name, metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
			t.Errorf("pod %s deleted (err %v), want it left alone", name, err)
		}
	}
	events, err := client.CoreV1().Events("demo").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, e := range events.Items {
		if e.Reason == "DeleteBrokenPod" && e.Type == corev1.EventTypeWarning && e.InvolvedObject.Kind == "Pod" {
			got[e.InvolvedObject.Name] = e.Message
		}
	}
	for _, name := range []string{"failed", "crashloop", "restarted", "sentinel"} {
		if !strings.Contains(got[name], "deleted") {
			t.Errorf("no DeleteBrokenPod event for %s (events %v)", name, got)
		}
	}
	if len(got) != 4 {
		t.Errorf("events %v, want one for each deleted pod", got)
	}
}

// TestRepairRateLimit: with a budget of one deletion and no refill in the test's time, the
// second broken pod waits: deleted only once the limiter allows it.
func TestRepairRateLimit(t *testing.T) {
	client, logs := startRepair(t, 0.001, 1)
	createWithStatus(t, client, "first", "node-a", true, stateFailed)
	waitDeleted(t, client, "first")
	createWithStatus(t, client, "second", "node-a", true, stateFailed)
	testwait.Until(t, 30*time.Second, "the loop waiting for the rate limit", func() bool {
		return strings.Contains(logs.String(), "rate limited, waiting")
	})
	if !strings.Contains(logs.String(), "pod=demo/second") {
		t.Errorf("the rate-limited pod is not named in the log:\n%s", logs)
	}
	if p, err := client.CoreV1().Pods("demo").Get(context.Background(), "second", metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
		t.Errorf("the second pod was deleted past the rate limit (err %v)", err)
	}
}

// TestRepairAfterInstall: the installer starts its repair loop only once the plugin is in
// place (a pod deleted before would start uncaptured again): while the node has no primary CNI
// configuration the broken pod stays; once it has one, the pod is deleted.
func TestRepairAfterInstall(t *testing.T) {
	client, host, token, ca := repairKube(t)
	createWithStatus(t, client, "broken", "node-a", true, stateFailed)
	root := t.TempDir()
	bin, conf := filepath.Join(root, "bin"), filepath.Join(root, "net.d")
	for _, d := range []string{bin, conf} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "plugin"), []byte("binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r, err := NewRepairer(host, token, ca, "node-a", log)
	if err != nil {
		t.Fatal(err)
	}
	in := &Installer{
		Binary: filepath.Join(root, "plugin"), BinDir: bin, ConfDir: conf, HostConfDir: "/etc/cni/net.d",
		Server: host, TokenFile: token, CAFile: ca, Interval: 10 * time.Millisecond, Repair: r, Log: log,
	}
	runUntilCleanup(t, logs, in.Run)
	testwait.Until(t, 30*time.Second, "the installer trying three times", func() bool {
		return strings.Count(logs.String(), "CNI plugin not installed") >= 3
	})
	if p, err := client.CoreV1().Pods("demo").Get(context.Background(), "broken", metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
		t.Fatalf("the pod was deleted before the plugin was installed (err %v)", err)
	}
	if strings.Contains(logs.String(), "repairing pods") {
		t.Fatal("the repair loop started before the plugin was installed")
	}
	if err := os.WriteFile(filepath.Join(conf, "10-bridge.conflist"), []byte(`{"cniVersion":"1.0.0","name":"bridge","plugins":[{"type":"bridge"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	waitDeleted(t, client, "broken")
}
