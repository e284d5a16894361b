package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sailplane.dev/e2e/framework"
)

// settingsPage holds the settings table, relative to the repository's root.
const settingsPage = "docs/settings.md"

// settingsBinaries are the binaries the settings table covers: hyper, and the services of
// microservice mode.
var settingsBinaries = []string{"hyper", "config-ingest", "endpoint-watcher", "xds-server", "ca", "webhook"}

var (
	flagName   = regexp.MustCompile(`--([a-z0-9][a-z0-9-]*)`)
	helpFlag   = regexp.MustCompile(`(?m)^\s+(?:-[a-zA-Z], )?--([a-z0-9][a-z0-9-]*)`)
	tableStart = "| setting | what it sets | hyper | microservice mode |"
)

// TestSettingsTable holds the settings table of docs/settings.md to the binaries: every flag a
// binary takes (its --help) is in a row naming that binary, and every binary a row names takes
// the row's flags.
func TestSettingsTable(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), settingsPage))
	if err != nil {
		t.Fatal(err)
	}
	rows := settingsRows(t, string(b))
	for _, bin := range settingsBinaries {
		out := binaryHelp(t, bin)
		has := map[string]bool{}
		for _, m := range helpFlag.FindAllStringSubmatch(out, -1) {
			if m[1] != "help" {
				has[m[1]] = true
			}
		}
		if len(has) == 0 {
			t.Fatalf("%s --help lists no flags:\n%s", bin, out)
		}
		documented := map[string]bool{}
		for _, r := range rows {
			if !slices.Contains(r.binaries, bin) {
				continue
			}
			for _, f := range r.flags {
				documented[f] = true
				if !has[f] {
					t.Errorf(settingsPage+": the settings table says %s takes --%s; it does not", bin, f)
				}
			}
		}
		for f := range has {
			if !documented[f] {
				t.Errorf(settingsPage+": %s takes --%s, which the settings table does not list for it", bin, f)
			}
		}
	}
}

// binaryHelp is what the built Sailplane binary bin prints for --help.
func binaryHelp(t *testing.T, bin string) string {
	t.Helper()
	out, err := exec.Command(framework.Binary(t, bin), "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --help: %v\n%s", bin, err, out)
	}
	return string(out)
}

// settingsRow is a row of the table: the flags it names and the binaries it says take them.
type settingsRow struct {
	flags, binaries []string
}

func settingsRows(t *testing.T, page string) []settingsRow {
	t.Helper()
	_, table, ok := strings.Cut(page, tableStart+"\n")
	if !ok {
		t.Fatalf(settingsPage+" has no settings table (%q)", tableStart)
	}
	var rows []settingsRow
	for line := range strings.SplitSeq(table, "\n") {
		if !strings.HasPrefix(line, "|") {
			break
		}
		cols := strings.Split(strings.Trim(line, "|"), "|")
		if len(cols) != 4 {
			t.Fatalf(settingsPage+" settings table: want 4 columns: %s", line)
		}
		if strings.HasPrefix(strings.TrimSpace(cols[0]), "---") {
			continue
		}
		var r settingsRow
		for _, m := range flagName.FindAllStringSubmatch(cols[0], -1) {
			r.flags = append(r.flags, m[1])
		}
		switch strings.TrimSpace(cols[2]) {
		case "yes":
			r.binaries = append(r.binaries, "hyper")
		case "—":
		default:
			t.Fatalf(settingsPage+" settings table: the hyper column says %q, want yes or —: %s", cols[2], line)
		}
		for name := range strings.SplitSeq(cols[3], ",") {
			name = strings.TrimSpace(name)
			if name == "—" {
				continue
			}
			if !slices.Contains(settingsBinaries, name) {
				t.Fatalf(settingsPage+" settings table: %q is not a service: %s", name, line)
			}
			r.binaries = append(r.binaries, name)
		}
		rows = append(rows, r)
	}
	return rows
}
