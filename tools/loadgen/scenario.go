package loadgen

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// Topologies the scenario can start.
const (
	TopologyHyper    = "hyper"
	TopologyMicro    = "microservices"
	TopologyExternal = "external"
)

// ErrScenario reports a scenario that could not run to the end.
var ErrScenario = errors.New("loadgen: scenario failed")

// Scenario is one bounded benchmark run: start the control plane, connect Proxies sidecars,
// then change a VirtualService and an endpoint Changes times each.
type Scenario struct {
	// Topology is hyper, microservices (config-ingest + endpoint-watcher + xds-server) or
	// external (XDS and ConfigDir name a control plane started by someone else).
	Topology string
	// Bin holds the binaries (make build).
	Bin string
	// XDS is the external control plane's address.
	XDS string
	// ConfigDir is where the config is written; default a temporary folder. The external
	// control plane must read ConfigDir/conf.
	ConfigDir string
	Mesh      Mesh
	Proxies   int
	Delta     bool
	// Ramp is connections opened per second; 0 opens them all at once.
	Ramp float64
	// Changes is how many VirtualService and endpoint changes are measured; default 3.
	Changes int
	// PhaseTimeout bounds each phase; default 5 minutes.
	PhaseTimeout time.Duration
	// XDSServers is how many xds-server processes the microservices topology starts (default
	// 1), all on the same buses; proxy i connects to server i mod XDSServers. Two stand for the
	// Deployment topology (two replicas behind one Service, proxies balanced), one per node for
	// the node-local one (deploy/node-local: each serves only its node's proxies).
	XDSServers int
	// ServerArgs are appended to the xds-server's (or hyper's) command line.
	ServerArgs []string
	// Pprof is the xds-server's --pprof-addr (pass it in ServerArgs too): when set, a CPU
	// profile of the connect storm and heap profiles after each phase go to ProfileDir.
	Pprof          string
	ProfileDir     string
	ProfileSeconds int
	Logger         *slog.Logger
}

// Latency summarises per-proxy convergence times, in seconds.
type Latency struct {
	Samples int     `json:"samples"`
	Missing int     `json:"missing"`
	Min     float64 `json:"min_s"`
	P50     float64 `json:"p50_s"`
	P90     float64 `json:"p90_s"`
	P99     float64 `json:"p99_s"`
	Max     float64 `json:"max_s"`
}

func summarize(lat []time.Duration, missing int) Latency {
	slices.Sort(lat)
	return Latency{Samples: len(lat), Missing: missing, Min: Percentile(lat, 0).Seconds(), P50: Percentile(lat, .5).Seconds(),
		P90: Percentile(lat, .9).Seconds(), P99: Percentile(lat, .99).Seconds(), Max: Percentile(lat, 1).Seconds()}
}

// Phase is what one phase cost.
type Phase struct {
	Seconds    float64            `json:"seconds"`
	CPUSeconds map[string]float64 `json:"cpu_seconds"`
	BytesSent  int64              `json:"bytes_sent"`
	Responses  int64              `json:"responses"`
}

// Result is one scenario's measurements.
type Result struct {
	Topology  string    `json:"topology"`
	Proxies   int       `json:"proxies"`
	Delta     bool      `json:"delta"`
	Services  int       `json:"services"`
	Endpoints int       `json:"endpoints_per_service"`
	Ramp      float64   `json:"ramp_per_second"`
	Date      time.Time `json:"date"`

	// StartupSeconds is from starting the control plane to a probe proxy holding the mesh.
	StartupSeconds float64 `json:"startup_s"`
	// AllConnectedSeconds is from the first proxy starting to every proxy holding its whole
	// initial config (CDS, EDS of every cluster, LDS, RDS of every route), ACKed.
	AllConnectedSeconds float64 `json:"all_connected_s"`
	Connect             Latency `json:"connect"`
	Failed              int     `json:"failed_proxies"`
	VirtualService      Latency `json:"virtual_service_change"`
	Endpoint            Latency `json:"endpoint_change"`

	Phases map[string]Phase `json:"phases"`
	// Usage is per process at the end: CPU seconds since start and peak RSS.
	Usage map[string]Usage `json:"usage"`
	// XDSProcess names the process serving xDS (hyper or xds-server).
	XDSProcess string `json:"xds_process"`
	// XDSServers is how many xds-server processes served the proxies (microservices).
	XDSServers int   `json:"xds_servers,omitempty"`
	BytesSent  int64 `json:"bytes_sent"`
	// Retries counts streams the proxies opened again after one ended before its first
	// response; Refused those the server refused as overloaded (admission control).
	Retries int64 `json:"stream_retries"`
	Refused int64 `json:"refused_overloaded"`
}

