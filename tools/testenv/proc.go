package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Option configures StartKube and StartConsul.
type Option func(*options)

type options struct {
	log          *slog.Logger
	istioCRDs    bool
	gatewayCRDs  bool
	startTimeout time.Duration
	consulOnDisk bool
	istiodTLS    bool
	meshNetworks string
}

func buildOptions(opts []Option) options {
	o := options{
		log:       slog.New(slog.DiscardHandler),
		istioCRDs: true,
		// Generous: the machine is shared and a cold kube-apiserver takes a
		// while to install its built-in resources.
		startTimeout: 2 * time.Minute,
	}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// WithLogger routes progress messages (and build progress) to log.
func WithLogger(log *slog.Logger) Option {
	return func(o *options) {
		if log != nil {
			o.log = log
		}
	}
}

// WithoutIstioCRDs skips installing Istio's CRDs into the API server.
func WithoutIstioCRDs() Option { return func(o *options) { o.istioCRDs = false } }

// WithGatewayAPICRDs also installs the Gateway API's standard-channel CRDs (GatewayAPIVersion).
// Not by default: a few seconds more at every start, which Istio-only tests need not pay, and
// Sailplane must run without them, as istiod does.
func WithGatewayAPICRDs() Option { return func(o *options) { o.gatewayCRDs = true } }

// WithConsulOnDisk runs Consul as a one-node server keeping its catalog on
// disk instead of -dev's memory, as a real one does: what was registered
// survives Consul.StopAgent and StartAgent.
func WithConsulOnDisk() Option { return func(o *options) { o.consulOnDisk = true } }

// WithIstiodTLS makes istiod also serve xDS over TLS (its 15012, --secureGRPCAddr) on a free
// loopback port, Istiod.SecureXDSAddr. Its certificate comes from its CA: pass
// ENABLE_CA_SERVER=true, and ROOT_CA_DIR naming a plugged-in CA folder to choose the root.
func WithIstiodTLS() Option { return func(o *options) { o.istiodTLS = true } }

// WithMeshNetworks gives istiod meshNetworks (YAML, as the istio ConfigMap's meshNetworks key)
// through its --networksConfig file.
func WithMeshNetworks(yaml string) Option { return func(o *options) { o.meshNetworks = yaml } }

// WithStartTimeout bounds how long a component may take to become ready
// (default 2 minutes). The build of a missing binary is not included.
func WithStartTimeout(d time.Duration) Option { return func(o *options) { o.startTimeout = d } }

// StartError is returned when a process does not become ready.
type StartError struct {
	Component string
	Logs      string
	Err       error
}

func (e *StartError) Error() string {
	return fmt.Sprintf("testenv: starting %s: %v\n--- logs ---\n%s", e.Component, e.Err, e.Logs)
}

func (e *StartError) Unwrap() error { return e.Err }

// proc is one child process whose output goes to a log file.
type proc struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error // set before done is closed
}

func startProc(name, logPath, bin string, args ...string) (*proc, error) {
	return startProcEnv(name, logPath, nil, bin, args...)
}

// startProcEnv is startProc with env (KEY=value) added to the test's environment.
func startProcEnv(name, logPath string, env []string, bin string, args ...string) (*proc, error) {
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("testenv: %s log: %w", name, err)
	}
	fmt.Fprintf(lf, "### %s %s\n", bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout = lf
	cmd.Stderr = lf
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Nothing may outlive the test binary, even when it is killed.
		Pdeathsig: syscall.SIGKILL,
		Setpgid:   true,
	}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("testenv: start %s: %w", name, err)
	}
	p := &proc{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended, with its error.
func (p *proc) exited() (bool, error) {
	select {
	case <-p.done:
		if p.err == nil {
			return true, errors.New("exited")
		}
		return true, p.err
	default:
		return false, nil
	}
}

// stop asks the process to end (SIGTERM) and kills it after grace.
func (p *proc) stop(grace time.Duration) {
	if p == nil {
		return
	}
	if done, _ := p.exited(); done {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// tailFile returns the last max bytes of a file.
func tailFile(path string, max int64) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(%v)\n", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Sprintf("(%v)\n", err)
	}
	off := int64(0)
	if fi.Size() > max {
		off = fi.Size() - max
	}
	buf := make([]byte, fi.Size()-off)
	n, _ := f.ReadAt(buf, off)
	return string(buf[:n])
}

// logsOf is the tail of each log, without kube-apiserver's and istiod's start-up listing of
// every flag: a failed test prints it, and hundreds of FLAG lines would bury what went wrong.
func logsOf(paths ...string) string {
	var b strings.Builder
	for _, p := range paths {
		fmt.Fprintf(&b, "===== %s =====\n", filepath.Base(p))
		for line := range strings.Lines(tailFile(p, 64<<10)) {
			if !strings.Contains(line, "] FLAG: --") && !strings.Contains(line, "\tFLAG: --") {
				b.WriteString(line)
			}
		}
	}
	return b.String()
}

// freePorts reserves n distinct loopback ports. They are released before the child binds
// them, so another process could take one in between; all are held until the last is picked
// so they are at least distinct. They are picked below the kernel's ephemeral range: a process
// restarted on its ports (Kube.StartAPIServer, Consul.StartAgent) finds them free again, where
// an ephemeral port may meanwhile have become the source port of some outgoing connection.
func freePorts(n int) ([]int, error) {
	ls := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	lo, hi := stablePortRange()
	ports := make([]int, 0, n)
	for attempts := 0; len(ports) < n; attempts++ {
		addr := "127.0.0.1:0" // the ephemeral range, if the stable one is taken or too small
		if attempts < 100*n && hi > lo {
			addr = "127.0.0.1:" + strconv.Itoa(lo+rand.IntN(hi-lo))
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			if addr != "127.0.0.1:0" {
				continue
			}
			return nil, fmt.Errorf("testenv: free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// stablePortRange is [lo, hi): from 10000 up to the first ephemeral port
// (/proc/sys/net/ipv4/ip_local_port_range, 32768 by default).
func stablePortRange() (lo, hi int) {
	hi = 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				hi = v
			}
		}
	}
	return 10000, hi
}

// waitFor polls check until it returns nil, the process exits, or ctx ends.
func waitFor(ctx context.Context, p *proc, check func(ctx context.Context) error) error {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	var last error
	for {
		if last = check(ctx); last == nil {
			return nil
		}
		if done, err := p.exited(); done {
			return fmt.Errorf("process ended: %w", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last check: %v)", ctx.Err(), last)
		case <-t.C:
		}
	}
}

// httpGet fetches url and returns the body when the status is 200.
func httpGet(ctx context.Context, c *http.Client, url string, hdr http.Header) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	return body, nil
}
