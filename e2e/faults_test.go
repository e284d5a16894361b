package e2e

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/pki"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/spiffe"
	"sailplane.dev/shared/testlog"
	"sailplane.dev/shared/workloadcert"
	"sailplane.dev/tools/testenv"
)

// TestFaults is the fault suite (docs/faults.md): each fault is caused while a real proxyless
// gRPC client calls through Sailplane the whole time and a config change has just been made.
// After each, no RPC may have failed (proxyless gRPC has no retries unless a VirtualService asks
// for them, so the budget is zero), the client must have kept routing as before until the change
// reached it and never gone back, and the buses must still hold every resource. The time from
// the fault's end to the first RPC the change routed is logged ("fault: ..." lines, and the
// table docs/faults.md shows at the end, with -v).
//
// The groups run at once: the outages are 30 s each, and each group has its own processes.
func TestFaults(t *testing.T) {
	var table faultTable
	groups := []faultGroup{
		{"files/hyper", func(t *testing.T, ft *faultTable) { testFileFaults(t, ft, startHyperForFaults, anyFault) }},
		// The bus link cut holds for 45 s: on a Sailplane of its own, beside the other faults.
		{"files/microservices", func(t *testing.T, ft *faultTable) {
			testFileFaults(t, ft, startMicroservicesForFaults, func(fault string) bool { return fault != busLinkCut })
		}},
		{"bus-link-cut/microservices", func(t *testing.T, ft *faultTable) {
			testFileFaults(t, ft, startMicroservicesForFaults, func(fault string) bool { return fault == busLinkCut })
		}},
	}
	for _, topo := range kubeTopologies {
		groups = append(groups, faultGroup{"kube-api-outage/" + topo.name, func(t *testing.T, ft *faultTable) {
			testKubeAPIServerOutage(t, ft, topo.name, topo.start)
		}})
	}
	for _, topo := range consulTopologies {
		groups = append(groups, faultGroup{"consul-outage/" + topo.name, func(t *testing.T, ft *faultTable) {
			testConsulOutage(t, ft, topo.name, topo.start)
		}})
	}
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Go(func() { t.Run(g.name, func(t *testing.T) { g.run(t, &table) }) })
	}
	wg.Wait()
	t.Logf("docs/faults.md table:\n%s", table.markdown())
}

// faultGroup is faults run one after the other on one Sailplane.
type faultGroup struct {
	name string
	run  func(*testing.T, *faultTable)
}

// faultSailplane is Sailplane on files under dir/etc/sailplane/conf, a tmpfs the test can fill.
type faultSailplane struct {
	topology string
	dir      string
	xds      []string // the xDS servers' addresses, in the order clients try them
	// procs are the processes a fault kills, by name: hyper, or each service.
	procs map[string]*restartable
	// ingest is the process reading the config files (hyper or config-ingest).
	ingest *restartable
	// buses are the resources Sailplane's buses must hold, as a consumer sees them.
	buses []busWant
	// csr, microservices only: a CSR sent while the ca is down is signed once it is back.
	csr func(t *testing.T) (*workloadcert.Client, *testlog.Messages)
	// configHost, microservices only: the test host config-ingest runs in, so its bus link can be cut.
	configHost *framework.TestHost
	// agent, microservices only: starts an agent whose certificates live ttl; its xDS proxy
	// reaches an xds-server over mTLS with them.
	agent func(t *testing.T, ttl time.Duration) *framework.AgentProcess
}

// echoConfig is the echo service with one endpoint, the echo backend at addr.
func echoConfig(addr string) string {
	return echoServiceEntry + fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: echo-1, namespace: demo}
