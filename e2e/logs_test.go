package e2e

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"sailplane.dev/e2e/framework"
)

// TestLogFormatJSON: with --log-format json, every line a real binary prints is JSON, from its
// start to its exit, client-go's (through klog) and grpc-go's included: endpoint-watcher with an
// API server and a config bus that do not answer, at debug so that client-go's retries show.
func TestLogFormatJSON(t *testing.T) {
	dir := t.TempDir()
	framework.WriteFile(t, dir, "kubeconfig", fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://%s", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, framework.FreeAddr(t)))
	p := framework.Start(t, dir, framework.Binary(t, "endpoint-watcher"),
		"--log-format=json", "--log-level=debug", "--kubernetes=on", "--kubeconfig="+dir+"/kubeconfig",
		"--config-bus="+framework.FreeAddr(t), "--bus-listen=127.0.0.1:0")

	components := func() map[string]bool {
		seen := map[string]bool{}
		for l := range strings.Lines(p.Log()) {
			var line struct{ Component string }
			if json.Unmarshal([]byte(l), &line) == nil {
				seen[line.Component] = true
			}
		}
		return seen
	}
	framework.Eventually(t, 2*time.Minute, func() error {
		if seen := components(); !seen["klog"] || !seen["grpc"] {
			return fmt.Errorf("components logged so far: %v, want klog (client-go) and grpc (grpc-go)", seen)
		}
		return nil
	})
	p.Stop()
	out := p.Log()
	for l := range strings.Lines(out) {
		if !json.Valid([]byte(l)) {
			t.Errorf("not JSON: %s", l)
		}
	}
	t.Logf("%d lines", strings.Count(out, "\n"))

	// A binary that fails after its flags are parsed says why in JSON too.
	fail, err := exec.Command(framework.Binary(t, "endpoint-watcher"), "--log-format=json", "--kubernetes=maybe").CombinedOutput()
	var exit struct{ Msg, Error string }
	if err == nil || json.Unmarshal(fail, &exit) != nil || !strings.Contains(exit.Error, "--kubernetes") {
		t.Errorf("a failed start printed %q (%v), want one JSON line naming --kubernetes", fail, err)
	}
}