// Run runs the scenario; it stops by itself, on error or when ctx ends.
func (s Scenario) Run(ctx context.Context) (*Result, error) {
	log := cmp.Or(s.Logger, slog.New(slog.DiscardHandler))
	s.Changes = cmp.Or(s.Changes, 3)
	s.PhaseTimeout = cmp.Or(s.PhaseTimeout, 5*time.Minute)
	s.Mesh.Namespace = cmp.Or(s.Mesh.Namespace, "load")
	if s.Mesh.Services <= 0 || s.Mesh.Endpoints <= 0 || s.Proxies <= 0 {
		return nil, fmt.Errorf("%w: need services, endpoints and proxies", ErrScenario)
	}
	dir := s.ConfigDir
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "loadgen-"); err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
	}
	dir, _ = filepath.Abs(dir)
	// Leftover markers from an earlier run would change what the control plane starts with.
	for _, f := range []string{"loadgen-vs.yaml", "loadgen-ep.yaml"} {
		_ = os.Remove(filepath.Join(dir, "conf", f))
	}
	if err := s.Mesh.Write(dir); err != nil {
		return nil, err
	}
	res := &Result{Topology: s.Topology, Proxies: s.Proxies, Delta: s.Delta, Services: s.Mesh.Services,
		Endpoints: s.Mesh.Endpoints, Ramp: s.Ramp, Date: time.Now().UTC(), Phases: map[string]Phase{},
		Usage: map[string]Usage{}}

	start := time.Now()
	cp, err := s.launch(ctx, dir)
	if err != nil {
		return nil, err
	}
	defer cp.stop()
	procs, addrs := cp.procs, cp.addrs
	if s.Topology == TopologyMicro {
		res.XDSServers = len(addrs)
	}
	if server := cp.server(); server != nil {
		res.XDSProcess = server.Name
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wait := func(phase string, done <-chan struct{}) error { return cp.wait(ctx, phase, done) }
	res.StartupSeconds = time.Since(start).Seconds()
	log.Info("control plane ready", "took", time.Since(start).Round(time.Millisecond))

	shared := NewShared()
	meter := &meter{procs: procs, shared: shared}
	meter.begin()

	// Connect storm.
	proxies := make([]*Proxy, s.Proxies)
	for i := range proxies {
		addr := addrs[i%len(addrs)]
		proxies[i] = NewProxy(ProxyConfig{Addr: addr, Delta: s.Delta, Index: i, Namespace: s.Mesh.Namespace,
			IP: s.Mesh.IPOf(i), Labels: s.Mesh.Labels(i), Shared: shared, Logger: log, SourceIP: SourceIP(addr, i)})
	}
	var wg sync.WaitGroup
	var failedMu sync.Mutex
	failed := 0
	allSynced := make(chan struct{})
	stormStart := time.Now()
	go func() {
		defer close(allSynced)
		for _, p := range proxies {
			select {
			case <-p.Synced():
			case <-ctx.Done():
				return
			}
		}
	}()
	stopProfile := s.cpuProfile(ctx, "connect")
	wg.Go(func() {
		var tick *time.Ticker
		if s.Ramp > 0 {
			tick = time.NewTicker(time.Duration(float64(time.Second) / s.Ramp))
			defer tick.Stop()
		}
		for _, p := range proxies {
			if tick != nil {
				select {
				case <-tick.C:
				case <-ctx.Done():
					return
				}
			}
			wg.Go(func() {
				if err := p.Run(ctx); err != nil {
					failedMu.Lock()
					failed++
					failedMu.Unlock()
					log.Warn("proxy failed", "node", p.NodeID(), "err", err)
				}
			})
		}
	})
	defer wg.Wait()
	defer cancel()
	stormErr := wait("connect storm", allSynced)
	res.AllConnectedSeconds = time.Since(stormStart).Seconds()
	var lat []time.Duration
	missing := 0
	for _, p := range proxies {
		if d, ok := p.SyncedAfter(); ok {
			lat = append(lat, d)
		} else {
			missing++
		}
	}
	res.Connect = summarize(lat, missing)
	res.Phases["connect"] = meter.end()
	stopProfile()
	s.profile(ctx, "heap", fmt.Sprintf("heap-connect-%d.pprof", s.Proxies))
	log.Info("connect storm", "all_synced", time.Since(stormStart).Round(time.Millisecond), "missing", missing,
		"retries", shared.Retries.Load(), "refused_overloaded", shared.Refused.Load())
	if stormErr != nil {
		s.finish(res, procs, shared, &failedMu, &failed)
		return res, stormErr
	}

	// VirtualService changes: a header value in the route of service 0.
	meter.begin()
	stopProfile = s.cpuProfile(ctx, "virtual_service")
	var vsLat []time.Duration
	vsMissing := 0
	for n := range s.Changes {
		value := fmt.Sprintf("loadgen-%d-%d", start.UnixNano(), n)
		routeName := itoa(ServicePort)
		m := shared.NewMarker(RouteType, routeName, value, watching(proxies, RouteType, routeName))
		m.Begin()
		if err := WriteAtomic(dir, "loadgen-vs.yaml", s.Mesh.RouteMarkerYAML(0, value)); err != nil {
			return nil, err
		}
		err := wait("VirtualService change", m.Done())
		l, miss := m.Latencies()
		shared.Remove(m)
		vsLat, vsMissing = append(vsLat, l...), vsMissing+miss
		if err != nil {
			res.VirtualService = summarize(vsLat, vsMissing)
			s.finish(res, procs, shared, &failedMu, &failed)
			return res, err
		}
		log.Info("VirtualService change", "n", n, "p99", Percentile(l, .99))
	}
	res.VirtualService = summarize(vsLat, vsMissing)
	res.Phases["virtual_service"] = meter.end()
	stopProfile()

	// Endpoint changes: one more workload for a different service each time.
	meter.begin()
	stopProfile = s.cpuProfile(ctx, "endpoint")
	var epLat []time.Duration
	epMissing := 0
	for n := range s.Changes {
		svc := (1 + n*7) % s.Mesh.Services
		ip := MarkerIP(n)
		cluster := s.Mesh.Cluster(svc)
		m := shared.NewMarker(EndpointType, cluster, ip, watching(proxies, EndpointType, cluster))
		m.Begin()
		if err := WriteAtomic(dir, "loadgen-ep.yaml", s.Mesh.EndpointMarkerYAML(svc, ip)); err != nil {
			return nil, err
		}
		err := wait("endpoint change", m.Done())
		l, miss := m.Latencies()
		shared.Remove(m)
		epLat, epMissing = append(epLat, l...), epMissing+miss
		if err != nil {
			res.Endpoint = summarize(epLat, epMissing)
			s.finish(res, procs, shared, &failedMu, &failed)
			return res, err
		}
		log.Info("endpoint change", "n", n, "p99", Percentile(l, .99))
	}
	res.Endpoint = summarize(epLat, epMissing)
	res.Phases["endpoint"] = meter.end()
	stopProfile()
	s.profile(ctx, "heap", fmt.Sprintf("heap-end-%d.pprof", s.Proxies))
	s.finish(res, procs, shared, &failedMu, &failed)
	return res, nil
}