spec: {address: 127.0.0.1, ports: {grpc: %s}, labels: {app: echo}}
`, port(addr))
}

func startHyperForFaults(t *testing.T, dir string) *faultSailplane {
	xds, busAddr, tls := framework.FreeAddr(t), framework.FreeAddr(t), framework.FreeAddr(t)
	hyper := newRestartable(func() *framework.Process {
		return framework.Start(t, dir, framework.Binary(t, "hyper"), "--config-source", "files",
			"--xds-listen", xds, "--bus-listen", busAddr, "--xds-tls-listen", tls)
	})
	rec := framework.RecordBus(t, busAddr, schema.ServiceEntry.TypeURL, schema.WorkloadEntry.TypeURL,
		schema.Service.TypeURL, schema.Endpoints.TypeURL)
	return &faultSailplane{topology: "hyper", dir: dir, xds: []string{xds}, ingest: hyper,
		procs: map[string]*restartable{"hyper": hyper}, buses: echoOnBus(rec, rec)}
}

// startMicroservicesForFaults runs the ca, config-ingest, endpoint-watcher and two xds-servers,
// every bus over mTLS with the certificates the ca signs. config-ingest runs in a test host, so
// that its bus link can be cut; its bus and the ca listen on addresses the host reaches.
func startMicroservicesForFaults(t *testing.T, dir string) *faultSailplane {
	host := framework.NewTestHost(t, "config-ingest")
	caAddr, caBus := framework.GatewayAddr(t), framework.GatewayAddr(t)
	configBus := hostPort(host.IP(), 15051)
	registryBus := framework.FreeAddr(t)
	sp := &faultSailplane{topology: "microservices", dir: dir, configHost: host, procs: map[string]*restartable{}}
	start := func(name string, bin string, args ...string) *restartable {
		r := newRestartable(func() *framework.Process { return framework.Start(t, dir, bin, args...) })
		sp.procs[name] = r
		return r
	}
	start("ca", framework.Binary(t, "ca"), "--kubernetes=false", "--ca-listen", caAddr,
		"--service-cert-dir", "var/service-certs", "--bus-listen", caBus)
	identity := waitServiceCerts(t, dir, caAddr)
	ipBin, ingestArgs := host.Command(framework.Binary(t, "config-ingest"), append(identity("config-ingest"), "--config-source", "files",
		"--mesh-config", "etc/sailplane/mesh.yaml", "--bus-listen", configBus)...)
	sp.ingest = start("config-ingest", ipBin, ingestArgs...)
	start("endpoint-watcher", framework.Binary(t, "endpoint-watcher"), append(identity("endpoint-watcher"), "--kubernetes", "off",
		"--config-bus", configBus, "--bus-listen", registryBus)...)
	var xdsTLS string // the second xds-server's TLS port (istiod's 15012), for agents
	for _, name := range []string{"xds-server-1", "xds-server-2"} {
		xds := framework.FreeAddr(t)
		sp.xds = append(sp.xds, xds)
		xdsTLS = framework.FreeAddr(t)
		start(name, framework.Binary(t, "xds-server"), append(identity("xds-server"), "--config-bus", configBus,
			"--registry-bus", registryBus, "--ca-bus", caBus, "--xds-listen", xds, "--xds-tls-listen", xdsTLS)...)
	}
	// The test reads the buses as xds-server does, with its bootstrap certificate.
	sec := bus.Security{Identity: framework.IdentityFromDir(t, filepath.Join(dir, "var/service-certs/xds-server")),
		Peers: bus.SailplanePeers("cluster.local", "istio-system")}
	sp.buses = echoOnBus(framework.RecordSecureBus(t, configBus, sec, schema.ServiceEntry.TypeURL, schema.WorkloadEntry.TypeURL),
		framework.RecordSecureBus(t, registryBus, sec, schema.Service.TypeURL, schema.Endpoints.TypeURL))
	sp.csr = func(t *testing.T) (*workloadcert.Client, *testlog.Messages) {
		folder := filepath.Join(dir, "var/service-certs/xds-server")
		log, msgs := testlog.NewRecording(t, slog.LevelInfo)
		c, err := workloadcert.New(workloadcert.Config{CAAddress: caAddr, RootCertFile: filepath.Join(folder, workloadcert.RootCertFile),
			ProvisionedCertDir: folder}, log)
		if err != nil {
			t.Fatal(err)
		}
		return c, msgs
	}
	sp.agent = func(t *testing.T, ttl time.Duration) *framework.AgentProcess {
		certs := filepath.Join(dir, "etc/certs") // the ca's root, which also provisions the agent as an operator would
		return framework.StartAgent(t, framework.CA{Addr: caAddr, CertDir: certs, RootFile: filepath.Join(certs, "root-cert.pem")},
			framework.Agent{ID: spiffe.ID{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "caller"},
				XDSAddr: xdsTLS, XDSOverTLS: true, CertTTL: ttl})
	}
	// Subscribers stop before the buses they read: a bus server stopping waits for its streams.
	t.Cleanup(func() {
		for _, name := range []string{"xds-server-1", "xds-server-2", "endpoint-watcher"} {
			sp.procs[name].p.Stop()
		}
	})
	return sp
}

// busWant is a resource a bus must hold: name, or any namespace's name.
type busWant struct {
	rec           *framework.BusRecorder
	typeURL, name string
}

// holdsEverything waits until every bus holds the echo service's config and registry entries.
func (sp *faultSailplane) holdsEverything(t *testing.T) {
	t.Helper()
	framework.Eventually(t, time.Minute, func() error {
		var errs []error
		for _, w := range sp.buses {
			names := w.rec.Names(w.typeURL)
			if !slices.Contains(names, w.name) && !hasSuffix(names, "/"+w.name) {
				errs = append(errs, fmt.Errorf("%s %s missing on the bus (have %v)", w.typeURL, w.name, names))
			}
		}
		return errors.Join(errs...)
	})
}

// echoOnBus is what the buses hold of the echo service: on the config bus, its ServiceEntry and
// WorkloadEntry; on the registry bus, its Service and Endpoints.
func echoOnBus(config, registry *framework.BusRecorder) []busWant {
	return []busWant{
		{config, schema.ServiceEntry.TypeURL, "demo/echo"},
		{config, schema.WorkloadEntry.TypeURL, "demo/echo-1"},
		{registry, schema.Service.TypeURL, "echo.demo.svc.cluster.local"},
		{registry, schema.Endpoints.TypeURL, "echo.demo.svc.cluster.local"},
	}
}

// anyFault selects every fault of testFileFaults.
func anyFault(string) bool { return true }

// busLinkCut is the name of testFileFaults' bus link cut.
const busLinkCut = "bus link cut"

// testFileFaults runs the faults of Sailplane on files that want selects (by subtest name), one
// after the other on one Sailplane.
func testFileFaults(t *testing.T, table *faultTable, start func(*testing.T, string) *faultSailplane, want func(fault string) bool) {
	backends := map[string]*framework.Echo{
		"a": framework.StartEcho(t, "a", "127.0.0.1:0"),
		"b": framework.StartEcho(t, "b", "127.0.0.1:0"),
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "etc/sailplane/conf")
	// 256 KiB: room for the config, and little enough to fill in a moment.
	smallFS(t, conf, 256<<10)
	framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", meshYAML)
	framework.WriteFile(t, dir, "etc/sailplane/conf/echo.yaml", echoConfig(backends["a"].Addr))
	sp := start(t, dir)
	current := "a"
	// edit points the echo service at the other backend, returning the old and the new.
	edit := func(t *testing.T) (old, new string) {
		old, new = current, map[string]string{"a": "b", "b": "a"}[current]
		framework.WriteFile(t, dir, "etc/sailplane/conf/echo.yaml", echoConfig(backends[new].Addr))
		current = new
		return old, new
	}

	client := framework.XDSClient(t, replicas(sp.xds...), echoTarget)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	framework.WaitServing(ctx, t, client)
	sp.holdsEverything(t)
	load := startCallLoad(t, client, 20*time.Millisecond)

	// record checks what the client saw since mark and adds the fault's row.
	record := func(t *testing.T, fault string, mark int, old, new string, end, at time.Time, from string) {
		t.Helper()
		n, err := load.checkSwitch(mark, old, new)
		if err != nil {
			t.Fatal(err)
		}
		sp.holdsEverything(t)
		table.add(t, faultRow{topology: sp.topology, fault: fault, rpcs: n, convergence: at.Sub(end), measuredFrom: from})
	}

	// run runs a fault that want selects.
	run := func(fault string, f func(t *testing.T)) {
		if want(fault) {
			t.Run(fault, f)
		}
	}

	// Each service killed (SIGKILL) right after a config change was written, and started again.
	for _, name := range []string{"hyper", "config-ingest", "endpoint-watcher"} {
		if sp.procs[name] == nil {
			continue
		}
		run("kill "+name, func(t *testing.T) {
			mark := load.mark()
			old, new := edit(t)
			sp.procs[name].kill()
			sp.procs[name].restart()
			end := time.Now()
			at := load.waitBackend(t, mark, end, new, 2*time.Minute)
			record(t, "kill -9 "+name, mark, old, new, end, at, "its restart")
		})
	}

	if sp.procs["xds-server-1"] != nil {
		// The client is on the first replica: killed, the client fails over to the second, which
		// sends it the change.
		run("kill xds-server", func(t *testing.T) {
			mark := load.mark()
			old, new := edit(t)
			sp.procs["xds-server-1"].kill()
			end := time.Now()
			at := load.waitBackend(t, mark, end, new, 2*time.Minute)
			sp.procs["xds-server-1"].restart()
			record(t, "kill -9 one of two xds-servers", mark, old, new, end, at, "the kill (the client fails over to the other)")
		})
	}

	if sp.procs["ca"] != nil {
		// The ca away: the services keep their certificates (the buses stay up, a change still
		// flows), and a CSR sent meanwhile is retried until the ca is back. An agent whose
		// renewal falls in the outage keeps serving the certificate it holds (its xDS proxy
		// carries a client's xDS over mTLS with it, its SDS hands it to Envoy), and gets a new
		// one once the ca is back.
		run("kill ca", func(t *testing.T) {
			agent := sp.agent(t, agentCertTTL)
			agentClient := framework.DialXDS(t, echoTarget, framework.GRPCBootstrap("unix://"+agent.XDSProxy,
				"sidecar~127.0.0.1~caller-0.demo~demo.svc.cluster.local"), grpcInsecure)
			framework.WaitServing(ctx, t, agentClient)
			agentLoad := startCallLoad(t, agentClient, 20*time.Millisecond)
			envoy := framework.WatchSDS(t, agent.SDS)
			waitSDSCert(t, envoy, func(framework.SDSCert) error { return nil })

			mark, agentMark, agentLog := load.mark(), agentLoad.mark(), len(agent.Log())
			sp.procs["ca"].kill()
			old, new := edit(t)
			edited := time.Now()
			load.waitBackend(t, mark, edited, new, 2*time.Minute)
			agentLoad.waitBackend(t, agentMark, edited, new, 2*time.Minute)
			// The agent's renewal is due at about 80 % of the certificate's life.
			framework.Eventually(t, 2*agentCertTTL, func() error {
				if !strings.Contains(agent.Log()[agentLog:], "cannot get a certificate") {
					return errors.New("the agent has not tried to renew its certificate during the outage yet")
				}
				return nil
			})
			// SDS serves the certificate held (the one in the agent's files), to the stream open
			// since before the kill and to one opened now (an Envoy restarting).
			held := agentCert(t, agent)
			waitSDSCert(t, envoy, heldCert(held))
			waitSDSCert(t, framework.WatchSDS(t, agent.SDS), heldCert(held))
			csr, csrLog := sp.csr(t)
			csrCtx, stopCSR := context.WithCancel(context.Background())
			csrDone := make(chan error, 1)
			go func() { csrDone <- csr.Run(csrCtx) }()
			defer func() {
				stopCSR()
				<-csrDone
			}()
			framework.Eventually(t, time.Minute, func() error {
				if csrLog.Count("cannot get a certificate") == 0 {
					return errors.New("the CSR sent while the ca is down has not failed yet")
				}
				return nil
			})
			sp.procs["ca"].restart()
			end := time.Now()
			select {
			case <-csr.Ready():
			case <-time.After(2 * time.Minute):
				t.Fatal("a CSR sent while the ca was down is not signed 2 minutes after its restart")
			}
			record(t, "kill -9 ca", mark, old, new, end, time.Now(), "its restart to a CSR sent meanwhile signed (the config change made while it was down flowed meanwhile)")

			// The agent's new certificate reaches Envoy's stream, which stayed open throughout.
			renewed := waitSDSCert(t, envoy, func(c framework.SDSCert) error {
				if heldCert(held)(c) == nil {
					return errors.New("Envoy still has the certificate from before the outage")
				}
				return nil
			})
			if serials := agent.SerialsSince(agentLog); !slices.Contains(serials, renewed.Leaf.SerialNumber.Text(16)) {
				t.Errorf("Envoy got certificate %x, the agent logged getting %v", renewed.Leaf.SerialNumber, serials)
			}
			n, err := agentLoad.checkSwitch(agentMark, old, new)
			if err != nil {
				t.Fatalf("through the agent's xDS proxy: %v", err)
			}
			table.add(t, faultRow{topology: sp.topology, fault: "kill -9 ca, an agent's renewal due meanwhile", rpcs: n, convergence: renewed.Received.Sub(end),
				measuredFrom: "its restart to the agent's new certificate in Envoy's SDS stream (meanwhile its xDS proxy and SDS served the one it held)"})
		})
	}

	if sp.configHost != nil {
		// config-ingest's bus link cut for linkCut: consumers keep what they have, and the change
		// made meanwhile arrives once the link is back.
		run(busLinkCut, func(t *testing.T) {
			mark := load.mark()
			if err := sp.configHost.SetLinkUp(false); err != nil {
				t.Fatal(err)
			}
			old, new := edit(t)
			hold(t, linkCut)
			if err := sp.configHost.SetLinkUp(true); err != nil {
				t.Fatal(err)
			}
			end := time.Now()
			at := load.waitBackend(t, mark, end, new, 2*time.Minute)
			// Nothing reached the client while the link was down.
			for _, r := range load.since(mark) {
				if r.end.Before(end) && r.backend == new {
					t.Fatalf("the change reached the client at %s, while the bus link was cut", r.end.Format("15:04:05.000"))
				}
			}
			record(t, fmt.Sprintf("config-ingest's bus link cut %v", linkCut), mark, old, new, end, at, "the link restored")
		})
	}

	// The config folder's filesystem full while its file is edited in place: the write fails
	// half done, what was served stays served, and the edit saved again once there is room lands.
	run("full filesystem", func(t *testing.T) {
		mark := load.mark()
		logMark := len(sp.ingest.p.Log())
		filler := filepath.Join(conf, ".filler")
		fillFS(t, filler)
		old, new := current, map[string]string{"a": "b", "b": "a"}[current]
		// A long comment first: what fits is a file of comments, valid YAML with no resources.
		content := "# " + strings.Repeat("padding ", 8<<10) + "\n" + echoConfig(backends[new].Addr)
		if err := os.WriteFile(filepath.Join(conf, "echo.yaml"), []byte(content), 0o644); err == nil {
			t.Fatal("writing echo.yaml on the full filesystem succeeded; want ENOSPC")
		}
		// Reported once its settle window is over, when it would otherwise have been applied.
		framework.Eventually(t, time.Minute, func() error {
			for _, line := range strings.Split(sp.ingest.p.Log()[logMark:], "\n") {
				if strings.Contains(line, "echo.yaml") && strings.Contains(line, "filesystem is full") {
					return nil
				}
			}
			return errors.New("the half-written echo.yaml is not reported as held on a full filesystem")
		})
		sp.holdsEverything(t)
		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
		edit(t) // the edit, saved again
		end := time.Now()
		at := load.waitBackend(t, mark, end, new, 2*time.Minute)
		record(t, "config folder's filesystem full during an edit", mark, old, new, end, at, "the edit saved again once there is room")
	})
}

// agentCertTTL is the lifetime of the certificates of the agent in the ca fault: its renewal,
// at about 80 % of it, falls in the outage, and the certificate it holds outlives the outage.
const agentCertTTL = 20 * time.Second

// waitSDSCert waits until the certificate on an SDS stream passes check, and returns it.
func waitSDSCert(t *testing.T, w *framework.SDSWatch, check func(framework.SDSCert) error) framework.SDSCert {
	t.Helper()
	var c framework.SDSCert
	framework.Eventually(t, time.Minute, func() error {
		var err error
		if c, err = w.Latest(); err != nil {
			t.Fatalf("SDS stream: %v", err)
		}
		if c.Leaf == nil {
			return errors.New("no certificate on the SDS stream yet")
		}
		return check(c)
	})
	return c
}

// agentCert is the workload certificate in an agent's files.
func agentCert(t *testing.T, a *framework.AgentProcess) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(a.OutputDir, workloadcert.CertChainFile))
	if err != nil {
		t.Fatal(err)
	}
	chain, err := pki.ParseCerts(data)
	if err == nil && len(chain) == 0 {
		err = errors.New("no certificate")
	}
	if err != nil {
		t.Fatalf("%s: %v", workloadcert.CertChainFile, err)
	}
	return chain[0]
}

// heldCert checks that an SDS stream has the certificate held.
func heldCert(held *x509.Certificate) func(framework.SDSCert) error {
	return func(c framework.SDSCert) error {
		if c.Leaf == nil {
			return errors.New("no certificate")
		}
		if !c.Leaf.Equal(held) {
			return fmt.Errorf("certificate %x, want the one held, %x", c.Leaf.SerialNumber, held.SerialNumber)
		}
		return nil
	}
}

// linkCut is how long a bus link stays cut: longer than the bus server's keepalive (a ping
// after 30 s idle, 10 s to answer), so that the connection is given up on, not only delayed.
const linkCut = 45 * time.Second

// hold lets d pass: the fault's duration (the client keeps calling meanwhile).
func hold(t *testing.T, d time.Duration) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	<-timer.C
}

// consulOutage is how long Consul stays down, as long as the API server's outage.
const consulOutage = apiOutage

// testConsulOutage, a group of TestFaults, stops Consul (a one-node server keeping its catalog
// on disk, as a real one does) for 30 s: the endpoints Sailplane learned from it stay served
// (RPCs keep succeeding on the registered instance), and once Consul is back a second instance
// registered then reaches the client.
func testConsulOutage(t *testing.T, table *faultTable, topology string, start func(t *testing.T, dir, consulAddr string) consulSailplane) {
	c := testenv.ConsulForTest(t, testenv.WithConsulOnDisk())
	consul := consulCLI(t, c.Addr())
	const name = "echo-consul"
	register := func(i int) string {
		id := fmt.Sprintf("%s-%d", name, i)
		host := framework.NewTestHost(t, id)
		framework.StartEchoOn(t, id, host.Listen(t, echoPort))
		def := filepath.Join(t.TempDir(), id+".json")
		framework.WriteFile(t, filepath.Dir(def), filepath.Base(def), fmt.Sprintf(
			`{"service": {"id": %q, "name": %q, "address": %q, "port": %d, "meta": {"protocol": "grpc"}}}`, id, name, host.IP(), echoPort))
		consul("services", "register", def)
		return id
	}
	first := register(0)

	dir := t.TempDir()
	framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", meshYAML)
	framework.WriteFile(t, dir, "etc/sailplane/conf/empty.yaml", "# no Istio config: the services come from Consul\n")
	sp := start(t, dir, c.Addr())
	client := framework.XDSClient(t, sp.xds, fmt.Sprintf("xds:///%s.service.consul:%d", name, echoPort))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	framework.WaitServing(ctx, t, client)
	load := startCallLoad(t, client, 20*time.Millisecond)
	mark := load.mark()

	c.StopAgent()
	hold(t, consulOutage)
	if err := c.StartAgent(ctx); err != nil {
		t.Fatalf("restarting Consul: %v", err)
	}
	restarted := time.Now()
	second := register(1)
	// Measured from the instance in the catalog: the agent registers it there on its own schedule.
	end := waitInCatalog(t, c.Addr(), name, second)
	t.Logf("Consul back; the instance registered then reached its catalog %v later", end.Sub(restarted).Round(time.Millisecond))
	at := load.waitBackend(t, mark, end, second, afterOutage)
	rpcs := load.since(mark)
	before := map[string]int{}
	for _, r := range rpcs {
		if r.start.Before(restarted) {
			before[r.backend]++
		}
	}
	if err := onlyFrom(before, first); err != nil {
		t.Fatalf("while Consul was down: %v", err)
	}
	if err := noFailures(rpcs); err != nil {
		t.Fatal(err)
	}
	table.add(t, faultRow{topology: topology, fault: fmt.Sprintf("Consul down %v", consulOutage), rpcs: len(rpcs), convergence: at.Sub(end),
		measuredFrom: "a new instance in Consul's catalog, registered once Consul is back"})
}

// waitInCatalog waits until Consul's catalog at addr lists the instance id of service, and
// returns when it did.
func waitInCatalog(t *testing.T, addr, service, id string) time.Time {
	t.Helper()
	framework.Eventually(t, time.Minute, func() error {
		resp, err := http.Get("http://" + addr + "/v1/catalog/service/" + service)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var instances []struct{ ServiceID string }
		if err := json.NewDecoder(resp.Body).Decode(&instances); err != nil {
			return fmt.Errorf("catalog of %s: %w", service, err)
		}
		for _, in := range instances {
			if in.ServiceID == id {
				return nil
			}
		}
		return fmt.Errorf("%s is not in the catalog of %s: %v", id, service, instances)
	})
	return time.Now()
}
