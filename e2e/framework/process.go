// Package framework starts Sailplane's binaries and the real peers they talk to (gRPC backends,
// gRPC xDS clients) for end-to-end tests.
package framework

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sailplane.dev/shared/testwait"
)

// Binary returns the path of a Sailplane binary: from $SAILPLANE_BIN (what `make test-e2e` sets
// after `make build`), else built once per test process into a temporary folder.
func Binary(t testing.TB, name string) string {
	t.Helper()
	if dir := os.Getenv("SAILPLANE_BIN"); dir != "" {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("SAILPLANE_BIN=%s: %v (run `make build`)", dir, err)
		}
		return p
	}
	return buildOnce(t, name)
}

var (
	buildMu  sync.Mutex
	buildDir string
	built    = map[string]string{}
)

func buildOnce(t testing.TB, name string) string {
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := built[name]; ok {
		return p
	}
	if buildDir == "" {
		d, err := os.MkdirTemp("", "sailplane-e2e-bin")
		if err != nil {
			t.Fatal(err)
		}
		buildDir = d
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	pkg := "./services/" + name + "/cmd"
	if name == "sailplanectl" {
		pkg = "./tools/sailplanectl"
	}
	out := filepath.Join(buildDir, name)
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	built[name] = out
	return out
}

// Process is a started binary whose output is kept in a log file and shown if the test fails.
type Process struct {
	Name string
	// Monitoring is the address of the process's monitoring port (/healthz/ready), which start
	// chose (see monitoredBinaries); empty otherwise.
	Monitoring string
	cmd        *exec.Cmd
	log        string
	done       chan struct{}
	err        error
}

// Start runs a binary in dir with args; it is stopped (SIGTERM, then SIGKILL) when the test ends.
func Start(t testing.TB, dir, bin string, args ...string) *Process {
	t.Helper()
	return StartAs(t, nil, dir, bin, args...)
}

// StartAs is Start running the binary as the given user (nil: the test's own), for what only
// holds for a control plane that does not run as root, such as file permissions.
func StartAs(t testing.TB, user *syscall.Credential, dir, bin string, args ...string) *Process {
	t.Helper()
	return start(t, user, nil, dir, bin, args...)
}

// StartEnv is Start with environment variables (KEY=value) added to the test's, for binaries
// configured through their environment such as Istio's pilot-agent.
func StartEnv(t testing.TB, env []string, dir, bin string, args ...string) *Process {
	t.Helper()
	return start(t, nil, env, dir, bin, args...)
}

// monitoredBinaries are the binaries with a monitoring port (--monitoring-listen, 127.0.0.1:15014
// by default). Started with flags that do not choose it, each gets a free one, so that the
// services a test starts side by side do not fight over 15014; started without flags (as a
// person trying hyper would), a binary keeps its default.
var monitoredBinaries = []string{"hyper", "config-ingest", "endpoint-watcher", "xds-server", "ca", "webhook"}

func start(t testing.TB, user *syscall.Credential, env []string, dir, bin string, args ...string) *Process {
	t.Helper()
	name := filepath.Base(bin)
	var monitoring string
	if slices.Contains(monitoredBinaries, name) && len(args) > 0 && strings.HasPrefix(args[0], "-") &&
		!slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--monitoring-listen") }) {
		monitoring = FreeAddr(t)
		args = append(slices.Clip(args), "--monitoring-listen="+monitoring)
	}
	logFile := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Credential: user}
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &Process{Name: name, Monitoring: monitoring, cmd: cmd, log: logFile, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("---- %s %s log ----\n%s", name, strings.Join(args, " "), p.Log())
		}
	})
	return p
}

// Stop terminates the process gracefully, killing it if it does not exit within 10 s.
func (p *Process) Stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Kill stops the process at once, as a crash would.
func (p *Process) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Exited reports whether the process has ended, and how.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Log returns what the process printed so far.
func (p *Process) Log() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

// FreeAddr returns a 127.0.0.1 address with a port that was free a moment ago, for binaries
// that must be told their listen address up front.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Eventually calls cond until it returns nil or the deadline passes, then fails with its last error.
func Eventually(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	testwait.For(t, timeout, "condition", cond)
}

// WriteFile writes content to dir/rel, creating folders; it replaces the file atomically so a
// watcher never reads half a file.
func WriteFile(t testing.TB, dir, rel, content string) {
	t.Helper()
	p := filepath.Join(dir, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
}

// WaitReady waits until the process's monitoring port answers /healthz/ready with 200 (what it
// serves has synced), checking /healthz/live answers 200 throughout.
func WaitReady(t testing.TB, p *Process) {
	t.Helper()
	if p.Monitoring == "" {
		t.Fatalf("%s has no monitoring port chosen by the framework", p.Name)
	}
	WaitReadyAt(t, p.Monitoring)
}

// WaitReadyAt is WaitReady for a monitoring port at addr.
func WaitReadyAt(t testing.TB, addr string) {
	t.Helper()
	status := func(path string) error {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s on %s: %d %s", path, addr, resp.StatusCode, body)
		}
		return nil
	}
	Eventually(t, 2*time.Minute, func() error {
		if err := status("/healthz/live"); err != nil {
			return err
		}
		return status("/healthz/ready")
	})
}
