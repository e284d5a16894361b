package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// envoyAdmin asks Envoy's admin API (on loopback, in the same pod) what pilot-agent asks it.
type envoyAdmin struct {
	addr string
	http *http.Client
	// live is set once Envoy was ready: as pilot-agent, it is not asked again (server.state and
	// workers_started never go back outside a hot restart, which the sidecar disables).
	live atomic.Bool
}

func newEnvoyAdmin(addr string) *envoyAdmin {
	return &envoyAdmin{addr: addr, http: &http.Client{Timeout: 3 * time.Second}}
}

// readyStats are the stats pilot-agent's readiness probe reads.
const readyStats = `^(server\.state|listener_manager\.workers_started|listener_manager\.lds\.update_(success|rejected)|cluster_manager\.cds\.update_(success|rejected))$`

// ready is nil once Envoy has accepted its first LDS and CDS updates (it has its listeners),
// is LIVE (0) and has started its workers; else it says what is missing.
func (e *envoyAdmin) ready(ctx context.Context) error {
	if e.live.Load() {
		return nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.addr+"/stats?filter="+readyStats, nil)
	if err != nil {
		return err
	}
	resp, err := e.http.Do(req)
	if err != nil {
		return fmt.Errorf("admin: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("admin /stats: %s", resp.Status)
	}
	stats := map[string]uint64{}
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 1<<20))
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64); err == nil {
			stats[strings.TrimSpace(name)] = n
		}
	}
	state, hasState := stats["server.state"]
	lds, cds := stats["listener_manager.lds.update_success"], stats["cluster_manager.cds.update_success"]
	switch {
	case lds == 0 || cds == 0:
		if stats["listener_manager.lds.update_rejected"] > 0 || stats["cluster_manager.cds.update_rejected"] > 0 {
			return fmt.Errorf("config received from the xDS server, but rejected (lds %d accepted, %d rejected; cds %d accepted, %d rejected)",
				lds, stats["listener_manager.lds.update_rejected"], cds, stats["cluster_manager.cds.update_rejected"])
		}
		return fmt.Errorf("listeners and clusters not received yet (lds updates %d, cds updates %d)", lds, cds)
	case !hasState:
		return errors.New("server.state not reported yet")
	case state != 0:
		return fmt.Errorf("server not live (server.state %d)", state)
	case stats["listener_manager.workers_started"] != 1:
		return errors.New("workers not started yet")
	}
	e.live.Store(true)
	return nil
}

// drainInbound starts Envoy's graceful drain of its inbound listeners, as pilot-agent's /drain:
// Envoy tells its downstreams to go away (--drain-strategy immediate) and keeps serving them
// meanwhile; skip_exit keeps it running after --drain-time-s, since the application may still
// make outbound calls: the kubelet stops Envoy after the application.
func (e *envoyAdmin) drainInbound(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+e.addr+"/drain_listeners?inboundonly&graceful&skip_exit", nil)
	if err != nil {
		return err
	}
	resp, err := e.http.Do(req)
	if err != nil {
		return fmt.Errorf("admin: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("admin /drain_listeners: %s", resp.Status)
	}
	return nil
}

// handleDrain is POST /drain, from loopback only (as pilot-agent's: a peer must not drain this
// pod): the pod's termination has begun (the agent's preStop hook, `agent drain`, calls it).
func (a *Agent) handleDrain(w http.ResponseWriter, r *http.Request) {
	if !fromLoopback(r) {
		http.Error(w, "only requests from localhost are allowed", http.StatusForbidden)
		return
	}
	if r.Method != http.MethodPost {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if err := a.envoy.drainInbound(r.Context()); err != nil {
		a.log.Error("drain Envoy", "error", err)
		http.Error(w, "drain Envoy: "+err.Error(), http.StatusBadGateway)
		return
	}
	a.log.Info("draining Envoy's inbound listeners: the pod is terminating")
	_, _ = io.WriteString(w, "draining\n")
}

func fromLoopback(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// RequestDrain asks the agent whose status server listens on port (on this host, so loopback)
// to drain Envoy: `agent drain`, the preStop hook of the agent's container.
func RequestDrain(ctx context.Context, port int) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+net.JoinHostPort("127.0.0.1", strconv.Itoa(port))+DrainPath, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("drain: %s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}
