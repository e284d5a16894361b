package capture

import (
	"os/exec"
	"strings"
	"testing"
)

// TestValidate runs the real `agent capture --validate` as the proxy's uid (1337) without
// capabilities, as CNI mode's validation init container: it passes in a namespace where the
// capture is installed (both backends, REDIRECT and TPROXY), and fails, saying so, where it is
// not.
func TestValidate(t *testing.T) {
	needRoot(t, "nft", "iptables-restore", "setpriv")
	bin := agentBinary(t)
	validate := func(ns *testNetns) (string, error) {
		out, err := exec.Command("ip", "netns", "exec", ns.Name, "setpriv", "--reuid=1337", "--regid=1337", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all",
			bin, "capture", "--validate", "--validate-timeout=2s").CombinedOutput()
		return string(out), err
	}
	for _, backend := range []Backend{NFTables, IPTables} {
		for _, mode := range []string{"REDIRECT", "TPROXY"} {
			t.Run(string(backend)+"/"+mode, func(t *testing.T) {
				ns := newNetns(t, "", "198.18.200.2/24")
				ns.Exec(t, bin, "capture", "--backend", string(backend), "-m", mode)
				if out, err := validate(ns); err != nil {
					t.Fatalf("validation failed with the capture installed: %v\n%s", err, out)
				}
			})
		}
	}
	t.Run("not-captured", func(t *testing.T) {
		ns := newNetns(t, "", "198.18.200.2/24")
		out, err := validate(ns)
		if err == nil || !strings.Contains(out, "the pod's traffic is not captured") {
			t.Fatalf("validation without capture: %v\n%s; want a failure saying the traffic is not captured", err, out)
		}
	})
}