func (s Scenario) finish(res *Result, procs []*Process, shared *Shared, mu *sync.Mutex, failed *int) {
	for _, p := range procs {
		if u, err := ReadUsage(p.Pid()); err == nil {
			res.Usage[p.Name] = u
		}
	}
	res.BytesSent = shared.BytesReceived.Load()
	res.Retries, res.Refused = shared.Retries.Load(), shared.Refused.Load()
	mu.Lock()
	res.Failed = *failed
	mu.Unlock()
}

// cpuProfile profiles the xds-server for ProfileSeconds from now; the returned func waits for
// the profile to be saved (the phase's measurements are taken before).
func (s Scenario) cpuProfile(ctx context.Context, phase string) func() {
	if s.Pprof == "" {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.profile(ctx, fmt.Sprintf("profile?seconds=%d", max(s.ProfileSeconds, 1)),
			fmt.Sprintf("cpu-%s-%d.pprof", phase, s.Proxies))
	}()
	return func() { <-done }
}

// profile saves one pprof endpoint's output; failures are logged, never fatal.
func (s Scenario) profile(ctx context.Context, what, file string) {
	if s.Pprof == "" {
		return
	}
	log := cmp.Or(s.Logger, slog.New(slog.DiscardHandler))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.Pprof+"/debug/pprof/"+what, nil)
	if err != nil {
		return
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Warn("profile", "what", what, "err", err)
		return
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil {
		err = os.WriteFile(filepath.Join(cmp.Or(s.ProfileDir, "."), file), b, 0o644)
	}
	if err != nil {
		log.Warn("profile", "what", what, "err", err)
	}
}

