package kube

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"sailplane.dev/shared/cli"
)

// libraryLogsChild is set in the environment of the process TestLibraryLogsJSON starts: it then
// runs libraryLogs instead of the tests, against this unreachable address.
const libraryLogsChild = "SAILPLANE_TEST_LIBRARY_LOGS"

// libraryLogs sets logging up as a binary does with --log-format json, then has grpc-go (a
// client) and client-go (leader election) fail to reach addr, so that both log; it runs until
// killed.
func libraryLogs(addr string) {
	opts := cli.LogOptions{Level: "info", Format: "json"}
	log, err := opts.Logger()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	log.Info("child started")
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Error("grpc client", "error", err)
		os.Exit(2)
	}
	go func() {
		_, _ = healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	}()
	client := kubernetes.NewForConfigOrDie(&rest.Config{Host: "http://" + addr})
	leaderelection.RunOrDie(context.Background(), leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: "istio-system", Name: "child"},
			Client:     client.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: "child"},
		},
		LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
		Callbacks: leaderelection.LeaderCallbacks{OnStartedLeading: func(context.Context) {}, OnStoppedLeading: func() {}},
	})
}

// TestLibraryLogsJSON: with --log-format json, every line a process prints is JSON, client-go's
// (through klog) and grpc-go's included, each under its component.
func TestLibraryLogsJSON(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	unreachable := lis.Addr().String()
	lis.Close()

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	child := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), libraryLogsChild+"="+unreachable)
	stderr, err := child.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		lines []string
	)
	seen := map[string]bool{}
	both := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			mu.Lock()
			lines = append(lines, sc.Text())
			var line struct{ Component string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && !seen[line.Component] {
				seen[line.Component] = true
				if seen["klog"] && seen["grpc"] {
					close(both)
				}
			}
			mu.Unlock()
		}
	}()
	select {
	case <-both:
	case <-ctx.Done():
	}
	_ = child.Process.Kill()
	_ = child.Wait()

	mu.Lock()
	defer mu.Unlock()
	if !seen["klog"] || !seen["grpc"] {
		t.Errorf("components logged: %v, want klog (client-go) and grpc (grpc-go) among them", seen)
	}
	for _, l := range lines {
		if !json.Valid([]byte(l)) {
			t.Errorf("not JSON: %s", l)
		}
	}
	t.Logf("%d lines, first ones:\n%s", len(lines), strings.Join(lines[:min(len(lines), 5)], "\n"))
}
