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

// testKubeAPIServerOutage, a group of TestFaults, stops the API server for 30 s: what Sailplane
// serves is not lost (RPCs keep succeeding on the same two backends the whole time), and once
// the API server is back its watches resume at once (a third endpoint added then reaches the
// client within afterOutage).
func testKubeAPIServerOutage(t *testing.T, table *faultTable, topology string, start func(*testing.T, *testenv.Kube, *framework.Kube) sailplaneOnKube) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	k, echo, sp, client := startTwoOfThreeOnKube(ctx, t, start)
	load := startCallLoad(t, client, 20*time.Millisecond)
	mark := load.mark()

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
	hold(t, apiOutage-time.Since(stopped))

	startCtx, startDone := context.WithTimeout(ctx, time.Minute)
	defer startDone()
	if err := k.StartAPIServer(startCtx); err != nil {
		t.Fatalf("restarting the API server: %v", err)
	}
	// Watches resume at once: Sailplane probes the API server while it is down and restarts its
	// informers as soon as it answers (client-go's own backoff would wait up to a minute after
	// an outage this long), so a change made after the restart reaches the client within
	// afterOutage.
	end := time.Now()
	echo.setReady(t, 3)
	at := load.waitBackend(t, mark, end, echo.ids[2], afterOutage)
	// Until the change, only the two backends served before the outage answered.
	rpcs := load.since(mark)
	total := map[string]int{}
	for _, r := range rpcs {
		if r.start.Before(end) {
			total[r.backend]++
		}
	}
	if err := onlyFrom(total, echo.ids[:2]...); err != nil {
		t.Fatalf("while the API server was down: %v", err)
	}
	if err := allOf(total, echo.ids[:2]...); err != nil {
		t.Fatalf("while the API server was down: %v", err)
	}
	if err := noFailures(load.since(mark)); err != nil {
		t.Fatal(err)
	}
	table.add(t, faultRow{topology: topology, fault: fmt.Sprintf("API server down %v", apiOutage), rpcs: len(rpcs), convergence: at.Sub(end),
		measuredFrom: "the API server ready again to a new endpoint (EndpointSlice written then)"})
}
