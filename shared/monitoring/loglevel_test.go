package monitoring_test

import (
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"sailplane.dev/shared/cli"
	"sailplane.dev/shared/monitoring"
	"sailplane.dev/shared/testlog"
)

// TestLogLevels: the monitoring port serves the process's log levels, and a PUT from this host
// changes them while the process runs.
func TestLogLevels(t *testing.T) {
	opts := cli.LogOptions{Level: "info,xds-server:debug", Format: "json"}
	if _, err := opts.Logger(); err != nil { // the process logger, as a binary's main builds it
		t.Fatal(err)
	}
	base := start(t, monitoring.Flags{Listen: "127.0.0.1:0"}.Server(testlog.New(t, slog.LevelInfo)))
	if code, body := get(t, base+"/debug/loglevel"); code != http.StatusOK || body != "info,xds-server:debug\n" {
		t.Errorf("GET /debug/loglevel: %d %q", code, body)
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPut, base+"/debug/loglevel", strings.NewReader("debug,bus:warn"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || cli.ProcessLogLevels().String() != "debug,bus:warn" {
		t.Errorf("PUT /debug/loglevel: %d %q; levels now %q", resp.StatusCode, body, cli.ProcessLogLevels())
	}
}
