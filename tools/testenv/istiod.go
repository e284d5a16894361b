package testenv

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Istiod is Istio's pilot-discovery (istiod) running against a Kube, the reference the
// differential tests compare Sailplane with. It serves plaintext xDS on XDSAddr; everything it
// listens on is on 127.0.0.1.
type Istiod struct {
	dir      string
	logPath  string
	xdsAddr  string
	httpAddr string
	tlsAddr  string // WithIstiodTLS

	mu sync.Mutex
	p  *proc
}

// istiodEnv is istiod's environment beyond the caller's: what it needs to run outside a pod,
// and the controllers turned off that need what the test environment lacks. The caller's env
// comes after it and wins (os/exec keeps the last value of a key): a test with the Gateway API
// CRDs passes PILOT_ENABLE_GATEWAY_API=true, without which istiod neither reads the Gateway API
// kinds into its config store nor runs its gateway controller (it still watches the CRDs).
var istiodEnv = []string{
	// Its own namespace (the mesh's root namespace by default, where it keeps its leases).
	"POD_NAMESPACE=istio-system",
	"POD_NAME=istiod-testenv",
	// The default 25 new connections a second refuses a test connecting many nodes at once.
	"PILOT_MAX_REQUESTS_PER_SECOND=10000",
	// No CA: nothing here asks it for certificates, and with secureGRPCAddr empty it has no TLS
	// port to serve one on. xDS names the SDS secrets ("default", "ROOTCA") either way.
	"ENABLE_CA_SERVER=false",
	// No webhooks: there is no webhook configuration to patch in the test API server, and no
	// gateway controllers, which want the Gateway API CRDs and Deployments a kubelet would run.
	"VALIDATION_WEBHOOK_CONFIG_NAME=",
	"INJECTION_WEBHOOK_CONFIG_NAME=",
	"PILOT_ENABLE_GATEWAY_API=false",
	"PILOT_ENABLE_GATEWAY_API_STATUS=false",
	"PILOT_ENABLE_GATEWAY_API_DEPLOYMENT_CONTROLLER=false",
	"PILOT_ENABLE_GATEWAY_API_GATEWAYCLASS_CONTROLLER=false",
	// Its status writer would race the test's objects with writes of its own.
	"PILOT_ENABLE_STATUS=false",
}

// StartIstiod starts pilot-discovery against the API server of kubeconfig with meshConfig (the
// contents of a mesh config file, Istio's meshConfig format) on free loopback ports, with env
// (KEY=value) added to what it needs, and waits until it reports ready: its caches synced and
// its first push context built, so what it serves then reflects what the API server held when
// it started. ctx bounds the start only; the process runs until Stop.
func StartIstiod(ctx context.Context, kubeconfig, meshConfig string, env []string, opts ...Option) (_ *Istiod, err error) {
	o := buildOptions(opts)
	bin, err := EnsurePilotDiscovery(ctx, o.log)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sailplane-istiod-")
	if err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	i := &Istiod{dir: dir, logPath: filepath.Join(dir, "istiod.log")}
	defer func() {
		if err != nil {
			i.Stop()
		}
	}()
	meshFile := filepath.Join(dir, "mesh.yaml")
	if err := os.WriteFile(meshFile, []byte(meshConfig), 0o600); err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	if o.meshNetworks != "" {
		if err := os.WriteFile(filepath.Join(dir, "meshNetworks"), []byte(o.meshNetworks), 0o600); err != nil {
			return nil, fmt.Errorf("testenv: %w", err)
		}
	}
	// The ports are free when picked, not when istiod binds them: another process may take
	// one first, and istiod then exits; it starts again on other ports.
	const attempts = 3
	for attempt := 1; ; attempt++ {
		if err = i.start(ctx, o, bin, kubeconfig, meshFile, env); err == nil {
			break
		}
		if attempt == attempts || ctx.Err() != nil {
			return nil, err
		}
		o.log.Warn("testenv: istiod did not start, trying other ports", "err", err)
	}
	o.log.Info("testenv: istiod ready", "xds", i.xdsAddr)
	return i, nil
}