func watching(ps []*Proxy, typeURL, name string) []*Proxy {
	var out []*Proxy
	for _, p := range ps {
		if p.Watching(typeURL, name) {
			out = append(out, p)
		}
	}
	return out
}

// controlPlane is a started control plane: its processes (the one serving xDS last) and the
// waits of the scenario's phases, which fail as soon as one of the processes exits.
type controlPlane struct {
	procs   []*Process // none for an external control plane
	addr    string     // where it serves xDS (the first xds-server's address)
	addrs   []string   // every xds-server's
	dir     string
	timeout time.Duration
	exited  chan struct{}
	once    sync.Once
}

// launch starts the control plane of the topology on the config of dir and waits until a
// probe proxy sees the whole mesh.
func (s Scenario) launch(ctx context.Context, dir string) (*controlPlane, error) {
	procs, addrs, err := s.start(ctx, dir)
	cp := &controlPlane{procs: procs, addrs: addrs, dir: dir, timeout: s.PhaseTimeout, exited: make(chan struct{})}
	if err != nil {
		cp.stop()
		return nil, err
	}
	for _, p := range procs {
		go func() {
			select {
			case <-p.Exited():
				cp.once.Do(func() { close(cp.exited) })
			case <-cp.exited:
			}
		}()
	}
	if len(addrs) > 0 {
		cp.addr = addrs[0]
	}
	for _, addr := range addrs {
		if err := s.waitMesh(ctx, addr, func(phase string, done <-chan struct{}) error { return cp.wait(ctx, phase, done) }); err != nil {
			cp.stop()
			return nil, err
		}
	}
	return cp, nil
}

// server is the process serving xDS, nil for an external control plane.
func (cp *controlPlane) server() *Process {
	if len(cp.procs) == 0 {
		return nil
	}
	return cp.procs[len(cp.procs)-1]
}

// wait waits for done, at most the phase timeout.
func (cp *controlPlane) wait(ctx context.Context, phase string, done <-chan struct{}) error {
	t := time.NewTimer(cp.timeout)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
		return fmt.Errorf("%w: %s: timed out after %s", ErrScenario, phase, cp.timeout)
	case <-cp.exited:
		return fmt.Errorf("%w: %s: a control-plane process exited (logs in %s)", ErrScenario, phase, cp.dir)
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (cp *controlPlane) stop() {
	cp.once.Do(func() { close(cp.exited) })
	for _, p := range cp.procs {
		p.Stop(10 * time.Second)
	}
}

// waitMesh connects a probe proxy until its configuration holds every service's cluster.
func (s Scenario) waitMesh(ctx context.Context, addr string, wait func(string, <-chan struct{}) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ready := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() {
		defer close(ready)
		last := s.Mesh.Cluster(s.Mesh.Services - 1)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for ctx.Err() == nil {
			p := NewProxy(ProxyConfig{Addr: addr, Delta: s.Delta, Index: 1 << 20, Namespace: s.Mesh.Namespace,
				IP: "198.19.254.1"})
			pctx, pcancel := context.WithCancel(ctx)
			errc := make(chan error, 1)
			go func() { errc <- p.Run(pctx) }()
			var ok bool
			select {
			case <-p.Synced():
				ok = p.Watching(EndpointType, last) && p.Watching(EndpointType, s.Mesh.Cluster(0))
			case <-errc:
				errc <- nil
			case <-ctx.Done():
			}
			pcancel()
			<-errc
			if ok {
				return
			}
			select {
			case <-t.C:
			case <-ctx.Done():
			}
		}
	})
	return wait("control plane startup", ready)
}

