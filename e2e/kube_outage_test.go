package e2e

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/tools/testenv"
)

// apiOutage is how long the API server stays down: long enough for client-go's watches and
// relists to fail and back off several times.
const apiOutage = 30 * time.Second

// afterOutage bounds how long a change made once the API server is back takes to reach a
// client: the probe's backoff (1 s at most), a relist, the bus and an xDS push, with room for
// a loaded machine.
const afterOutage = 15 * time.Second

// watchWords are what Sailplane (its own logs or client-go's) says about a lost watch or a
// failed list.
var watchWords = regexp.MustCompile(`(?i)failed to (watch|list)|watch\S* .*(error|fail|ended|closed|lost)|refused|EOF|client connection lost`)

var kubeWords = regexp.MustCompile(`(?i)watch|list|reflector|informer`)

// loggedWatchFailure returns the first line of log about a failure to reach the API server at
// apiAddr: one naming its address, or client-go's watch/list failures; bus reconnections
// (which also say "connection refused") do not count.
func loggedWatchFailure(log, apiAddr string) (string, bool) {
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "-bus") || !watchWords.MatchString(line) {
			continue
		}
		if strings.Contains(line, apiAddr) || kubeWords.MatchString(line) {
			return line, true
		}
	}
	return "", false
}

// TestKubeAPIServerOutage stops the API server for 30 s: what Sailplane serves is not lost (RPCs
// keep reaching the same backends the whole time), and once the API server is back its watches
// resume at once (a new endpoint reaches the client within afterOutage).
func TestKubeAPIServerOutage(t *testing.T) {
	for _, topo := range kubeTopologies {
		t.Run(topo.name, func(t *testing.T) { testKubeAPIServerOutage(t, topo.start) })
	}
}

func testKubeAPIServerOutage(t *testing.T, start func(*testing.T, *testenv.Kube, *framework.Kube) sailplaneOnKube) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	k, echo, sp, client := startTwoOfThreeOnKube(ctx, t, start)

	logBefore := sp.logOffsets()
	k.StopAPIServer()
	stopped := time.Now()
	var failure string
	framework.Eventually(t, time.Minute, func() error {
		line, ok := loggedWatchFailure(sp.logSince(logBefore), strings.TrimPrefix(k.Host(), "https://"))
		if !ok {
			return errors.New("Sailplane has not logged losing its watches on the stopped API server")
		}
		failure = line
		return nil
	})
	t.Logf("API server stopped; %v later Sailplane logged: %s", time.Since(stopped).Round(time.Millisecond), failure)

	// The outage is held by a deadline, and it is spent checking: RPCs must keep succeeding on
	// the two endpoints served before the API server went away.
	hold, endHold := context.WithTimeout(ctx, apiOutage)
	total := map[string]int{}
	// A few RPCs every 20 ms: continuous, without saturating the machine's CPUs.
	pace := time.NewTicker(20 * time.Millisecond)
	defer pace.Stop()
	for hold.Err() == nil {
		select {
		case <-pace.C:
		case <-hold.Done():
			continue
		}
		counts, err := reached(ctx, client, 5)
		for id, n := range counts {
			total[id] += n
		}
		if err != nil {
			endHold()
			t.Fatalf("RPC failed while the API server was down (after %v RPCs): %v", total, err)
		}
		if err := onlyFrom(counts, echo.ids[:2]...); err != nil {
			endHold()
			t.Fatalf("while the API server was down: %v", err)
		}
	}
	endHold()
	if err := allOf(total, echo.ids[:2]...); err != nil {
		t.Fatalf("while the API server was down: %v", err)
	}
	t.Logf("RPCs during the %v outage: %v", apiOutage, total)

	startCtx, startDone := context.WithTimeout(ctx, time.Minute)
	defer startDone()
	if err := k.StartAPIServer(startCtx); err != nil {
		t.Fatalf("restarting the API server: %v", err)
	}
	// Watches resume at once: Sailplane probes the API server while it is down and restarts its
	// informers as soon as it answers (client-go's own backoff would wait up to a minute after
	// an outage this long), so a change made after the restart reaches the client within
	// afterOutage.
	restarted := time.Now()
	echo.setReady(t, 3)
	framework.Eventually(t, afterOutage, func() error {
		counts, err := reached(ctx, client, 30)
		if err != nil {
			return fmt.Errorf("after the restart: %w", err)
		}
		return allOf(counts, echo.ids[2])
	})
	t.Logf("the change after the restart reached the client in %v", time.Since(restarted).Round(time.Millisecond))
}
