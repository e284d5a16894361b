package loadgen

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// GatewayAPI is the Gateway API config of the gateway scenario: Gateways Gateways of class
// istio in the mesh's namespace, each with one HTTP listener on port 80, and Routes
// HTTPRoutes spread over them (route i on Gateway i mod Gateways), each in its own file, to
// the mesh's services (route i to service i mod Services): the ServiceEntries are the
// backends, files mode having no Kubernetes Services.
type GatewayAPI struct {
	Gateways int
	Routes   int
}

// GatewayNameLabel labels a gateway pod with its Gateway's name (istiod's automated deployment);
// the Istio Gateways translated from a Gateway select by it.
const GatewayNameLabel = "gateway.networking.k8s.io/gateway-name"

// GatewayName is the name of Gateway j.
func GatewayName(j int) string { return fmt.Sprintf("gw-%d", j) }

// GatewayOf is the Gateway route i is attached to.
func (g GatewayAPI) GatewayOf(route int) int { return route % g.Gateways }

// RouteFile is the file of route i, relative to the config folder's conf/.
func RouteFile(i int) string { return fmt.Sprintf("httproute-%04d.yaml", i) }

// RoutePath is the path prefix route i matches: marker (empty at first) makes an edit's
// value, which shows up in the RDS of the route's gateway.
func RoutePath(i int, marker string) string {
	if marker == "" {
		return fmt.Sprintf("/r-%d", i)
	}
	return fmt.Sprintf("/r-%d-%s", i, marker)
}

// RouteYAML is HTTPRoute i, matching RoutePath(i, marker).
func (g GatewayAPI) RouteYAML(m Mesh, i int, marker string) string {
	return fmt.Sprintf(`apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r-%d, namespace: %s}
spec:
  parentRefs: [{name: %s}]
  hostnames: [r-%d.example.com]
  rules:
    - matches: [{path: {type: PathPrefix, value: %q}}]
      backendRefs: [{name: svc-%d, port: %d}]
`, i, m.Namespace, GatewayName(g.GatewayOf(i)), i, RoutePath(i, marker), i%m.Services, ServicePort)
}

