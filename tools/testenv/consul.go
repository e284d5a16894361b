package testenv

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Consul is a running single-node `consul agent -dev` on 127.0.0.1 (in
// memory; nothing survives Stop), or with WithConsulOnDisk a one-node server
// keeping its catalog on disk, so that StopAgent and StartAgent keep it.
type Consul struct {
	dir      string
	logPath  string
	httpPort int
	dnsPort  int
	grpcPort int
	bin      string
	args     []string
	opts     options

	mu sync.Mutex
	p  *proc
}

// StartConsul builds (if needed) and starts a dev-mode consul agent on free
// loopback ports and waits until it has elected itself leader. ctx bounds
// the start only; the process runs until Stop.
func StartConsul(ctx context.Context, opts ...Option) (_ *Consul, err error) {
	o := buildOptions(opts)
	bin, err := EnsureConsul(ctx, o.log)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sailplane-consul-")
	if err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	c := &Consul{dir: dir, logPath: filepath.Join(dir, "consul.log"), bin: bin, opts: o}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	// The free ports are found before the agent binds them, so another process starting at the
	// same time (a test's second agent, an API server's clients) may take one first: the agent
	// then exits, and starts again on other ports.
	const attempts = 3
	for attempt := 1; ; attempt++ {
		if err = c.configure(dir); err != nil {
			return nil, err
		}
		if err = c.StartAgent(ctx); err == nil {
			break
		}
		if attempt == attempts || ctx.Err() != nil {
			return nil, err
		}
		o.log.Warn("testenv: consul did not start, trying other ports", "err", err)
	}
	o.log.Info("testenv: consul ready", "addr", c.Addr())
	return c, nil
}

// configure picks the agent's ports and arguments.
func (c *Consul) configure(dir string) error {
	ports, err := freePorts(6)
	if err != nil {
		return err
	}
	c.httpPort, c.dnsPort, c.grpcPort = ports[0], ports[1], ports[2]
	mode := []string{"-dev"}
	if c.opts.consulOnDisk {
		data := filepath.Join(dir, "data")
		_ = os.RemoveAll(data) // what an attempt on other ports left
		mode = []string{"-server", "-bootstrap-expect=1", "-data-dir=" + data}
	}
	c.args = append(append([]string{"agent"}, mode...),
		"-node=sailplane-testenv",
		"-bind=127.0.0.1",
		"-client=127.0.0.1",
		"-advertise=127.0.0.1",
		"-http-port="+strconv.Itoa(c.httpPort),
		"-dns-port="+strconv.Itoa(c.dnsPort),
		"-grpc-port="+strconv.Itoa(c.grpcPort),
		"-server-port="+strconv.Itoa(ports[3]),
		"-serf-lan-port="+strconv.Itoa(ports[4]),
		"-serf-wan-port="+strconv.Itoa(ports[5]),
		"-log-level=info",
		// Dev mode already skips it; stated so no change of defaults makes
		// the agent call out.
		"-hcl=disable_update_check = true",
	)
	return nil
}

// StartAgent starts the agent (again, on the same ports and data) and waits
// until its leader serves consistent reads (its catalog restored). It is a no-op if it is
// running.
func (c *Consul) StartAgent(ctx context.Context) error {
	c.mu.Lock()
	if c.p != nil {
		if done, _ := c.p.exited(); !done {
			c.mu.Unlock()
			return nil
		}
	}
	p, err := startProc("consul", c.logPath, c.bin, c.args...)
	if err != nil {
		c.mu.Unlock()
		return err
	}
	c.p = p
	c.mu.Unlock()

	startCtx, cancel := context.WithTimeout(ctx, c.opts.startTimeout)
	defer cancel()
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	err = waitFor(startCtx, p, func(ctx context.Context) error {
		body, err := httpGet(ctx, hc, "http://"+c.Addr()+"/v1/status/leader", nil)
		if err != nil {
			return err
		}
		// The body is a JSON string, "" until a leader is elected.
		if strings.Trim(strings.TrimSpace(string(body)), `"`) == "" {
			return errors.New("no leader yet")
		}
		// A new leader applies the raft log written since the last snapshot only after its
		// barrier: until then a default read can answer an empty catalog. A consistent read
		// is refused until the barrier is done.
		_, err = httpGet(ctx, hc, "http://"+c.Addr()+"/v1/catalog/services?consistent", nil)
		return err
	})
	if err != nil {
		return &StartError{Component: "consul", Logs: c.Logs(), Err: err}
	}
	return nil
}

// StopAgent stops the agent and waits for it to exit; with WithConsulOnDisk,
// StartAgent brings it back with its catalog.
func (c *Consul) StopAgent() {
	c.mu.Lock()
	p := c.p
	c.mu.Unlock()
	p.stop(10 * time.Second)
}

// Addr is the HTTP API address, 127.0.0.1:<port> (for api.Config.Address).
func (c *Consul) Addr() string { return "127.0.0.1:" + strconv.Itoa(c.httpPort) }

// DNSAddr is the DNS interface address (UDP and TCP).
func (c *Consul) DNSAddr() string { return "127.0.0.1:" + strconv.Itoa(c.dnsPort) }

// GRPCAddr is the agent's xDS/gRPC address.
func (c *Consul) GRPCAddr() string { return "127.0.0.1:" + strconv.Itoa(c.grpcPort) }

// Stop stops the agent and removes its temporary directory. Safe to call
// more than once.
func (c *Consul) Stop() {
	c.mu.Lock()
	p := c.p
	c.mu.Unlock()
	p.stop(10 * time.Second)
	if c.dir != "" {
		_ = os.RemoveAll(c.dir)
	}
}

// Logs returns the tail of the agent's log.
func (c *Consul) Logs() string { return logsOf(c.logPath) }
