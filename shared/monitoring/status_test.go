package monitoring

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestDebugLoopbackOnly: debug handlers answer loopback callers (IPv4 and IPv6) and refuse
// others with 403, saying how to reach them.
func TestDebugLoopbackOnly(t *testing.T) {
	h := loopbackOnly(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("secret")) }))
	for _, tc := range []struct {
		remote string
		want   int
	}{
		{"127.0.0.1:40000", http.StatusOK},
		{"[::1]:40000", http.StatusOK},
		{"10.1.2.3:40000", http.StatusForbidden},
		{"[2001:db8::1]:40000", http.StatusForbidden},
		{"not an address", http.StatusForbidden},
	} {
		req := httptest.NewRequest(http.MethodGet, "/debug/syncz", nil)
		req.RemoteAddr = tc.remote
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != tc.want {
			t.Errorf("from %s: %d, want %d", tc.remote, rec.Code, tc.want)
		}
		if rec.Code == http.StatusForbidden && (strings.Contains(rec.Body.String(), "secret") || !strings.Contains(rec.Body.String(), "port-forward")) {
			t.Errorf("from %s: refusal %q", tc.remote, rec.Body)
		}
	}
}

// TestStatusPage: the page shows the sections its sources have, and only those, with the
// proxies' states and NACK messages, the problems' file, resource and field, and one chart
// point per push; values are escaped.
func TestStatusPage(t *testing.T) {
	now := time.Now()
	all := StatusSources{
		Proxies: func() []ProxyStatus {
			return []ProxyStatus{{ID: "echo-v1.demo", Type: "proxyless", Cluster: "Kubernetes", ConnectedAt: now.Add(-time.Minute),
				Watches: []WatchStatus{
					{Type: "LDS", State: Synced, Version: "7"},
					{Type: "CDS", State: Nacked, Error: "cluster <outbound|80||a>: bad"},
				}}}
		},
		Problems: func() []ConfigProblem {
			return []ConfigProblem{{File: "/etc/conf/vs.yaml", Document: 2, Kind: "VirtualService", Namespace: "demo", Name: "echo",
				Field: "spec.http[0].route[0].weight", Message: "must not be negative, got -1"}}
		},
		GatewayAPI: func() []GatewayAPIStatus {
			return []GatewayAPIStatus{{Kind: "HTTPRoute", Namespace: "demo", Name: "web", OK: false,
				Conditions: []string{"parent demo/gw: Accepted=True (Accepted)", "parent demo/gw: ResolvedRefs=False (BackendNotFound): backend <x> not found"}}}
		},
		Pushes: func() []PushTiming {
			return []PushTiming{
				{Proxy: "echo-v1.demo", Done: now.Add(-2 * time.Second), Convergence: 12 * time.Millisecond},
				{Proxy: "echo-v2.demo", Done: now.Add(-time.Second), Convergence: 1500 * time.Millisecond},
				{Proxy: "echo-v2.demo", Done: now, Convergence: 40 * time.Millisecond, Failed: true},
			}
		},
	}
	render := func(s StatusSources) string {
		rec := httptest.NewRecorder()
		(&statusPage{title: "test <plane>", sources: s, endpoints: []string{"/debug/syncz"}}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/html") {
			t.Fatalf("status %d, content type %q", rec.Code, rec.Header().Get("Content-Type"))
		}
		return rec.Body.String()
	}

	page := render(all)
	for _, want := range []string{
		"test &lt;plane&gt;", `http-equiv="refresh"`,
		`data-proxy="echo-v1.demo"`, `<span class="state SYNCED">SYNCED</span>`, `<span class="state NACKED">NACKED</span>`,
		"cluster &lt;outbound|80||a&gt;: bad",
		"/etc/conf/vs.yaml", "(document 2)", "VirtualService demo/echo", "spec.http[0].route[0].weight", "must not be negative, got -1",
		`id="gateway-api"`, `<tr class="problem"><td>HTTPRoute</td><td>demo/web</td>`, "parent demo/gw: ResolvedRefs=False (BackendNotFound): backend &lt;x&gt; not found",
		`<svg id="convergence-chart"`, "3 pushes, 1 failed, slowest 1.5s", `<a href="/debug/syncz?pretty">`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q:\n%s", want, page)
		}
	}
	if n := strings.Count(page, "<circle"); n != 3 {
		t.Errorf("%d chart points, want 3", n)
	}
	if strings.Contains(page, "<script") {
		t.Error("the page has a script")
	}

	onlyProblems := render(StatusSources{Problems: func() []ConfigProblem { return nil }})
	if strings.Contains(onlyProblems, `id="proxies"`) || strings.Contains(onlyProblems, `id="convergence"`) || strings.Contains(onlyProblems, `id="gateway-api"`) || !strings.Contains(onlyProblems, "No config problem.") {
		t.Errorf("a page with only problems, none:\n%s", onlyProblems)
	}
	noPush := render(StatusSources{Pushes: func() []PushTiming { return nil }})
	if !strings.Contains(noPush, "No push yet.") || strings.Contains(noPush, "<svg") {
		t.Errorf("a chart without pushes:\n%s", noPush)
	}
}

// TestChartScale: convergence times are placed on a log scale whose decades span them with
// room (no point on the plot's edge), time across; a slower push is higher, a later one
// further right.
func TestChartScale(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := newChart([]PushTiming{
		{Done: t0.Add(2 * time.Second), Convergence: 2 * time.Second}, // given out of order
		{Done: t0, Convergence: 15 * time.Millisecond},
		{Done: t0.Add(time.Second), Convergence: 0},
	})
	var labels []string
	for _, tk := range c.YTicks {
		labels = append(labels, tk.Label)
	}
	if got := strings.Join(labels, " "); got != "10µs 100µs 1ms 10ms 100ms 1s 10s" {
		t.Errorf("y ticks %q", got)
	}
	p := c.Points
	if len(p) != 3 || p[0].X != c.Left || p[2].X != c.Right {
		t.Fatalf("points %+v in [%v,%v]x[%v,%v]", p, c.Left, c.Right, c.Top, c.Bottom)
	}
	if !(p[2].Y < p[0].Y && p[0].Y < p[1].Y) || p[2].Y <= c.Top || p[1].Y >= c.Bottom {
		t.Errorf("2s at y=%v, 15ms at %v, 0 at %v: want higher for slower, inside the plot", p[2].Y, p[0].Y, p[1].Y)
	}
}