func (s Scenario) start(ctx context.Context, dir string) ([]*Process, []string, error) {
	// The processes run in dir, so a relative --bin must be resolved from here first.
	binDir, err := filepath.Abs(s.Bin)
	if err != nil {
		return nil, nil, err
	}
	if s.XDSServers > 1 && s.Topology != TopologyMicro {
		return nil, nil, fmt.Errorf("%w: %d xds-servers need the microservices topology, not %q", ErrScenario, s.XDSServers, s.Topology)
	}
	bin := func(name string) string { return filepath.Join(binDir, name) }
	mesh := filepath.Join(dir, MeshFile)
	var procs []*Process
	launchAs := func(name, binary string, args ...string) error {
		// The process serving xDS keeps its metrics on, as in production, on a free port: the
		// services share a host, and every one's default is 15014. The others go without.
		monitoring := ""
		if binary == TopologyHyper || binary == "xds-server" {
			addr, err := FreeAddr()
			if err != nil {
				return err
			}
			monitoring = addr
		}
		args = append([]string{"--monitoring-listen=" + monitoring}, args...)
		p, err := StartProcess(name, bin(binary), dir, args...)
		if err != nil {
			return err
		}
		p.Metrics = monitoring
		procs = append(procs, p)
		return nil
	}
	launch := func(name string, args ...string) error { return launchAs(name, name, args...) }
	switch s.Topology {
	case TopologyExternal:
		if s.XDS == "" {
			return nil, nil, fmt.Errorf("%w: the external topology needs an xDS address", ErrScenario)
		}
		return nil, []string{s.XDS}, nil
	case TopologyHyper:
		xds, err := FreeAddr()
		if err != nil {
			return nil, nil, err
		}
		args := append([]string{"--config-source", "files", "--mesh-config", mesh, "--xds-listen", xds,
			"--bus-listen", "", "--log-level", "warn"}, s.ServerArgs...)
		if err := launch("hyper", args...); err != nil {
			return procs, nil, err
		}
		return procs, []string{xds}, WaitListening(ctx, xds, procs[0].Exited())
	case TopologyMicro:
		var buses [2]string
		for i := range buses {
			a, err := FreeAddr()
			if err != nil {
				return procs, nil, err
			}
			buses[i] = a
		}
		configBus, registryBus := buses[0], buses[1]
		if err := launch("config-ingest", "--config-source", "files", "--mesh-config", mesh,
			"--bus-listen", configBus, "--log-level", "warn"); err != nil {
			return procs, nil, err
		}
		if err := launch("endpoint-watcher", "--kubernetes", "off", "--config-bus", configBus,
			"--bus-listen", registryBus, "--log-level", "warn"); err != nil {
			return procs, nil, err
		}
		n := max(s.XDSServers, 1)
		var addrs []string
		for i := range n {
			xds, err := FreeAddr()
			if err != nil {
				return procs, nil, err
			}
			name := "xds-server"
			if n > 1 {
				name = fmt.Sprintf("xds-server-%d", i)
			}
			args := append([]string{"--config-bus", configBus, "--registry-bus", registryBus, "--xds-listen", xds,
				"--log-level", "warn"}, s.ServerArgs...)
			if err := launchAs(name, "xds-server", args...); err != nil {
				return procs, nil, err
			}
			if err := WaitListening(ctx, xds, procs[len(procs)-1].Exited()); err != nil {
				return procs, nil, err
			}
			addrs = append(addrs, xds)
		}
		return procs, addrs, nil
	}
	return nil, nil, fmt.Errorf("%w: unknown topology %q", ErrScenario, s.Topology)
}

// meter measures a phase: wall time, CPU seconds of each process, bytes the proxies received.
type meter struct {
	procs  []*Process
	shared *Shared
	t0     time.Time
	cpu    map[string]float64
	bytes  int64
	resps  int64
}

// self names the load generator's own CPU use in phases: it shares the machine.
const self = "loadgen"

func (m *meter) begin() {
	m.t0 = time.Now()
	m.cpu = map[string]float64{}
	if u, err := ReadUsage(os.Getpid()); err == nil {
		m.cpu[self] = u.CPUSeconds
	}
	for _, p := range m.procs {
		if u, err := ReadUsage(p.Pid()); err == nil {
			m.cpu[p.Name] = u.CPUSeconds
		}
	}
	m.bytes, m.resps = m.shared.BytesReceived.Load(), m.shared.Responses.Load()
}

func (m *meter) end() Phase {
	ph := Phase{Seconds: time.Since(m.t0).Seconds(), CPUSeconds: map[string]float64{},
		BytesSent: m.shared.BytesReceived.Load() - m.bytes, Responses: m.shared.Responses.Load() - m.resps}
	if u, err := ReadUsage(os.Getpid()); err == nil {
		ph.CPUSeconds[self] = u.CPUSeconds - m.cpu[self]
	}
	for _, p := range m.procs {
		if u, err := ReadUsage(p.Pid()); err == nil {
			ph.CPUSeconds[p.Name] = u.CPUSeconds - m.cpu[p.Name]
		}
	}
	return ph
}
