package e2e

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"sailplane.dev/e2e/framework"
)

// chromiumInstall is how to get the browser the status page is tested in.
const chromiumInstall = "apt-get update && apt-get install -y chromium"

// browser starts a headless Chromium (found by $CHROMIUM, else `chromium` on PATH) for the test:
// no sandbox (tests run as root), its profile in a temporary folder. It is killed when the test
// ends, and the test checks that none of its processes is left.
func browser(t *testing.T) context.Context {
	t.Helper()
	bin, err := exec.LookPath(cmp.Or(os.Getenv("CHROMIUM"), "chromium"))
	if err != nil {
		t.Fatalf("the status page is tested in Chromium, which was not found (%v): install it with `%s`, or set $CHROMIUM to its path", err, chromiumInstall)
	}
	profile := t.TempDir()
	opts := append(slices.Clone(chromedp.DefaultExecAllocatorOptions[:]),
		chromedp.ExecPath(bin), chromedp.NoSandbox, chromedp.UserDataDir(profile),
		chromedp.Flag("disable-dev-shm-usage", true))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx, chromedp.WithLogf(t.Logf))
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		cancel()
		cancelAlloc()
		t.Fatalf("starting %s: %v", bin, err)
	}
	t.Cleanup(func() {
		cancel()
		cancelAlloc() // kills the browser and waits for it
		framework.Eventually(t, 30*time.Second, func() error {
			if left := processesMentioning(profile); len(left) > 0 {
				return fmt.Errorf("Chromium processes left running: %v", left)
			}
			return nil
		})
	})
	return ctx
}

// processesMentioning lists the processes whose command line contains s.
func processesMentioning(s string) []string {
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var out []string
	for _, f := range cmdlines {
		b, err := os.ReadFile(f)
		if err == nil && strings.Contains(string(b), s) {
			out = append(out, filepath.Base(filepath.Dir(f)))
		}
	}
	return out
}

// pageState is what the status page shows, read in the browser from the rendered document.
type pageState struct {
	Proxies  []pageProxy `json:"proxies"`
	Problems [][]string  `json:"problems"`
	Points   int         `json:"points"`
}

type pageProxy struct {
	ID      string   `json:"id"`
	Watches []string `json:"watches"`
}

const readPage = `(() => ({
  proxies: [...document.querySelectorAll('tr.proxy')].map(r => ({
    id: r.dataset.proxy,
    watches: [...r.querySelectorAll('.watch')].map(w => w.dataset.type + ' ' + w.querySelector('.state').textContent),
  })),
  problems: [...document.querySelectorAll('tr.problem')].map(r => [...r.cells].map(c => c.textContent.trim())),
  points: document.querySelectorAll('#convergence-chart circle.push').length,
}))()`

// TestStatusPage loads hyper's status page in a real headless Chromium: it shows the proxyless
// client this test connected with its types SYNCED, the broken file's error naming file,
// resource and field, and the convergence chart with a point per push.
func TestStatusPage(t *testing.T) {
	ctx := browser(t)
	v1 := framework.StartEcho(t, "v1", "127.0.0.1:0")
	v2 := framework.StartEcho(t, "v2", "127.0.0.1:0")
	dir := t.TempDir()
	framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", meshYAML)
	framework.WriteFile(t, dir, "etc/sailplane/conf/echo/service.yaml", serviceYAML(v1, v2))
	framework.WriteFile(t, dir, "etc/sailplane/conf/echo/traffic.yaml", trafficYAML(80, 20))
	xdsAddr := framework.FreeAddr(t)
	hyper := framework.Start(t, dir, framework.Binary(t, "hyper"),
		"--xds-listen", xdsAddr, "--bus-listen", framework.FreeAddr(t), "--xds-tls-listen", framework.FreeAddr(t))
	framework.WaitReady(t, hyper)

	client := framework.XDSClient(t, xdsAddr, echoTarget)
	rpcCtx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	framework.WaitServing(rpcCtx, t, client)
	// A change pushed to the client: a point on the chart.
	framework.WriteFile(t, dir, "etc/sailplane/conf/echo/traffic.yaml", trafficYAML(50, 50))
	const broken = "etc/sailplane/conf/broken.yaml" // as hyper names it, relative to its folder
	framework.WriteFile(t, dir, broken, `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: broken, namespace: demo}
spec:
  hosts: [echo.demo.svc.cluster.local]
  http:
    - route: [{destination: {host: echo.demo.svc.cluster.local}, weight: -1}]
`)

	proxy := t.Name() + ".demo"
	url := "http://" + hyper.Monitoring + "/"
	var page pageState
	framework.Eventually(t, time.Minute, func() error {
		if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
			return fmt.Errorf("loading %s: %w", url, err)
		}
		var err error
		if page, err = chromedp.Run(ctx, chromedp.Evaluate[pageState](readPage)); err != nil {
			return fmt.Errorf("reading %s: %w", url, err)
		}
		i := slices.IndexFunc(page.Proxies, func(p pageProxy) bool { return p.ID == proxy })
		switch {
		case i < 0:
			return fmt.Errorf("the page does not show proxy %s: %+v", proxy, page.Proxies)
		case len(page.Proxies[i].Watches) == 0 || slices.ContainsFunc(page.Proxies[i].Watches, func(w string) bool { return !strings.HasSuffix(w, " SYNCED") }):
			return fmt.Errorf("proxy %s is not SYNCED for every type: %v", proxy, page.Proxies[i].Watches)
		case !slices.ContainsFunc(page.Problems, func(p []string) bool {
			return len(p) == 4 && strings.HasPrefix(p[0], broken) && p[1] == "VirtualService demo/broken" &&
				p[2] == "spec.http[0].route[0].weight" && strings.Contains(p[3], "must not be negative")
		}):
			return fmt.Errorf("the page does not show the broken file's error (file, resource, field): %q", page.Problems)
		case page.Points == 0:
			return fmt.Errorf("the convergence chart has no point")
		}
		return nil
	})
	t.Logf("proxies %+v, problems %q, %d chart points", page.Proxies, page.Problems, page.Points)
}
