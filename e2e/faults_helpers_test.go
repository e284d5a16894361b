package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/resolver"

	"sailplane.dev/e2e/framework"
)

// The fault suite's harness: a proxyless client calling through the whole time (callLoad), the
// convergence measured from a fault's end to the first RPC answered by the backend a change
// points to, and one row per fault for docs/faults.md (faultTable).

// callLoad sends RPCs through one client, one after the other and one each interval at most
// (the fault suite's 20 ms is continuous without saturating two CPUs shared by a dozen
// processes), and keeps every outcome.
type callLoad struct {
	*pacedCalls

	mu   sync.Mutex
	rpcs []rpcOutcome
}

type rpcOutcome struct {
	start, end time.Time
	backend    string
	err        error
}

func startCallLoad(t *testing.T, client framework.EchoClient, every time.Duration) *callLoad {
	t.Helper()
	l := &callLoad{}
	l.pacedCalls = startPaced(t, every, func(ctx context.Context) {
		start := time.Now()
		rpcCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		id, err := framework.Call(rpcCtx, client)
		cancel()
		if ctx.Err() != nil {
			return // stopped: not a failure
		}
		l.mu.Lock()
		l.rpcs = append(l.rpcs, rpcOutcome{start: start, end: time.Now(), backend: id, err: err})
		l.mu.Unlock()
	})
	return l
}

// mark is a point in the load's history.
func (l *callLoad) mark() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.rpcs)
}

// since returns the outcomes after mark.
func (l *callLoad) since(mark int) []rpcOutcome {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.rpcs[mark:])
}

// waitBackend waits until an RPC that started after from is answered by backend, and returns
// when it was answered. It fails the test at once if an RPC since mark failed.
func (l *callLoad) waitBackend(t *testing.T, mark int, from time.Time, backend string, timeout time.Duration) time.Time {
	t.Helper()
	var at time.Time
	framework.Eventually(t, timeout, func() error {
		rpcs := l.since(mark)
		if err := noFailures(rpcs); err != nil {
			t.Fatal(err)
		}
		for _, r := range rpcs {
			if r.backend == backend && !r.start.Before(from) {
				at = r.end
				return nil
			}
		}
		return fmt.Errorf("no RPC answered by %s yet (%d RPCs since the fault)", backend, len(rpcs))
	})
	return at
}

// checkSwitch checks the RPCs since mark: none failed, each reached old or new, and once one
// reached new none reached old again (a client that went back to old lost the change).
func (l *callLoad) checkSwitch(mark int, old, new string) (n int, err error) {
	rpcs := l.since(mark)
	if err := noFailures(rpcs); err != nil {
		return len(rpcs), err
	}
	switched := false
	for i, r := range rpcs {
		switch {
		case r.backend == new:
			switched = true
		case r.backend != old:
			return len(rpcs), fmt.Errorf("RPC %d reached %q, want %s then %s", i, r.backend, old, new)
		case switched:
			return len(rpcs), fmt.Errorf("RPC %d at %s reached %s again after %s: the change was lost", i, r.start.Format("15:04:05.000"), old, new)
		}
	}
	return len(rpcs), nil
}

func noFailures(rpcs []rpcOutcome) error {
	var errs []error
	for _, r := range rpcs {
		if r.err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", r.start.Format("15:04:05.000"), r.err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%d of %d RPCs failed, first: %w", len(errs), len(rpcs), errs[0])
	}
	return nil
}

// faultRow is one fault's result in docs/faults.md.
type faultRow struct {
	topology, fault string
	rpcs            int
	convergence     time.Duration
	measuredFrom    string
}

// faultTable collects the rows of the faults running concurrently.
type faultTable struct {
	mu   sync.Mutex
	rows []faultRow
}

func (ft *faultTable) add(t *testing.T, r faultRow) {
	t.Logf("fault: %s / %s: %d RPCs, none failed; converged %v after %s",
		r.topology, r.fault, r.rpcs, r.convergence.Round(time.Millisecond), r.measuredFrom)
	ft.mu.Lock()
	ft.rows = append(ft.rows, r)
	ft.mu.Unlock()
}

// markdown is the table docs/faults.md shows.
func (ft *faultTable) markdown() string {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	rows := slices.Clone(ft.rows)
	slices.SortFunc(rows, func(a, b faultRow) int {
		return strings.Compare(a.topology+a.fault, b.topology+b.fault)
	})
	var b strings.Builder
	b.WriteString("| topology | fault | RPCs during the fault | failed | convergence | measured from |\n|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %d | 0 | %.2f s | %s |\n", r.topology, r.fault, r.rpcs, r.convergence.Seconds(), r.measuredFrom)
	}
	return b.String()
}

// listScheme is a resolver of "sailplane-list:///addr1,addr2,...": a gRPC xDS bootstrap's
// server_uri naming several xds-server replicas, as a Kubernetes Service's name resolves to its
// pods. gRPC's pick_first fails over to the next address when the one in use goes away.
const listScheme = "sailplane-list"

type listResolver struct{}

func init() { resolver.Register(listResolver{}) }

func (listResolver) Scheme() string { return listScheme }

func (listResolver) Build(target resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	var addrs []resolver.Address
	for _, a := range strings.Split(target.Endpoint(), ",") {
		addrs = append(addrs, resolver.Address{Addr: a})
	}
	if err := cc.UpdateState(resolver.State{Addresses: addrs}); err != nil {
		return nil, err
	}
	return listResolver{}, nil
}

func (listResolver) ResolveNow(resolver.ResolveNowOptions) {}
func (listResolver) Close()                                {}

// replicas is the server_uri of a client of several xds-servers, in the order it tries them.
func replicas(addrs ...string) string {
	return listScheme + ":///" + strings.Join(addrs, ",")
}

// restartable is a Sailplane process a fault kills and starts again with the same flags.
type restartable struct {
	start func() *framework.Process
	p     *framework.Process
}

func newRestartable(start func() *framework.Process) *restartable {
	return &restartable{start: start, p: start()}
}

// kill stops the process at once (SIGKILL), as a crash or an OOM kill would.
func (r *restartable) kill() { r.p.Kill() }

func (r *restartable) restart() { r.p = r.start() }

// smallFS mounts a tmpfs of size bytes at dir (created if missing) and unmounts it when the
// test ends: a config folder on a filesystem the test can fill.
func smallFS(t *testing.T, dir string, size int) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount a tmpfs at %s (needs root; CI runs as root): %v: %s", dir, err, out)
	}
	t.Cleanup(func() {
		// Lazily: a process of the test may still have a file open there.
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
}

// fillFS writes path until its filesystem is full.
func fillFS(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 4096)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling %s: %v, want ENOSPC", path, err)
			}
			return
		}
	}
}

// hostPort joins host and port.
func hostPort(host string, port int) string { return net.JoinHostPort(host, fmt.Sprint(port)) }
