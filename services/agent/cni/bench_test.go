package cni

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BenchmarkAdd measures what CNI mode adds to a pod's start: one CNI ADD of the real plugin
// binary for an injected pod (process start, the pod from a real API server on loopback, the
// rules installed in a fresh network namespace), per backend. Namespace set-up is not timed.
//
//	go test -run '^$' -bench Add -benchtime 30x ./services/agent/cni/
func BenchmarkAdd(b *testing.B) {
	needRoot(b)
	bin := pluginBinary(b)
	client, kubeconfig := startKube(b)
	if _, err := client.CoreV1().Pods("demo").Create(context.Background(), injectedPod("app", nil), metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	for _, backend := range []string{"nftables", "iptables"} {
		b.Run(backend, func(b *testing.B) {
			conf := netConf(b, kubeconfig, backend)
			conf["log_level"] = "warn"
			for b.Loop() {
				b.StopTimer()
				netns := newNetns(b)
				b.StartTimer()
				if out, err := (cniEnv{bin: bin, command: "ADD", netns: netns, namespace: "demo", pod: "app", conf: conf}).invoke(b); err != nil {
					b.Fatalf("ADD: %v: %s", err, out)
				}
			}
		})
	}
}