func (i *Istiod) start(ctx context.Context, o options, bin, kubeconfig, meshFile string, env []string) error {
	ports, err := freePorts(6)
	if err != nil {
		return err
	}
	addr := func(n int) string { return "127.0.0.1:" + strconv.Itoa(ports[n]) }
	i.xdsAddr, i.httpAddr = addr(0), addr(1)
	secure := "--secureGRPCAddr="
	if o.istiodTLS {
		i.tlsAddr = addr(5)
		secure += i.tlsAddr
	}
	p, err := startProcEnv("istiod", i.logPath, append(append(slicesClone(istiodEnv), env...), "KUBECONFIG="+kubeconfig), bin,
		"discovery",
		"--kubeconfig="+kubeconfig,
		"--meshConfig="+meshFile,
		// No file means "none" for istiod, not an error.
		"--networksConfig="+filepath.Join(i.dir, "meshNetworks"),
		"--grpcAddr="+i.xdsAddr,
		"--httpAddr="+i.httpAddr,
		"--httpsAddr="+addr(2),
		"--monitoringAddr="+addr(3),
		"--ctrlz_port="+strconv.Itoa(ports[4]),
		"--ctrlz_address=127.0.0.1",
		secure,
		"--log_output_level=default:info",
	)
	if err != nil {
		return err
	}
	i.mu.Lock()
	i.p = p
	i.mu.Unlock()

	startCtx, cancel := context.WithTimeout(ctx, o.startTimeout)
	defer cancel()
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	err = waitFor(startCtx, p, func(ctx context.Context) error {
		_, err := httpGet(ctx, hc, "http://"+i.httpAddr+"/ready", nil)
		return err
	})
	if err != nil {
		p.stop(10 * time.Second)
		return &StartError{Component: "istiod", Logs: i.Logs(), Err: err}
	}
	return nil
}

func slicesClone(s []string) []string { return append([]string(nil), s...) }

// XDSAddr is istiod's plaintext xDS address (its 15010), 127.0.0.1:<port>.
func (i *Istiod) XDSAddr() string { return i.xdsAddr }

// SecureXDSAddr is istiod's TLS xDS address (its 15012) with WithIstiodTLS, else "".
func (i *Istiod) SecureXDSAddr() string { return i.tlsAddr }

// DebugAddr is istiod's HTTP address (its 8080: /ready, /debug/...).
func (i *Istiod) DebugAddr() string { return i.httpAddr }

// LogPath is istiod's log file (removed by Stop).
func (i *Istiod) LogPath() string { return i.logPath }

// Logs returns the tail of istiod's log.
func (i *Istiod) Logs() string { return logsOf(i.logPath) }

// Stop stops istiod and removes its temporary directory. Safe to call more than once.
func (i *Istiod) Stop() {
	i.mu.Lock()
	p := i.p
	i.mu.Unlock()
	// istiod drains for --shutdownDuration (10 s) on SIGTERM; a test has nothing to drain.
	p.stop(2 * time.Second)
	if i.dir != "" {
		_ = os.RemoveAll(i.dir)
	}
}

// IstiodForTest starts istiod against k for one test (see StartIstiod): it fails t if the start
// fails, logs istiod's output if t failed, and stops it at cleanup.
func IstiodForTest(t testing.TB, k *Kube, meshConfig string, env ...string) *Istiod {
	t.Helper()
	return IstiodForTestWith(t, k, meshConfig, env)
}

// IstiodForTestWith is IstiodForTest with options (WithIstiodTLS).
func IstiodForTestWith(t testing.TB, k *Kube, meshConfig string, env []string, opts ...Option) *Istiod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	i, err := StartIstiod(ctx, k.KubeconfigPath(), meshConfig, env, append([]Option{WithLogger(tLogger(t))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(i.Stop)
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(strings.TrimSpace(i.Logs()))
		}
	})
	return i
}