// Write creates dir/conf/gateways.yaml and one file per route; the mesh is written apart.
func (g GatewayAPI) Write(dir string, m Mesh) error {
	var b strings.Builder
	for j := range g.Gateways {
		fmt.Fprintf(&b, `apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: %s, namespace: %s}
spec:
  gatewayClassName: istio
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
`, GatewayName(j), m.Namespace)
	}
	if err := os.WriteFile(filepath.Join(dir, "conf", "gateways.yaml"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	for i := range g.Routes {
		if err := os.WriteFile(filepath.Join(dir, "conf", RouteFile(i)), []byte(g.RouteYAML(m, i, "")), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// Memory is the serving process's memory as its /metrics reports it.
type Memory struct {
	HeapInuse float64 `json:"go_heap_inuse_bytes"`
	RSS       float64 `json:"rss_bytes"`
}

// GatewayResult is one gateway scenario's measurements.
type GatewayResult struct {
	Topology  string    `json:"topology"`
	Delta     bool      `json:"delta"`
	Gateways  int       `json:"gateways"`
	Routes    int       `json:"http_routes"`
	Services  int       `json:"services"`
	Endpoints int       `json:"endpoints_per_service"`
	Date      time.Time `json:"date"`

	StartupSeconds float64 `json:"startup_s"`
	// AllConnectedSeconds is from the first gateway proxy starting until every one holds the
	// routes of its Gateway, backends resolved to the services' clusters, ACKed.
	AllConnectedSeconds float64 `json:"all_connected_s"`
	Connect             Latency `json:"connect"`
	Failed              int     `json:"failed_proxies"`
	// RouteEdit is, per edit, from the HTTPRoute file's rename to the affected gateway proxy
	// receiving (and ACKing) the RDS that holds the edit.
	RouteEdit Latency `json:"route_edit"`
	Edits     int     `json:"edits"`
	// AffectedResponses counts the responses the edited routes' gateway proxies got during
	// the edits (all types); UnaffectedResponses those the other proxies got, and
	// UnaffectedPushed the (edit, other proxy) pairs that got anything.
	AffectedResponses   int64 `json:"affected_responses"`
	UnaffectedResponses int64 `json:"unaffected_responses"`
	UnaffectedPushed    int   `json:"unaffected_proxies_pushed"`
	// Memory of the serving process after the connect storm and after the edits.
	Memory     map[string]Memory `json:"memory"`
	Usage      map[string]Usage  `json:"usage"`
	XDSProcess string            `json:"xds_process"`
	Phases     map[string]Phase  `json:"phases"`
}

// quietWindow is how long no proxy may receive anything before an edit counts as finished:
// xds-server pushes the proxies an edit touches together, so stray pushes to unaffected
// gateways arrive within it.
const quietWindow = 300 * time.Millisecond

// RunGateways runs the gateway scenario: the mesh, the Gateway API config of g, one router
// proxy per Gateway (labelled as its automated deployment's pods are), then Changes edits of
// one HTTPRoute each (default 40), each waited for at its gateway proxy.
func (s Scenario) RunGateways(ctx context.Context, g GatewayAPI) (*GatewayResult, error) {
	log := cmp.Or(s.Logger, slog.New(slog.DiscardHandler))
	s.Changes = cmp.Or(s.Changes, 40)
	s.Proxies = g.Gateways // names the profiles
	s.PhaseTimeout = cmp.Or(s.PhaseTimeout, 5*time.Minute)
	s.Mesh.Namespace = cmp.Or(s.Mesh.Namespace, "load")
	if s.Mesh.Services <= 0 || s.Mesh.Endpoints <= 0 || g.Gateways <= 0 || g.Routes < g.Gateways {
		return nil, fmt.Errorf("%w: need services, endpoints, gateways and at least one route per gateway", ErrScenario)
	}
	dir := s.ConfigDir
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "loadgen-gw-"); err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
	}
	dir, _ = filepath.Abs(dir)
	if err := s.Mesh.Write(dir); err != nil {
		return nil, err
	}
	if err := g.Write(dir, s.Mesh); err != nil {
		return nil, err
	}
	res := &GatewayResult{Topology: s.Topology, Delta: s.Delta, Gateways: g.Gateways, Routes: g.Routes,
		Services: s.Mesh.Services, Endpoints: s.Mesh.Endpoints, Date: time.Now().UTC(),
		Memory: map[string]Memory{}, Usage: map[string]Usage{}, Phases: map[string]Phase{}}

	start := time.Now()
	cp, err := s.launch(ctx, dir)
	if err != nil {
		return nil, err
	}
	defer cp.stop()
	procs, addr, server := cp.procs, cp.addr, cp.server()
	if server != nil {
		res.XDSProcess = server.Name
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wait := func(phase string, done <-chan struct{}) error { return cp.wait(ctx, phase, done) }
	res.StartupSeconds = time.Since(start).Seconds()
	log.Info("control plane ready", "took", time.Since(start).Round(time.Millisecond))

	shared := NewShared()
	meter := &meter{procs: procs, shared: shared}
	memory := func(phase string) {
		if server == nil || server.Metrics == "" {
			return
		}
		m, err := ScrapeMemory(ctx, server.Metrics)
		if err != nil {
			log.Warn("memory not read", "phase", phase, "err", err)
			return
		}
		res.Memory[phase] = m
	}
	finish := func() {
		for _, p := range procs {
			if u, err := ReadUsage(p.Pid()); err == nil {
				res.Usage[p.Name] = u
			}
		}
	}

	// Connect: every gateway proxy must get its Gateway's last route with its backend's
	// cluster, which shows the routes translated, bound and resolved.
	proxies := make([]*Proxy, g.Gateways)
	connected := make([]*Marker, g.Gateways)
	for j := range proxies {
		proxies[j] = NewProxy(ProxyConfig{Addr: addr, Delta: s.Delta, Index: j, Namespace: s.Mesh.Namespace,
			IP: ProxyIP(s.Mesh.Services*s.Mesh.Endpoints + j), Labels: map[string]string{GatewayNameLabel: GatewayName(j)},
			Router: true, Shared: shared, Logger: log, SourceIP: SourceIP(addr, j)})
		last := j + (g.Routes-1-j)/g.Gateways*g.Gateways
		connected[j] = shared.NewMarker(RouteType, "", s.Mesh.Cluster(last%s.Mesh.Services), []*Proxy{proxies[j]})
		connected[j].Begin()
	}
	var wg sync.WaitGroup
	var failedMu sync.Mutex
	meter.begin()
	stormStart := time.Now()
	for _, p := range proxies {
		wg.Go(func() {
			if err := p.Run(ctx); err != nil {
				failedMu.Lock()
				res.Failed++
				failedMu.Unlock()
				log.Warn("proxy failed", "node", p.NodeID(), "err", err)
			}
		})
	}
	defer wg.Wait()
	defer cancel()
	allConnected := make(chan struct{})
	go func() {
		defer close(allConnected)
		for j, p := range proxies {
			for _, ch := range []<-chan struct{}{p.Synced(), connected[j].Done()} {
				select {
				case <-ch:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	stormErr := wait("gateway proxies connected", allConnected)
	res.AllConnectedSeconds = time.Since(stormStart).Seconds()
	var lat []time.Duration
	missing := 0
	for j, m := range connected {
		l, miss := m.Latencies()
		shared.Remove(m)
		if _, ok := proxies[j].SyncedAfter(); !ok {
			miss = 1
		}
		lat, missing = append(lat, l...), missing+miss
	}
	res.Connect = summarize(lat, missing)
	res.Phases["connect"] = meter.end()
	if stormErr != nil {
		finish()
		return res, stormErr
	}
	// The route naming a cluster proves little unless the gateway has that cluster.
	for j, p := range proxies {
		last := j + (g.Routes-1-j)/g.Gateways*g.Gateways
		if c := s.Mesh.Cluster(last % s.Mesh.Services); !p.Watching(EndpointType, c) {
			finish()
			return res, fmt.Errorf("%w: gateway proxy %s routes to %s but has no such cluster", ErrScenario, p.NodeID(), c)
		}
	}
	if err := waitQuiet(ctx, shared, s.PhaseTimeout); err != nil {
		return res, err
	}
	memory("after_connect")
	log.Info("gateway proxies connected", "took", time.Since(stormStart).Round(time.Millisecond))

	// Edits: one HTTPRoute file at a time, spread over the routes and so the Gateways.
	meter.begin()
	stopProfile := s.cpuProfile(ctx, "route_edit")
	defer stopProfile()
	var editLat []time.Duration
	editMissing := 0
	for n := range s.Changes {
		route := (n * 37) % g.Routes
		gw := g.GatewayOf(route)
		marker := fmt.Sprintf("e%d-%d", n, start.UnixNano())
		before := make([]int64, len(proxies))
		for j, p := range proxies {
			before[j] = p.Responses()
		}
		m := shared.NewMarker(RouteType, "", RoutePath(route, marker), []*Proxy{proxies[gw]})
		m.Begin()
		if err := WriteAtomic(dir, RouteFile(route), g.RouteYAML(s.Mesh, route, marker)); err != nil {
			return res, err
		}
		err := wait("HTTPRoute edit", m.Done())
		l, miss := m.Latencies()
		shared.Remove(m)
		editLat, editMissing = append(editLat, l...), editMissing+miss
		if err == nil {
			err = waitQuiet(ctx, shared, s.PhaseTimeout)
		}
		for j, p := range proxies {
			d := p.Responses() - before[j]
			switch {
			case j == gw:
				res.AffectedResponses += d
			case d > 0:
				res.UnaffectedResponses += d
				res.UnaffectedPushed++
			}
		}
		res.Edits++
		if err != nil {
			res.RouteEdit = summarize(editLat, editMissing)
			finish()
			return res, err
		}
		log.Debug("HTTPRoute edit", "n", n, "route", route, "took", l)
	}
	res.RouteEdit = summarize(editLat, editMissing)
	res.Phases["route_edit"] = meter.end()
	memory("after_edits")
	s.profile(ctx, "heap", "heap-gateways.pprof")
	finish()
	return res, nil
}

// waitQuiet waits until no proxy received anything for quietWindow, at most timeout.
func waitQuiet(ctx context.Context, shared *Shared, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	last, since := shared.Responses.Load(), time.Now()
	t := time.NewTicker(quietWindow / 10)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		if n := shared.Responses.Load(); n != last {
			last, since = n, time.Now()
		} else if time.Since(since) >= quietWindow {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: proxies still receiving pushes after %s", ErrScenario, timeout)
		}
	}
}

// ScrapeMemory reads the Go heap in use and the resident set size from a Prometheus
// /metrics endpoint at addr.
func ScrapeMemory(ctx context.Context, addr string) (Memory, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return Memory{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return Memory{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Memory{}, fmt.Errorf("loadgen: GET %s/metrics: %s", addr, resp.Status)
	}
	return parseMemory(resp.Body)
}

// parseMemory reads go_memstats_heap_inuse_bytes and process_resident_memory_bytes from the
// Prometheus text format.
func parseMemory(r io.Reader) (Memory, error) {
	var m Memory
	found := map[string]bool{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		var dst *float64
		switch name {
		case "go_memstats_heap_inuse_bytes":
			dst = &m.HeapInuse
		case "process_resident_memory_bytes":
			dst = &m.RSS
		default:
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return m, fmt.Errorf("loadgen: metric %s: %w", name, err)
		}
		*dst, found[name] = v, true
	}
	if err := sc.Err(); err != nil {
		return m, err
	}
	if len(found) != 2 {
		return m, fmt.Errorf("loadgen: /metrics lacks go_memstats_heap_inuse_bytes or process_resident_memory_bytes")
	}
	return m, nil
}

// WriteGatewayTable prints gateway results, one column per run.
func WriteGatewayTable(w io.Writer, rs []*GatewayResult) error {
	var b strings.Builder
	row := func(name string, f func(r *GatewayResult) string) {
		fmt.Fprintf(&b, "%-38s", name)
		for _, r := range rs {
			fmt.Fprintf(&b, "  %28s", f(r))
		}
		b.WriteByte('\n')
	}
	mib := func(v float64) string { return fmt.Sprintf("%.0f MiB", v/(1<<20)) }
	row("run", func(r *GatewayResult) string {
		if r.Delta {
			return r.Topology + "/delta"
		}
		return r.Topology + "/sotw"
	})
	row("gateways / HTTPRoutes / services", func(r *GatewayResult) string {
		return fmt.Sprintf("%d / %d / %d", r.Gateways, r.Routes, r.Services)
	})
	row("control plane startup", func(r *GatewayResult) string { return fmt.Sprintf("%.3f s", r.StartupSeconds) })
	row("all gateways connected + routes", func(r *GatewayResult) string { return fmt.Sprintf("%.3f s", r.AllConnectedSeconds) })
	row("  not synced / failed", func(r *GatewayResult) string { return fmt.Sprintf("%d / %d", r.Connect.Missing, r.Failed) })
	row("HTTPRoute edit → ACK p50 / p99", func(r *GatewayResult) string {
		return fmt.Sprintf("%.3f / %.3f s", r.RouteEdit.P50, r.RouteEdit.P99)
	})
	row("  min / max (missing)", func(r *GatewayResult) string {
		return fmt.Sprintf("%.3f / %.3f s (%d)", r.RouteEdit.Min, r.RouteEdit.Max, r.RouteEdit.Missing)
	})
	row("  edits; responses to affected proxy", func(r *GatewayResult) string {
		return fmt.Sprintf("%d; %d", r.Edits, r.AffectedResponses)
	})
	row("  unaffected proxies pushed (responses)", func(r *GatewayResult) string {
		return fmt.Sprintf("%d (%d)", r.UnaffectedPushed, r.UnaffectedResponses)
	})
	for _, phase := range []string{"after_connect", "after_edits"} {
		row("Go heap in use / RSS, "+strings.ReplaceAll(phase, "_", " "), func(r *GatewayResult) string {
			m, ok := r.Memory[phase]
			if !ok {
				return "—"
			}
			return mib(m.HeapInuse) + " / " + mib(m.RSS)
		})
	}
	row("peak RSS (VmHWM)", func(r *GatewayResult) string {
		u, ok := r.Usage[r.XDSProcess]
		if !ok {
			return "—"
		}
		return mib(float64(u.PeakRSS))
	})
	row("CPU s: server / loadgen during edits", func(r *GatewayResult) string {
		ph := r.Phases["route_edit"]
		return fmt.Sprintf("%.2f / %.2f", ph.CPUSeconds[r.XDSProcess], ph.CPUSeconds[self])
	})
	_, err := io.WriteString(w, b.String())
	return err
}
