package loadgen

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Process is a control-plane binary the scenario started.
type Process struct {
	Name string
	// Metrics is the process's monitoring address (GET /metrics), if it has one.
	Metrics string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error
}

// StartProcess runs bin with args in dir, its output in dir/<name>.log.
func StartProcess(name, bin, dir string, args ...string) (*Process, error) {
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return nil, fmt.Errorf("loadgen: start %s: %w", name, err)
	}
	p := &Process{Name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = logf.Close()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited is closed when the process ended.
func (p *Process) Exited() <-chan struct{} { return p.done }

// Stop sends SIGTERM, then SIGKILL after grace.
func (p *Process) Stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
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

// Usage is what /proc says about a process: CPU seconds (user + system) and peak RSS.
type Usage struct {
	CPUSeconds float64 `json:"cpu_seconds"`
	PeakRSS    int64   `json:"peak_rss_bytes"`
	RSS        int64   `json:"rss_bytes"`
}

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicks = 100

// ReadUsage samples /proc/<pid>/stat and /proc/<pid>/status.
func ReadUsage(pid int) (Usage, error) {
	var u Usage
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return u, err
	}
	// The command name may hold spaces; the fields we want follow its closing parenthesis.
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 {
		return u, errors.New("loadgen: malformed /proc stat")
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 13 {
		return u, errors.New("loadgen: short /proc stat")
	}
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	u.CPUSeconds = (utime + stime) / clockTicks
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return u, err
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmHWM":
			u.PeakRSS = kb * 1024
		case "VmRSS":
			u.RSS = kb * 1024
		}
	}
	return u, nil
}

// FreeAddr returns a 127.0.0.1 address with a port free right now.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// WaitListening waits until addr accepts TCP connections or ctx ends.
func WaitListening(ctx context.Context, addr string, exited <-chan struct{}) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		c, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, "tcp", addr)
		if err == nil {
			return c.Close()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("loadgen: %s not listening: %w", addr, ctx.Err())
		case <-exited:
			return fmt.Errorf("loadgen: control plane exited before listening on %s", addr)
		case <-t.C:
		}
	}
}

// SourceIP is the loopback address proxy i connects from when the server is on loopback
// (127.0.0.1 to 127.0.0.100, so 10,000 connections take 100 ports per address), else "".
func SourceIP(server string, i int) string {
	host, _, err := net.SplitHostPort(server)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() || ip.To4() == nil {
		return ""
	}
	return fmt.Sprintf("127.0.0.%d", 1+i%100)
}

// RaiseFileLimit raises the open-file limit to its hard maximum, for this process and the
// control-plane processes it starts (they inherit it), and returns it: every simulated proxy
// holds a connection, and so does the server for each.
func RaiseFileLimit() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	return lim.Cur, nil
}
